// The CPU platform's copy stream: copies run in order on a worker thread; events and
// synchronize() wait for exactly what was enqueued before them.
#include <gtest/gtest.h>

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
