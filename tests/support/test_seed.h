#pragma once
/// The seed of a randomized test (random inputs, printed seed: ARCHITECTURE §5), for every test
/// directory (tests/CMakeLists.txt: the pagoda_test_support target puts this folder on the
/// include path).
///
///   const testing::TestSeed seed;   // printed; named in every failure of the scope
///   std::mt19937_64 rng(seed);
///
/// PAGODA_TEST_SEED=<n> makes <n> the seed of every randomized test of the process (to replay a
/// printed one); otherwise each test_seed() is a fresh 64-bit draw from std::random_device.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <source_location>
#include <string>

namespace pagoda::testing {

/// PAGODA_TEST_SEED when set, else a fresh seed.
inline uint64_t test_seed() {
  if (const char* env = std::getenv("PAGODA_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) | rd();
}

/// One test_seed() for the whole process: for suites whose cases (or shared helpers) derive
/// their inputs from the same seed.
inline uint64_t process_seed() {
  static const uint64_t seed = test_seed();
  return seed;
}

/// A test's seed: prints "[seed] <suite.test> <n> (PAGODA_TEST_SEED=<n> replays it)" and adds
/// "seed <n> (PAGODA_TEST_SEED=<n> replays it)" to every failure reported while it is in scope
/// (a SCOPED_TRACE). Converts to the seed.
class TestSeed {
 public:
  explicit TestSeed(uint64_t seed = test_seed(),
                    std::source_location where = std::source_location::current())
      : seed_(seed),
        trace_(where.file_name(), static_cast<int>(where.line()), "seed " + replay_note(seed)) {
    const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string name =
        test == nullptr ? "" : std::string(test->test_suite_name()) + "." + test->name() + " ";
    std::printf("[seed] %s%s\n", name.c_str(), replay_note(seed).c_str());
  }
  TestSeed(const TestSeed&) = delete;
  TestSeed& operator=(const TestSeed&) = delete;

  operator uint64_t() const { return seed_; }  // NOLINT(google-explicit-constructor)

 private:
  /// "<n> (PAGODA_TEST_SEED=<n> replays it)".
  static std::string replay_note(uint64_t seed) {
    const std::string n = std::to_string(seed);
    return n + " (PAGODA_TEST_SEED=" + n + " replays it)";
  }

  uint64_t seed_;
  ::testing::ScopedTrace trace_;
};

}  // namespace pagoda::testing
