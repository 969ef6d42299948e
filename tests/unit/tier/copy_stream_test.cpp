// The CPU platform's copy stream: copies run in order on a worker thread; events and
// synchronize() wait for exactly what was enqueued before them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/platform/platform.h"

namespace pagoda::platform {
namespace {

TEST(CopyStream, RunsInOrderAndEventsWait) {
  const uint64_t seed = 4242;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  auto platform = make_cpu_platform();
  auto stream = platform->make_copy_stream();
  // 2,000 copies of random ranges between two buffers: later copies overwrite earlier ones, so
  // only in-order execution gives the sequential result.
  constexpr size_t kBytes = 4096;
  std::vector<std::vector<uint8_t>> sources(2000, std::vector<uint8_t>(kBytes));
  std::vector<uint8_t> dst(kBytes, 0), expect(kBytes, 0);
  std::vector<std::unique_ptr<Event>> events;
  std::vector<std::pair<size_t, size_t>> ranges;
  for (size_t i = 0; i < sources.size(); ++i) {
    for (auto& b : sources[i]) b = static_cast<uint8_t>(rng());
    const size_t off = rng() % kBytes, len = 1 + rng() % (kBytes - off);
    stream->copy(dst.data() + off, sources[i].data() + off, len);
    std::memcpy(expect.data() + off, sources[i].data() + off, len);
    ranges.emplace_back(off, len);
    if (i % 500 == 499) events.push_back(stream->record());
  }
  events.back()->synchronize();
  for (auto& e : events) EXPECT_TRUE(e->done());
  EXPECT_EQ(dst, expect);
  // An event recorded after more copies is not reached before them.
  std::vector<uint8_t> big(1 << 22, 7), big_dst(1 << 22, 0);
  stream->copy(big_dst.data(), big.data(), big.size());
  auto e = stream->record();
  stream->synchronize();
  EXPECT_TRUE(e->done());
  EXPECT_EQ(big_dst, big);
}

TEST(CopyStream, BatchesKeepStreamOrder) {
  const uint64_t seed = 977;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  auto platform = make_cpu_platform();
  auto stream = platform->make_copy_stream();
  // 64-byte pages of a 512-page buffer. Each round: single copies of random pages, then a
  // batch of disjoint shuffled pages (one page each, as a host tier's runs often are), then
  // single copies again: later writes win only if batches keep their place in the stream.
  constexpr size_t kPage = 64, kPages = 512;
  std::vector<uint8_t> dst(kPage * kPages, 0), expect(dst.size(), 0);
  std::vector<std::vector<uint8_t>> sources;
  std::vector<size_t> perm(kPages);
  for (int round = 0; round < 40; ++round) {
    auto source = [&] {
      sources.emplace_back(kPage);
      for (auto& b : sources.back()) b = static_cast<uint8_t>(rng());
      return sources.back().data();
    };
    sources.reserve(sources.size() + 3 * kPages);  // the pointers taken below stay valid
    auto single = [&] {
      const size_t p = rng() % kPages;
      const uint8_t* s = source();
      stream->copy(dst.data() + p * kPage, s, kPage);
      std::memcpy(expect.data() + p * kPage, s, kPage);
    };
    for (int i = 0; i < 8; ++i) single();
    for (size_t i = 0; i < kPages; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<CopyStream::Op> ops;
    for (size_t i = 0; i < 1 + rng() % kPages; ++i) {
      const uint8_t* s = source();
      ops.push_back({dst.data() + perm[i] * kPage, s, i % 7 == 3 ? 0 : kPage});
      std::memcpy(expect.data() + perm[i] * kPage, s, ops.back().bytes);
    }
    stream->copy_batch(ops);
    for (int i = 0; i < 8; ++i) single();
  }
  auto e = stream->record();
  e->synchronize();
  EXPECT_EQ(dst, expect);
}

TEST(CopyStream, WaitEventBlocksTheCpuComputeStream) {
  auto platform = make_cpu_platform();
  auto stream = platform->make_copy_stream();
  std::vector<float> src(1 << 20, 3.f), dst(1 << 20, 0.f);
  stream->copy(dst.data(), src.data(), src.size() * sizeof(float));
  auto e = stream->record();
  platform->wait_event(*e);  // on the CPU the compute stream is this thread: the data is there
  EXPECT_TRUE(e->done());
  EXPECT_EQ(dst, src);
}

TEST(CopyStream, BasePlatformHasNone) {
  struct Bare final : Platform {
    std::unique_ptr<Platform> cpu = make_cpu_platform();
    PlatformKind kind() const override { return PlatformKind::kCpu; }
    std::string name() const override { return "bare"; }
    Device device() const override { return Device::cpu(); }
    const Capabilities& capabilities() const override { return cpu->capabilities(); }
    Allocator& allocator() override { return cpu->allocator(); }
    std::string default_attention_backend() const override { return "cpu"; }
  } bare;
  EXPECT_THROW(bare.make_copy_stream(), Error);
}

}  // namespace
}  // namespace pagoda::platform
