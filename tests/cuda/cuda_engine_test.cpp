// Engine on the CUDA model path (cuBLAS GEMMs, device kernels, decode CUDA graphs) against the
// CPU reference engine (f32 host math, "reference" backend): greedy tokens must be equal and
// logits close, with CUDA graphs on and off; graph replay must equal eager execution.
// Label "gpu": skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_common.h"
#include "mla_test_layouts.h"
#include "random_constraint.h"
#include "pagoda/engine/engine.h"
#include "pagoda/model/config.h"
#include "pagoda/model/llama.h"
#include "pagoda/model/weights.h"
#include "pagoda/platform/cuda/cuda_platform.h"

namespace pagoda {
namespace {

using engine::Engine;
using engine::EngineConfig;
using engine::RequestId;

struct Variant {
  std::string name;
  bool soft_caps = false;
};

model::ModelConfig config_for(const Variant& v) {
  model::ModelConfig c = model::builtin_tiny_config();
  if (v.soft_caps) {
    c.attn_logit_softcap = 30.f;
    c.final_logit_softcap = 20.f;
  }
  return c;
}

/// What one engine run produced per request: tokens and the logits of every sampled row.
struct RunResult {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<std::vector<float>>> logits;
  engine::EngineStats stats;
};

std::vector<std::vector<int32_t>> prompts(uint64_t seed, int n, bool same_length) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> system(37);
  for (auto& x : system) x = static_cast<int32_t>(rng() % 256);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p = (i % 3 == 2 || same_length) ? std::vector<int32_t>{} : system;
    const int tail = same_length ? 21 : 1 + static_cast<int>(rng() % 40);
    for (int j = 0; j < tail; ++j) p.push_back(static_cast<int32_t>(rng() % 256));
    out.push_back(p);
  }
  return out;
}

RunResult run_engine(model::LlamaModel& m, const std::vector<std::vector<int32_t>>& ps,
                     int max_new, bool cuda, bool graphs, int max_running,
                     DType dtype = DType::kF32, model::SamplingParams sampling = {},
                     bool observe_logits = true) {
  std::unique_ptr<platform::Platform> gpu;
  EngineConfig cfg;
  cfg.page_size = 16;
  cfg.pool_tokens = 4096;
  cfg.scheduler.max_running_requests = max_running;
  cfg.backend.attention = cuda ? "cuda" : "reference";
  cfg.cuda_graph = graphs;
  cfg.check_integrity = true;
  cfg.dtype = dtype;
  if (cuda) gpu = platform::make_cuda_platform();
  Engine eng(m, cfg, gpu.get());
  std::map<RequestId, std::vector<std::vector<float>>> logits;
  if (observe_logits)
    eng.set_logits_observer([&](RequestId id, std::span<const float> l) {
      logits[id].emplace_back(l.begin(), l.end());
    });
  std::vector<RequestId> ids;
  for (const auto& p : ps)
    ids.push_back(eng.add_request({.prompt = p, .max_new_tokens = max_new, .sampling = sampling,
                                   .ignore_eos = true, .extra_key = {}}));
  eng.run_until_idle();
  RunResult r;
  for (RequestId id : ids) {
    r.tokens.push_back(eng.output(id).output_ids);
    r.logits.push_back(logits[id]);
  }
  r.stats = eng.stats();
  return r;
}

/// Every prompt's greedy tokens in `got`: `len` of them, equal to the reference run's.
void expect_tokens_equal(const RunResult& ref, const RunResult& got, size_t len) {
  ASSERT_EQ(ref.tokens.size(), got.tokens.size());
  for (size_t i = 0; i < ref.tokens.size(); ++i) {
    EXPECT_EQ(got.tokens[i].size(), len) << "prompt " << i;
    EXPECT_EQ(got.tokens[i], ref.tokens[i]) << "prompt " << i;
  }
}

float max_logit_diff(const RunResult& a, const RunResult& b) {
  float d = 0.f;
  for (size_t i = 0; i < a.logits.size(); ++i)
    for (size_t s = 0; s < std::min(a.logits[i].size(), b.logits[i].size()); ++s)
      for (size_t v = 0; v < a.logits[i][s].size(); ++v)
        d = std::max(d, std::fabs(a.logits[i][s][v] - b.logits[i][s][v]));
  return d;
}

backends::BackendSelection named(const std::string& name) {
  backends::BackendSelection s;
  s.attention = name;
  return s;
}

bool have_gpu() { return platform::cuda_device_count() > 0; }

class CudaEngine : public ::testing::TestWithParam<std::tuple<Variant, bool>> {};

