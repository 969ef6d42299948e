// Speculative decoding on the CUDA model path: greedy output with speculation (n-gram trees,
// self-draft chains and trees; page sizes 1 and 16; f32 so verify and decode round alike) equals
// the plain CUDA engine's token for token (a Llama and the DeepSeek MLA tiny layouts), no page
// leaks, self-draft topk 1 accepts every drafted token; KvPool::move_kv on a device pool
// (overlapping pairs); EAGLE heads (lossless, an echo head accepting exactly the repeats,
// EagleRunner on CUDA ops vs CPU ops). Label "gpu": skipped without a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_common.h"
#include "mla_test_layouts.h"
#include "pagoda/engine/engine.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/model/config.h"
#include "pagoda/model/cuda/cuda_ops.h"
#include "pagoda/model/eagle_runner.h"
#include "pagoda/model/model_ops.h"
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
  r.leaked = eng.memory().leaked_pages();
  return r;
}

/// Every speculation mode (n-gram trees, self-draft chains and trees), from graphs and eager, at
/// pages 1 and 16, gives the plain CUDA engine's greedy tokens on `m`, without page leaks.
void expect_lossless(model::LlamaModel& m) {
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

TEST(CudaSpec, GreedyIsLossless) {
  PAGODA_REQUIRE_GPU();
  const model::ModelConfig config = model::builtin_tiny_config();
  model::LlamaModel m(config, model::make_random_weights(config, 20240611));
  expect_lossless(m);
}

// The same on the DeepSeek MLA tiny layouts (random weights): verify and draft forwards run the
// absorbed decoder over the latent pool, the commit moves latent rows.
TEST(CudaSpec, GreedyIsLosslessOnMla) {
  PAGODA_REQUIRE_GPU();
  for (const MlaLayout& layout : kMlaLayouts) {
    SCOPED_TRACE(layout.name);
    const model::ModelConfig config = mla_layout_config(layout);
    model::LlamaModel m(config, model::make_random_weights(config, 20261206));
    expect_lossless(m);
  }
}

// EAGLE heads on the CUDA path: random heads (both layouts) stay lossless; an echo head
// (fc = [0 | I], o_proj = down_proj = 0: it drafts the root again) accepts exactly the target's
// repeats; the head's forward on the CUDA ops (f32 and bf16) matches the CPU ops.
TEST(CudaSpec, EagleHeadsAreLosslessAndExact) {
  PAGODA_REQUIRE_GPU();
  const model::ModelConfig config = model::builtin_tiny_config();
  model::LlamaModel m(config, model::make_random_weights(config, 20240611));
  const auto ps = repetitive_prompts(5, 4);
  for (int page : {1, 16}) {
    const SpecRun plain = run_engine(m, ps, page, {});
    for (model::EagleLayout layout : {model::EagleLayout::kEagle1, model::EagleLayout::kEagle3}) {
      const model::EagleConfig ec =
          model::eagle_config_for(config, layout, layout == model::EagleLayout::kEagle3 ? 160 : 0);
      const model::EagleHead head(ec, model::make_random_eagle_weights(ec, config, 9), m);
      for (int topk : {1, 4}) {
        engine::SpecConfig sc;
        sc.mode = engine::SpecMode::kEagle;
        sc.eagle_head = &head;
        sc.topk = topk;
        sc.steps = 3;
        sc.num_draft_tokens = topk == 1 ? 4 : 10;
        sc.min_accepted = 0.0;
        const SpecRun r = run_engine(m, ps, page, sc);
        const std::string what = std::string(layout == model::EagleLayout::kEagle1 ? "eagle1" : "eagle3") +
                                 " topk " + std::to_string(topk) + " page " + std::to_string(page);
        for (size_t i = 0; i < ps.size(); ++i)
          EXPECT_EQ(r.tokens[i], plain.tokens[i]) << what << " prompt " << i;
        EXPECT_GT(r.stats.spec_steps, 0) << what;
        EXPECT_EQ(r.leaked, 0) << what;
      }
    }
  }
  // Echo head, one request at a time (every step after its prefill is a round).
  const int64_t h = config.hidden_size;
  model::EagleConfig ec = model::eagle_config_for(config, model::EagleLayout::kEagle1);
  model::EagleWeights w = model::make_random_eagle_weights(ec, config, 5);
  std::fill(w.fc.begin(), w.fc.end(), 0.f);
  for (int64_t r = 0; r < h; ++r) w.fc[static_cast<size_t>(r * 2 * h + h + r)] = 1.f;
  std::fill(w.fc_bias.begin(), w.fc_bias.end(), 0.f);
  std::fill(w.o_proj.begin(), w.o_proj.end(), 0.f);
  std::fill(w.down_proj.begin(), w.down_proj.end(), 0.f);
  const model::EagleHead echo(ec, w, m);
  engine::SpecConfig sc;
  sc.mode = engine::SpecMode::kEagle;
  sc.eagle_head = &echo;
  sc.steps = 3;
  sc.num_draft_tokens = 4;
  sc.min_accepted = 0.0;
  int64_t expected = 0, accepted = 0;
  for (int32_t tok : {5, 17, 113, 200}) {
    const std::vector<std::vector<int32_t>> one = {std::vector<int32_t>(12, tok)};
    const SpecRun longer = [&] {  // the plain output, 4 tokens longer than the spec run's
      auto gpu = platform::make_cuda_platform();
      engine::EngineConfig cfg;
      cfg.page_size = 16;
      cfg.pool_tokens = 8192;
      cfg.backend.attention = "cuda";
      cfg.dtype = DType::kF32;
      engine::Engine eng(m, cfg, gpu.get());
      const auto id = eng.add_request({.prompt = one[0], .max_new_tokens = 28, .ignore_eos = true});
      eng.run_until_idle();
      SpecRun out;
      out.tokens.push_back(eng.output(id).output_ids);
      return out;
    }();
    const SpecRun r = run_engine(m, one, 16, sc);
    const auto& out = r.tokens[0];
    const auto& full = longer.tokens[0];
    ASSERT_EQ(std::vector<int32_t>(full.begin(), full.begin() + 24), out) << "echo prompt " << tok;
    for (size_t j = 0; j + 1 < out.size();) {
      size_t a = 0;
      while (a < 3 && full[j + 1 + a] == full[j]) ++a;
      expected += static_cast<int64_t>(a);
      j += a + 1;
    }
    accepted += r.stats.spec.accepted;
  }
  std::printf("[eagle-echo cuda] accepted %lld, expected %lld\n", static_cast<long long>(accepted),
              static_cast<long long>(expected));
  EXPECT_GT(expected, 0);
  EXPECT_EQ(accepted, expected);
}

TEST(CudaSpec, EagleRunnerMatchesTheCpuOps) {
  PAGODA_REQUIRE_GPU();
  const model::ModelConfig config = model::builtin_tiny_config();
  const model::LlamaModel m(config, model::make_random_weights(config, 20240611));
  auto gpu = platform::make_cuda_platform();
  auto cpu = platform::make_cpu_platform();
  for (model::EagleLayout layout : {model::EagleLayout::kEagle1, model::EagleLayout::kEagle3}) {
    const model::EagleConfig ec = model::eagle_config_for(config, layout, 0);
    const model::EagleHead head(ec, model::make_random_eagle_weights(ec, config, 3), m);
    kv::ReqToTokenTable table(2, 256);
    const ReqSlot row = *table.alloc();
    const int32_t n = 40;
    std::vector<SlotIndex> slots;
    for (int32_t p = 0; p < n; ++p) slots.push_back(16 + p);  // pages 1..3, contiguous
    table.write(row, 0, slots);
    model::EagleInput in;
    in.forward.mode = attention::ForwardMode::kExtend;
    in.forward.batch_size = 1;
    in.forward.req_pool_indices = {row.value()};
    in.forward.seq_lens = {n};
    in.forward.extend_prefix_lens = {0};
    in.forward.extend_seq_lens = {n};
    std::mt19937_64 rng(17);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (int32_t p = 0; p < n; ++p) {
      in.forward.positions.push_back(p);
      in.forward.out_cache_loc.push_back(slots[static_cast<size_t>(p)]);
      in.input_ids.push_back(static_cast<int32_t>(rng() % 256));
      for (int64_t i = 0; i < head.feature_dim(); ++i) in.features.push_back(nd(rng));
    }
    in.logit_rows = {n - 1, 0};
    model::EagleRunner ref(head, model::make_cpu_ops(*cpu, DType::kF32),
                           {.page_size = 16, .num_pages = 8, .kv_dtype = DType::kF32,
                            .backend = {.attention = "reference"}},
                           table);
    const model::EagleOutput want = ref.run(in);
    for (DType dt : {DType::kF32, DType::kBF16}) {
      model::EagleRunner dev(head, model::make_cuda_ops(*gpu, dt),
                             {.page_size = 16, .num_pages = 8, .kv_dtype = dt,
                              .backend = {.attention = "cuda"}},
                             table);
      const model::EagleOutput got = dev.run(in);
      auto rel = [](const std::vector<float>& a, const std::vector<float>& b) {
        double scale = 1e-6, err = 0;
        for (size_t i = 0; i < a.size(); ++i) {
          scale = std::max(scale, std::abs(static_cast<double>(b[i])));
          err = std::max(err, std::abs(static_cast<double>(a[i]) - b[i]));
        }
        return err / scale;
      };
      const double tol = dt == DType::kF32 ? 1e-2 : 6e-2;
      ASSERT_EQ(got.hidden.size(), want.hidden.size());
      ASSERT_EQ(got.logits.size(), want.logits.size());
      EXPECT_LT(rel(got.hidden, want.hidden), tol) << dtype_name(dt);
      EXPECT_LT(rel(got.logits, want.logits), tol) << dtype_name(dt);
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
