// The sliding-window pool on the CUDA path (docs/design/engine.md §13): the window layers' K/V
// in a second device KvPool, appended and read by a second cuda backend over the SWA table (its
// own device copy of the step's SWA slots), the full layers on the first pool with the fused
// K/V store. Models: a Gemma-3 layout (3 local : 1 global, window 16, local and global RoPE
// bases, query/key norms, GeGLU) and a Mistral-style model (a window on every layer: the full
// pool holds no layer), random weights, f32. At pages 1, 16 and 64 the cuda engine with the
// pool off (one full pool, the window as a mask) must give the CPU engine's greedy tokens
// (reference backend, pool off), and with `auto` (which turns the pool on on the GPU too) and
// small pools — chunked prefill of one or two pages (boundaries inside and across windows), a
// second wave sharing a 70-token prefix (radix hits; at page 16 also without the radix cache)
// — the same tokens again; a run that must retract (page 16) as well. Every run: 0 leaked pages
// in either pool and rows, both pools empty after draining the cache, no request holding more
// SWA pages than its window needs, and no CUDA graph captured with the pool on (SWA steps run
// eagerly although graphs are requested). Seed printed (PAGODA_TEST_SEED re-runs it).
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gpu_test_common.h"
#include "pagoda/engine/engine.h"
#include "pagoda/kv/swa_pages.h"
#include "pagoda/model/llama.h"
#include "pagoda/model/weights.h"
#include "pagoda/platform/cuda/cuda_platform.h"
#include "swa_test_util.h"

