// The engine with the hierarchical KV cache on the CUDA path: a multi-turn workload whose live
// KV is several times the device pool gives the same greedy tokens with the host tier as without
// it (same backend, f32), and the host tier serves hits. Label "gpu".
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "gpu_test_common.h"
#include "pagoda/engine/engine.h"
#include "pagoda/model/config.h"
#include "pagoda/model/llama.h"
#include "pagoda/model/weights.h"
#include "pagoda/platform/cuda/cuda_platform.h"

namespace pagoda {
namespace {

struct Turns {
  std::vector<std::vector<int32_t>> outputs;
  engine::EngineStats stats;
};

Turns multiturn(model::LlamaModel& m, bool hicache) {
  auto gpu = platform::make_cuda_platform();
  engine::EngineConfig cfg;
  cfg.page_size = 16;
  cfg.pool_tokens = 512;
  cfg.scheduler.max_running_requests = 4;
  cfg.backend.attention = "cuda";
  cfg.dtype = DType::kF32;
  cfg.check_integrity = true;
  if (hicache) cfg.hicache = tier::HiCacheConfig{.host = {.ratio = 8}};
  engine::Engine eng(m, cfg, gpu.get());
  std::mt19937_64 rng(4300);
  std::vector<int32_t> system(40);
  for (auto& x : system) x = static_cast<int32_t>(rng() % 256);
  std::vector<std::vector<int32_t>> history(8, system);
  Turns out;
  for (int t = 0; t < 4; ++t) {
    std::vector<engine::RequestId> ids;
    for (auto& h : history) {
      for (int i = 0; i < 30; ++i) h.push_back(static_cast<int32_t>(rng() % 256));
      ids.push_back(eng.add_request({.prompt = h, .max_new_tokens = 8, .ignore_eos = true}));
    }
    eng.run_until_idle();
    for (size_t c = 0; c < ids.size(); ++c) {
      const auto o = eng.output(ids[c]).output_ids;
      history[c].insert(history[c].end(), o.begin(), o.end());
      out.outputs.push_back(o);
    }
  }
  out.stats = eng.stats();
  EXPECT_EQ(eng.memory().leaked_pages(), 0);
  EXPECT_EQ(eng.memory().leaked_host_pages(), 0);
  return out;
}

TEST(CudaEngineHiCache, SameTokensWithTheHostTier) {
  PAGODA_REQUIRE_GPU();
  const model::ModelConfig config = model::builtin_tiny_config();
  model::LlamaModel m(config, model::make_random_weights(config, 77));
  const Turns device_only = multiturn(m, false);
  const Turns tiered = multiturn(m, true);
  EXPECT_EQ(device_only.outputs, tiered.outputs);
  EXPECT_GT(tiered.stats.tier.host_hit_tokens, 0);
  EXPECT_GT(tiered.stats.scheduler.cached_tokens, device_only.stats.scheduler.cached_tokens);
}

}  // namespace
}  // namespace pagoda
