// Speculative decoding on the CUDA model path: greedy output with speculation (n-gram trees,
// self-draft chains and trees; page sizes 1 and 16; f32 so verify and decode round alike) equals
// the plain CUDA engine's token for token, no page leaks, self-draft topk 1 accepts every drafted
// token; KvPool::move_kv on a device pool (overlapping pairs). Label "gpu": skipped without a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_common.h"
#include "pagoda/engine/engine.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/model/config.h"
#include "pagoda/model/llama.h"
#include "pagoda/model/weights.h"
#include "pagoda/platform/cuda/cuda_platform.h"

namespace pagoda {
namespace {

std::vector<std::vector<int32_t>> repetitive_prompts(uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> seg(6 + rng() % 10);
    for (auto& x : seg) x = static_cast<int32_t>(rng() % 256);
    std::vector<int32_t> p;
    for (int r = 0; r < 3; ++r) p.insert(p.end(), seg.begin(), seg.end());
    out.push_back(p);
  }
  return out;
}

struct SpecRun {
  std::vector<std::vector<int32_t>> tokens;
  engine::EngineStats stats;
  int64_t leaked = 0;
};

SpecRun run_engine(model::LlamaModel& m, const std::vector<std::vector<int32_t>>& ps, int page,
        engine::SpecConfig spec) {
  auto gpu = platform::make_cuda_platform();
  engine::EngineConfig cfg;
  cfg.page_size = page;
  cfg.pool_tokens = 8192;
  cfg.backend.attention = "cuda";
  cfg.dtype = DType::kF32;
  cfg.check_integrity = true;
  cfg.spec = spec;
  engine::Engine eng(m, cfg, gpu.get());
  std::vector<engine::RequestId> ids;
  for (const auto& p : ps)
    ids.push_back(eng.add_request({.prompt = p, .max_new_tokens = 24, .ignore_eos = true}));
  eng.run_until_idle();
  SpecRun r;
  for (auto id : ids) r.tokens.push_back(eng.output(id).output_ids);
  r.stats = eng.stats();
  r.leaked = eng.leaked_pages();
  return r;
}

TEST(CudaSpec, GreedyIsLossless) {
  PAGODA_REQUIRE_GPU();
  const model::ModelConfig config = model::builtin_tiny_config();
  model::LlamaModel m(config, model::make_random_weights(config, 20240611));
  const auto ps = repetitive_prompts(3, 6);
  for (int page : {1, 16}) {
    const SpecRun plain = run_engine(m, ps, page, {});
    struct Mode {
      engine::SpecMode mode;
      int topk, steps, tokens;
    };
    for (const Mode& md : {Mode{engine::SpecMode::kNgram, 2, 4, 8},
                           Mode{engine::SpecMode::kDraft, 1, 3, 4},
                           Mode{engine::SpecMode::kDraft, 4, 3, 12}}) {
     for (int graph_tokens : {512, 0}) {  // verify/draft forwards from graphs, then eager
      engine::SpecConfig sc;
      sc.mode = md.mode;
      sc.topk = md.topk;
      sc.steps = md.steps;
      sc.num_draft_tokens = md.tokens;
      sc.min_accepted = 0.0;
      sc.graph_tokens = graph_tokens;
      const SpecRun r = run_engine(m, ps, page, sc);
      const std::string what = std::string(engine::spec_mode_name(md.mode)) + " topk " +
                               std::to_string(md.topk) + " page " + std::to_string(page) +
                               (graph_tokens > 0 ? " graphs" : " eager");
      if (md.mode == engine::SpecMode::kDraft) {  // one draft forward per step of each round
        EXPECT_EQ(r.stats.draft_forwards, r.stats.spec_steps * md.steps) << what;
      }
      if (graph_tokens > 0) {  // every round's verify and draft forwards replayed a graph
        EXPECT_EQ(r.stats.spec_graph_steps, r.stats.spec_steps) << what;
        if (md.mode == engine::SpecMode::kDraft) {
          EXPECT_EQ(r.stats.draft_graph_steps, r.stats.draft_forwards) << what;
        }
      } else {  // no verify graphs: only a topk-1 chain's decode-shaped steps replay (decode graphs)
        EXPECT_EQ(r.stats.spec_graph_steps, 0) << what;
        const int64_t decode_steps =
            md.mode == engine::SpecMode::kDraft && md.topk == 1 ? md.steps - 1 : 0;
        EXPECT_EQ(r.stats.draft_graph_steps, r.stats.spec_steps * decode_steps) << what;
      }
      for (size_t i = 0; i < ps.size(); ++i)
        EXPECT_EQ(r.tokens[i], plain.tokens[i]) << what << " prompt " << i;
      EXPECT_GT(r.stats.spec_steps, 0) << what;
      EXPECT_EQ(r.leaked, 0) << what;
      if (md.mode == engine::SpecMode::kDraft && md.topk == 1) {
        EXPECT_EQ(r.stats.spec.accepted, r.stats.spec.draft_tokens) << what;
      }
      std::printf("[%s] %lld rounds, accept length %.2f, %lld verify / %lld draft graph steps\n",
                  what.c_str(), static_cast<long long>(r.stats.spec_steps),
                  r.stats.spec.mean_accept_length(),
                  static_cast<long long>(r.stats.spec_graph_steps),
                  static_cast<long long>(r.stats.draft_graph_steps));
     }
    }
  }
}

TEST(CudaSpec, MoveKvOnADevicePool) {
  PAGODA_REQUIRE_GPU();
  auto gpu = platform::make_cuda_platform();
  kv::KvPool pool(kv::KvPoolConfig{.num_layers = 2,
                                   .num_pages = 4,
                                   .page_size = 4,
                                   .dtype = DType::kF32,
                                   .num_kv_heads = 1,
                                   .head_dim = 8},
                  gpu->allocator());
  const int64_t n = pool.num_slots();
  std::vector<float> k(static_cast<size_t>(n * 8)), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<float>(i);
    v[i] = -static_cast<float>(i);
  }
  for (int l = 0; l < 2; ++l) {
    gpu->allocator().copy_to_device(pool.k_view(LayerId{l}).data(), k.data(), k.size() * 4);
    gpu->allocator().copy_to_device(pool.v_view(LayerId{l}).data(), v.data(), v.size() * 4);
  }
  const std::vector<SlotIndex> src = {5, 9, 13, 2}, dst = {9, 13, 5, 17};
  pool.move_kv(src, dst);
  for (int l = 0; l < 2; ++l) {
    std::vector<float> kk(k.size()), vv(v.size());
    gpu->allocator().copy_to_host(kk.data(), pool.k_view(LayerId{l}).data(), kk.size() * 4);
    gpu->allocator().copy_to_host(vv.data(), pool.v_view(LayerId{l}).data(), vv.size() * 4);
    for (size_t i = 0; i < src.size(); ++i)
      for (int d = 0; d < 8; ++d) {
        EXPECT_EQ(kk[static_cast<size_t>(dst[i] * 8 + d)], k[static_cast<size_t>(src[i] * 8 + d)]);
        EXPECT_EQ(vv[static_cast<size_t>(dst[i] * 8 + d)], v[static_cast<size_t>(src[i] * 8 + d)]);
      }
  }
}

}  // namespace
}  // namespace pagoda