TEST_P(CudaEngine, GreedyTokensEqualCpuReferenceEngine) {
  PAGODA_REQUIRE_GPU();
  const auto& [variant, graphs] = GetParam();
  const model::ModelConfig config = config_for(variant);
  model::LlamaModel m(config, model::make_random_weights(config, 20240611));
  const auto ps = prompts(7, 10, false);
  const RunResult ref = run_engine(m, ps, 16, false, false, 4);
  const RunResult gpu = run_engine(m, ps, 16, true, graphs, 4);
  ASSERT_EQ(ref.tokens.size(), gpu.tokens.size());
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(gpu.tokens[i], ref.tokens[i]) << "prompt " << i;
  const float diff = max_logit_diff(ref, gpu);
  std::printf("[%s, graphs %s] max |logit cuda - cpu reference| = %.3g, graph steps %lld / "
              "decode steps %lld, graphs %d\n",
              variant.name.c_str(), graphs ? "on" : "off", diff,
              static_cast<long long>(gpu.stats.cuda_graph_steps),
              static_cast<long long>(gpu.stats.decode_steps), gpu.stats.cuda_graphs);
  EXPECT_LT(diff, 1e-3f);
  EXPECT_TRUE(gpu.stats.device_path);
  if (graphs) {
    EXPECT_EQ(gpu.stats.cuda_graphs, 3);  // buckets 1, 2, 4
    EXPECT_GT(gpu.stats.cuda_graph_steps, 0);
  } else {
    EXPECT_EQ(gpu.stats.cuda_graph_steps, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, CudaEngine,
    ::testing::Combine(::testing::Values(Variant{"plain", false}, Variant{"softcap", true}),
                       ::testing::Bool()),
    [](const auto& info) {
      return std::get<0>(info.param).name + (std::get<1>(info.param) ? "_graphs" : "_eager");
    });

TEST(CudaEngineGraph, ReplayEqualsEager) {
  PAGODA_REQUIRE_GPU();
  const model::ModelConfig config = model::builtin_tiny_config();
  model::LlamaModel m(config, model::make_random_weights(config, 99));
  // Equal prompts lengths and outputs: every decode step has exactly 4 (a bucket) requests, so
  // the eager and the replayed steps run the same shapes.
  const auto ps = prompts(11, 4, true);
  const RunResult eager = run_engine(m, ps, 24, true, false, 4);
  const RunResult graph = run_engine(m, ps, 24, true, true, 4);
  EXPECT_EQ(graph.tokens, eager.tokens);
  EXPECT_EQ(graph.stats.cuda_graph_steps, graph.stats.decode_steps);
  EXPECT_GT(graph.stats.decode_steps, 0);
  const float diff = max_logit_diff(eager, graph);
  std::printf("graph replay vs eager: max |logit diff| = %.3g over %lld decode steps\n", diff,
              static_cast<long long>(graph.stats.decode_steps));
  EXPECT_LE(diff, 1e-5f);
}

// Structured output on the device: requests with token constraints (random per-step allowed
// sets, WorkerBatch::mask_rows / token_mask) give the CPU reference engine's greedy tokens, both
// eager and with CUDA graphs, and with graphs every decode step (constrained ones included)
// replays a graph (the masks are staged into its fixed buffers). A sampled constrained request
// draws only allowed tokens on the device sampler.
TEST(CudaEngineGraph, TokenConstraintsReplayAndEqualTheCpuEngine) {
  PAGODA_REQUIRE_GPU();
  const uint64_t seed = gpu_test::test_seed(4848);
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const model::ModelConfig config = model::builtin_tiny_config();
  model::LlamaModel m(config, model::make_random_weights(config, 99));
  const auto ps = prompts(seed, 4, true);
  const int max_new = 20;
  struct Run {
    std::vector<std::vector<int32_t>> tokens;
    engine::EngineStats stats;
    int violations = 0;
  };
  auto run = [&](bool cuda, bool graphs) {
    std::unique_ptr<platform::Platform> gpu;
    if (cuda) gpu = platform::make_cuda_platform();
    EngineConfig cfg;
    cfg.page_size = 16;
    cfg.pool_tokens = 4096;
    cfg.scheduler.max_running_requests = 8;  // the 5 requests decode together (bucket 8)
    cfg.backend.attention = cuda ? "cuda" : "reference";
    cfg.cuda_graph = graphs;
    // f32 on both sides: the device default (bf16) moved request 0 off the CPU engine's greedy
    // tokens after 17 steps at add2600 (eager and graphs agreeing with each other).
    cfg.dtype = DType::kF32;
    Engine eng(m, cfg, gpu.get());
    std::vector<std::shared_ptr<testing::RandomConstraint>> cons;
    std::vector<RequestId> ids;
    for (size_t i = 0; i < ps.size(); ++i) {
      // Request 3 is plain: constrained and unconstrained rows share the steps.
      if (i != 3)
        cons.push_back(std::make_shared<testing::RandomConstraint>(seed + i, 4 << (2 * i),
                                                                   config.vocab_size));
      ids.push_back(eng.add_request({.prompt = ps[i], .max_new_tokens = max_new,
                                     .constraint = i != 3 ? cons.back() : nullptr,
                                     .ignore_eos = true}));
    }
    auto sampled = std::make_shared<testing::RandomConstraint>(seed, 8, config.vocab_size);
    eng.add_request({.prompt = ps[0], .max_new_tokens = max_new,
                     .sampling = {.temperature = 1.f, .seed = seed}, .constraint = sampled,
                     .ignore_eos = true});
    eng.run_until_idle();
    Run r{.stats = eng.stats(), .violations = sampled->violations};
    for (RequestId id : ids) r.tokens.push_back(eng.output(id).output_ids);
    for (const auto& c : cons) r.violations += c->violations;
    return r;
  };
  const Run ref = run(false, false), eager = run(true, false), graph = run(true, true);
  EXPECT_EQ(ref.violations, 0);
  EXPECT_EQ(eager.violations, 0);
  EXPECT_EQ(graph.violations, 0);
  EXPECT_EQ(eager.tokens, ref.tokens);
  EXPECT_EQ(graph.tokens, ref.tokens);
  EXPECT_EQ(eager.stats.cuda_graph_steps, 0);
  EXPECT_GT(graph.stats.decode_steps, 0);
  EXPECT_EQ(graph.stats.cuda_graph_steps, graph.stats.decode_steps);
  std::printf("constrained: %lld decode steps, %lld replayed\n",
              static_cast<long long>(graph.stats.decode_steps),
              static_cast<long long>(graph.stats.cuda_graph_steps));
}

TEST(CudaEngineGraph, PaddedBucketsAndShrinkingBatches) {
  PAGODA_REQUIRE_GPU();
  const model::ModelConfig config = model::builtin_tiny_config();
  model::LlamaModel m(config, model::make_random_weights(config, 5));
  // 13 requests, 12 running: buckets 1 2 4 8 12; batches shrink through padded sizes as
  // requests of different lengths finish.
  std::vector<std::vector<int32_t>> ps = prompts(3, 13, false);
  std::vector<RunResult> runs;
  const RunResult eager = run_engine(m, ps, 20, true, false, 12);
  const RunResult graph = run_engine(m, ps, 20, true, true, 12);
  EXPECT_EQ(graph.tokens, eager.tokens);
  EXPECT_EQ(graph.stats.cuda_graphs, 5);
  EXPECT_GT(graph.stats.cuda_graph_steps, 0);
  EXPECT_LT(max_logit_diff(eager, graph), 1e-4f);
}

TEST(CudaEngineBf16, FirstTokensAgreeWithF32AndLogitsClose) {
  PAGODA_REQUIRE_GPU();
  const model::ModelConfig config = model::builtin_tiny_config();
  model::LlamaModel m(config, model::make_random_weights(config, 20240611));
  const auto ps = prompts(17, 20, false);
  const RunResult f32 = run_engine(m, ps, 8, true, true, 8, DType::kF32);
  for (DType t : {DType::kBF16, DType::kF16}) {
    const RunResult low = run_engine(m, ps, 8, true, true, 8, t);
    int first_agree = 0;
    float max_abs = 0.f, max_logit = 0.f;
    for (size_t i = 0; i < ps.size(); ++i) {
      first_agree += low.tokens[i][0] == f32.tokens[i][0];
      const auto& a = f32.logits[i][0];
      const auto& b = low.logits[i][0];
      for (size_t v = 0; v < a.size(); ++v) {
        max_abs = std::max(max_abs, std::fabs(a[v] - b[v]));
        max_logit = std::max(max_logit, std::fabs(a[v]));
      }
    }
    std::printf("[%s vs f32] first tokens agree %d / %zu, first-step max |logit diff| %.3g "
                "(max |logit| %.3g), graph steps %lld\n",
                std::string(dtype_name(t)).c_str(), first_agree, ps.size(), max_abs, max_logit,
                static_cast<long long>(low.stats.cuda_graph_steps));
    EXPECT_GE(first_agree, 19);
    EXPECT_LT(max_abs, 0.05f * max_logit);
    EXPECT_EQ(low.stats.dtype, t);
    EXPECT_GT(low.stats.cuda_graph_steps, 0);
  }
}

TEST(CudaEngineSampling, SeededSamplingOnTheGpuIsIndependentOfBatching) {
  PAGODA_REQUIRE_GPU();
  const model::ModelConfig config = model::builtin_tiny_config();
  model::LlamaModel m(config, model::make_random_weights(config, 8));
  const auto ps = prompts(23, 6, false);
  const model::SamplingParams sp{.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .seed = 7,
                                 .min_p = 0.02f};
  // Alone (graph bucket 1) and in a busy batch (other buckets, padded rows): same tokens. f32:
  // bf16 GEMMs of other batch sizes round differently, which could move a draw across a CDF step.
  const RunResult alone = run_engine(m, {ps[0]}, 16, true, true, 8, DType::kF32, sp, false);
  const RunResult busy = run_engine(m, ps, 16, true, true, 8, DType::kF32, sp, false);
  const RunResult eager = run_engine(m, ps, 16, true, false, 8, DType::kF32, sp, false);
  EXPECT_EQ(alone.tokens[0], busy.tokens[0]);
  EXPECT_EQ(busy.tokens, eager.tokens);
  const RunResult greedy = run_engine(m, ps, 16, true, true, 8, DType::kF32, {}, false);
  int differs = 0;
  for (size_t i = 0; i < ps.size(); ++i) differs += busy.tokens[i] != greedy.tokens[i];
  EXPECT_GT(differs, 0);  // it really samples
}

// DeepSeek MLA models (the absorbed decoder: rope_interleaved, the per-head W_UK / W_UV
// absorption, the backend's MLA path over the latent pool) on the CUDA model path: the configs
// of tools/make_checkpoint.py's deepseek-v2-tiny (no q LoRA, no RoPE scaling) and
// deepseek-v3-tiny (q LoRA, YaRN with both mscales, v != nope) with random f32 weights (as the
// CPU EngineMla tests make them). Greedy tokens equal the CPU reference engine's with CUDA graphs
// on and off; the shared 37-token system prefix gives prefix-cache hits (extends over cached
// latent rows); bf16 runs to the end with first-step logits within 5 % of the largest.
class CudaEngineMla : public ::testing::TestWithParam<std::tuple<MlaLayout, bool>> {};

TEST_P(CudaEngineMla, GreedyTokensEqualCpuReferenceEngine) {
  PAGODA_REQUIRE_GPU();
  const auto& [layout, graphs] = GetParam();
  const model::ModelConfig config = mla_layout_config(layout);
  ASSERT_TRUE(config.is_mla());
  const uint64_t seed = 20261206;
  SCOPED_TRACE(::testing::Message() << layout.name << " weight seed " << seed << " prompt seed 31");
  model::LlamaModel m(config, model::make_random_weights(config, seed));
  const auto ps = prompts(31, 10, false);
  const RunResult ref = run_engine(m, ps, 16, false, false, 4);
  const RunResult gpu = run_engine(m, ps, 16, true, graphs, 4);
  ASSERT_NO_FATAL_FAILURE(expect_tokens_equal(ref, gpu, 16));
  const float diff = max_logit_diff(ref, gpu);
  std::printf("[%s, graphs %s] max |logit cuda - cpu reference| = %.3g, cached tokens %lld, "
              "graph steps %lld / decode steps %lld, graphs %d\n",
              layout.name.c_str(), graphs ? "on" : "off", diff,
              static_cast<long long>(gpu.stats.scheduler.cached_tokens),
              static_cast<long long>(gpu.stats.cuda_graph_steps),
              static_cast<long long>(gpu.stats.decode_steps), gpu.stats.cuda_graphs);
  EXPECT_LT(diff, 1e-3f);
  EXPECT_TRUE(gpu.stats.device_path);
  EXPECT_GT(gpu.stats.scheduler.cached_tokens, 0);  // extends over cached latent rows ran
  if (graphs) {
    EXPECT_EQ(gpu.stats.cuda_graphs, 3);  // buckets 1, 2, 4
    EXPECT_GT(gpu.stats.cuda_graph_steps, 0);
  } else {
    EXPECT_EQ(gpu.stats.cuda_graph_steps, 0);
  }
  if (!graphs) return;
  const RunResult low = run_engine(m, ps, 16, true, true, 4, DType::kBF16);
  float max_abs = 0.f, max_logit = 0.f;
  int first_agree = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    ASSERT_EQ(low.tokens[i].size(), 16u) << "bf16, prompt " << i;
    first_agree += low.tokens[i][0] == ref.tokens[i][0];
    const auto& a = ref.logits[i][0];
    const auto& b = low.logits[i][0];
    for (size_t v = 0; v < a.size(); ++v) {
      max_abs = std::max(max_abs, std::fabs(a[v] - b[v]));
      max_logit = std::max(max_logit, std::fabs(a[v]));
    }
  }
  std::printf("[%s bf16 vs cpu f32] first tokens agree %d / %zu, first-step max |logit diff| "
              "%.3g (max |logit| %.3g)\n",
              layout.name.c_str(), first_agree, ps.size(), max_abs, max_logit);
  EXPECT_LT(max_abs, 0.05f * max_logit);
  EXPECT_GT(low.stats.cuda_graph_steps, 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, CudaEngineMla,
                         ::testing::Combine(::testing::ValuesIn(kMlaLayouts), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param).name +
                                  (std::get<1>(info.param) ? "_graphs" : "_eager");
                         });

// DeepSeek-V3.2 sparse attention (DSA) on the CUDA model path: the lightning indexer's dense ops
// (f32 projections, LayerNorm, NeoX RoPE, fp8 key quantisation into the device pool's index
// rows), the cuda backend's indexer (scores and top-k on the device, queries read in place) and
// its sparse gather plan, against the CPU reference engine (host indexer, f64 scores). The
// deepseek-v3-tiny layout with 4 index heads of 32 dims keeping 16 tokens: prompts of 38-77
// tokens (and short ones, which stay dense when eager) make most steps sparse. Twice: eager, and
// with CUDA graphs (decode steps replayed: the indexer, top-k and sparse plan captured once per
// batch size and replayed at every context; a graph step selects even below k, which equals
// dense MLA up to rounding). The sparse mask changes greedy tokens (checked against the same
// weights with index_topk 4096, so the comparison cannot pass with the mask ignored).
TEST(CudaEngineDsa, GreedyTokensEqualCpuReferenceEngine) {
  PAGODA_REQUIRE_GPU();
  model::ModelConfig config = mla_layout_config(kMlaLayouts[1]);
  config.family = model::ModelFamily::kDeepseekV32;
  config.dsa = model::DsaConfig{.index_n_heads = 4, .index_head_dim = 32, .index_topk = 16};
  const uint64_t seed = 20261207;
  SCOPED_TRACE(::testing::Message() << "weight seed " << seed << " prompt seed 31");
  model::LlamaModel m(config, model::make_random_weights(config, seed));
  const auto ps = prompts(31, 10, false);
  const RunResult ref = run_engine(m, ps, 16, false, false, 4);
  for (const bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "CUDA graphs" : "eager");
    const RunResult gpu = run_engine(m, ps, 16, true, graphs, 4);
    ASSERT_NO_FATAL_FAILURE(expect_tokens_equal(ref, gpu, 16));
    const float diff = max_logit_diff(ref, gpu);
    std::printf(
        "[deepseek_v32 tiny, topk 16, %s] max |logit cuda - cpu reference| = %.3g, cached "
        "tokens %lld, graph steps %lld\n",
        graphs ? "graphs" : "eager", diff,
        static_cast<long long>(gpu.stats.scheduler.cached_tokens),
        static_cast<long long>(gpu.stats.cuda_graph_steps));
    EXPECT_LT(diff, 1e-3f);
    EXPECT_TRUE(gpu.stats.device_path);
    if (graphs) {
      EXPECT_GT(gpu.stats.cuda_graph_steps, 0);
    } else {
      EXPECT_EQ(gpu.stats.cuda_graph_steps, 0);
    }
    EXPECT_GT(gpu.stats.scheduler.cached_tokens, 0);
  }
  model::ModelConfig dense_config = config;
  dense_config.dsa.index_topk = 4096;
  model::LlamaModel dense(dense_config, model::make_random_weights(dense_config, seed));
  EXPECT_NE(run_engine(dense, ps, 16, false, false, 4).tokens, ref.tokens)
      << "index_topk 16 changed no greedy token: the sparse mask is not exercised";
}

TEST(CudaEngineGraph, PlatformSelection) {
  const auto cpu = engine::make_platform_for(named("reference"));
  EXPECT_EQ(cpu->name(), "cpu");
  if (!have_gpu()) {
    if (gpu_test::gpu_required()) PAGODA_SKIP_GPU_TEST("no GPU");
    EXPECT_THROW((void)engine::make_platform_for(named("cuda")), Error);
    return;
  }
  EXPECT_EQ(engine::make_platform_for(named("cuda"))->name(), "cuda");
  EXPECT_EQ(engine::make_platform_for(backends::BackendSelection{})->name(), "cuda");
}

}  // namespace
}  // namespace pagoda