namespace pagoda {
namespace {

using engine::EngineConfig;
using engine::SwaPoolMode;
using testing::kSwaWindowLeft;
using testing::swa_generate;
using testing::SwaRun;

struct Model {
  explicit Model(model::ModelConfig c)
      : config(std::move(c)), weights(model::make_random_weights(config, testing::kSwaWeightSeed)),
        model(config, weights) {}
  model::ModelConfig config;
  model::ModelWeights weights;
  model::LlamaModel model;
};

EngineConfig base_config(int32_t page, bool cuda) {
  EngineConfig c;
  c.page_size = page;
  c.pool_tokens = 4096;
  c.max_context_len = 256;
  c.backend.attention = cuda ? "cuda" : "reference";
  c.cuda_graph = true;  // requested: the full-pool runs capture, the SWA runs step eagerly
  c.check_integrity = true;
  c.dtype = DType::kF32;
  c.swa_pool = SwaPoolMode::kOff;
  return c;
}

class CudaSwaEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu_test::have_gpu()) PAGODA_SKIP_GPU_TEST("no CUDA device");
    seed_ = gpu_test::test_seed(4950);
    std::printf("CudaSwaEngine seed %llu (PAGODA_TEST_SEED re-runs it)\n",
                static_cast<unsigned long long>(seed_));
    gpu_ = platform::make_cuda_platform();
  }

  /// A run on the GPU with the pool on: the pool is on, no CUDA graph was captured.
  SwaRun on_gpu(model::LlamaModel& m, const EngineConfig& cfg,
                const std::vector<std::vector<int32_t>>& ps, int max_new = 20,
                bool ignore_eos = false) {
    SwaRun r = swa_generate(m, cfg, ps, max_new, 4, gpu_.get(), ignore_eos);
    EXPECT_GT(r.stats.swa_pages_total, 0) << "the SWA pool is off on the GPU";
    EXPECT_EQ(r.stats.cuda_graphs, 0) << "an SWA-pool engine captured CUDA graphs";
    return r;
  }

  void check_model(model::LlamaModel& m) {
    std::printf("model %s\n", m.config().name.c_str());
    const auto ps = testing::swa_prompts(seed_);
    int64_t retractions = 0, hits = 0;
    for (int32_t page : {1, 16, 64}) {
      SCOPED_TRACE(::testing::Message() << "page " << page);
      const SwaRun cpu = swa_generate(m, base_config(page, false), ps);
      const EngineConfig off = base_config(page, true);
      const SwaRun gpu_off = swa_generate(m, off, ps, 20, 4, gpu_.get());
      ASSERT_EQ(gpu_off.stats.swa_pages_total, 0);
      EXPECT_EQ(gpu_off.outputs, cpu.outputs) << "cuda (one pool) vs the CPU engine";
      const SwaRun got = on_gpu(m, testing::swa_small_pools(off), ps);
      EXPECT_EQ(got.outputs, gpu_off.outputs) << "cuda: SWA pool on vs off";
      EXPECT_LE(got.stats.scheduler.peak_swa_pages_per_request,
                kv::SwaPages::swa_live_pages_bound(kSwaWindowLeft, page));
      if (page < 64) {  // at page 64 a request's window pages are the tree's when they die
        EXPECT_GT(got.stats.scheduler.swa_released_pages, 0);
      }
      if (page == 16) {  // without the radix cache: ChunkCache over SwaPageRefs
        EngineConfig no_radix = testing::swa_small_pools(off);
        no_radix.radix_cache = false;
        const SwaRun chunk = on_gpu(m, no_radix, ps);
        EXPECT_EQ(chunk.outputs, gpu_off.outputs) << "cuda: SWA pool on, no radix cache, vs off";
        retractions += chunk.stats.scheduler.retractions;
      }
      retractions += got.stats.scheduler.retractions;
      hits += got.stats.scheduler.cached_tokens;
    }
    {
      SCOPED_TRACE("retraction run");
      const auto long_ps = testing::swa_retraction_prompts(seed_ + 1);
      const EngineConfig off = base_config(16, true);
      // ignore_eos: a request stopping at EOS early leaves room, and nothing retracts.
      const SwaRun ref = swa_generate(m, off, long_ps, 40, 4, gpu_.get(), true);
      const SwaRun got = on_gpu(m, testing::swa_retraction_pools(off), long_ps, 40, true);
      EXPECT_EQ(got.outputs, ref.outputs) << "cuda: SWA pool on vs off";
      retractions += got.stats.scheduler.retractions;
    }
    std::printf("  retractions %lld, cached prompt tokens %lld\n",
                static_cast<long long>(retractions), static_cast<long long>(hits));
    EXPECT_GT(retractions, 0) << "no run retracted: the pools are too large to test it";
    EXPECT_GT(hits, 0) << "no prefix-cache hit";
  }

  uint64_t seed_ = 0;
  std::unique_ptr<platform::Platform> gpu_;
};

TEST_F(CudaSwaEngine, Gemma3LayoutSameTokensWithAndWithoutThePoolAndAsTheCpu) {
  static Model m(testing::gemma3_tiny_config());
  check_model(m.model);
}

TEST_F(CudaSwaEngine, MistralWindowSameTokensWithAndWithoutThePoolAndAsTheCpu) {
  static Model m(testing::mistral_window_config());
  check_model(m.model);
}

// With the pool on, each device pool allocates only its layer kind (Gemma-3 tiny: 1 full and
// 3 window layers, f32 K and V of 1 head x 32), and `on` on the GPU is no longer refused.
TEST_F(CudaSwaEngine, EachDevicePoolAllocatesOnlyItsLayerKind) {
  static Model m(testing::gemma3_tiny_config());
  EngineConfig cfg = base_config(16, true);
  cfg.pool_tokens = 1024;
  cfg.swa_pool_tokens = 320;
  cfg.swa_pool = SwaPoolMode::kOn;
  const engine::EngineStats s = engine::Engine(m.model, cfg, gpu_.get()).stats();
  const int64_t row = 2 * 32 * int64_t{sizeof(float)};  // K + V of one token, one layer
  EXPECT_EQ(s.kv_bytes, 1 * (1024 / 16 + 1) * 16 * row);
  EXPECT_EQ(s.swa_kv_bytes, 3 * (320 / 16 + 1) * 16 * row);
}

}  // namespace
}  // namespace pagoda
