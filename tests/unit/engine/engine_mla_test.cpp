// DeepSeek MLA models (ModelConfig::mla) in the engine: greedy output is identical whatever the
// batching, with prefix-cache hits, chunked prefill, pages 1 / 16, both CPU backends and
// speculative decoding (n-gram and self-draft trees verified over the latent pool), against each
// prompt run alone on the reference backend (page 1, no radix, no chunking). The forward itself
// is checked against an independent NumPy forward by model_deepseek_numpy. What MLA does not
// support is refused with an error naming it (EAGLE heads here; tensor parallelism in
// model_deepseek_numpy). DeepSeek-V3.2's sparse attention (DSA): the same exactness with an
// index_topk smaller than the prompts, dense MLA exactly (logprobs bit-equal) when every context
// fits in index_topk, and speculative decoding refused naming DSA.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine_test_util.h"
#include "pagoda/attention/host_paged_backend.h"
#include "pagoda/attention/registry.h"
#include "pagoda/backends/reference/reference_backend.h"
#include "pagoda/core/error.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/model/decoder.h"
#include "pagoda/model/eagle_head.h"
#include "pagoda/platform/platform.h"
#include "test_model.h"

namespace pagoda::engine {
namespace {

testing::TestModel& mla_model(bool q_lora) {
  static testing::TestModel with(testing::mla_test_config(true), 20261206),
      without(testing::mla_test_config(false), 20261206);
  return q_lora ? with : without;
}

struct MlaRun {
  std::string backend = "reference";
  int page = 1;
  bool radix = false;
  int chunk = 0;
  SpecMode spec = SpecMode::kNone;
  int ngram_topk = 1;  ///< kNgram: branching (2: trees whose rows see only their own path)
};

EngineConfig config_of(const MlaRun& r) {
  EngineConfig cfg{.page_size = r.page,
                   .pool_tokens = 2048,
                   .radix_cache = r.radix,
                   .scheduler = SchedulerConfig{.max_running_requests = 6, .chunk_size = r.chunk},
                   .backend = testing::backend_named(r.backend),
                   .check_integrity = true};
  cfg.spec.mode = r.spec;
  if (r.spec == SpecMode::kNgram && r.ngram_topk > 1) {
    cfg.spec.topk = r.ngram_topk;
    cfg.spec.num_draft_tokens = 6;
    cfg.spec.min_accepted = 0.0;  // never pause: every decode step verifies a tree
  }
  if (r.spec == SpecMode::kDraft) {  // self-draft: trees of topk 2, the target as drafter
    cfg.spec.topk = 2;
    cfg.spec.steps = 2;
    cfg.spec.num_draft_tokens = 4;
  }
  return cfg;
}

/// Each prompt alone, unbatched, on the reference backend at page 1 without any cache.
std::vector<std::vector<int32_t>> alone(model::LlamaModel& m,
                                        const std::vector<std::vector<int32_t>>& prompts,
                                        int max_new) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : prompts) {
    Engine engine(m, config_of(MlaRun{}));
    const RequestId id = engine.add_request({.prompt = p, .max_new_tokens = max_new});
    engine.run_until_idle();
    out.push_back(engine.output(id).output_ids);
  }
  return out;
}

/// Runs `prompts` on `m` with `r` (the first half together, the rest after a few steps: they join
/// running decodes) and checks every output against `want` and, with the radix cache, that some
/// prefix hit; returns the engine's stats.
EngineStats run_and_check(model::LlamaModel& m, const MlaRun& r,
                          const std::vector<std::vector<int32_t>>& prompts,
                          const std::vector<std::vector<int32_t>>& want, int max_new) {
  Engine engine(m, config_of(r));
  std::vector<RequestId> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (i == prompts.size() / 2)
      for (int s = 0; s < 3; ++s) engine.step();
    ids.push_back(engine.add_request({.prompt = prompts[i], .max_new_tokens = max_new}));
  }
  engine.run_until_idle();
  int64_t cached = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const RequestOutput& out = engine.output(ids[i]);
    EXPECT_EQ(out.state, RequestState::kFinished) << out.error;
    EXPECT_EQ(out.output_ids, want[i]) << "prompt " << i;
    cached += out.cached_tokens;
  }
  if (r.radix) {
    EXPECT_GT(cached, 0) << "no prefix-cache hit";
  }
  return engine.stats();
}

TEST(EngineMla, IdenticalWithPrefixHitsChunkingPagesAndSpeculation) {
  const uint64_t seed = 5150;
  SCOPED_TRACE(::testing::Message() << "prompt seed " << seed);
  const int max_new = 8;
  for (bool q_lora : {true, false}) {
    model::LlamaModel& m = mla_model(q_lora).model;
    // Shared system prefixes (page-crossing lengths) and a second turn of the first prompts.
    std::vector<std::vector<int32_t>> prompts = testing::make_prompts(seed, 6);
    const auto first = alone(m, prompts, max_new);
    for (int i = 0; i < 2; ++i) {
      auto follow = prompts[static_cast<size_t>(i)];
      follow.insert(follow.end(), first[static_cast<size_t>(i)].begin(),
                    first[static_cast<size_t>(i)].end());
      for (int t = 0; t < 4; ++t) follow.push_back(40 + i + t);
      prompts.push_back(follow);
    }
    const auto want = alone(m, prompts, max_new);
    const MlaRun runs[] = {{"reference", 16, true, 16},
                           {"cpu", 1, true, 8},
                           {"cpu", 16, true, 0},
                           {"cpu", 16, false, 16},
                           {"cpu", 16, true, 0, SpecMode::kNgram},
                           {"reference", 1, true, 8, SpecMode::kDraft}};
    for (const MlaRun& r : runs) {
      const std::string what = std::string(q_lora ? "q-lora " : "") + r.backend + " page " +
                               std::to_string(r.page) + (r.radix ? " radix" : "") + " chunk " +
                               std::to_string(r.chunk) + " spec " + spec_mode_name(r.spec);
      SCOPED_TRACE(what);
      const EngineStats stats = run_and_check(m, r, prompts, want, max_new);
      if (r.spec != SpecMode::kNone) {  // verify rounds ran over the latent pool
        EXPECT_GT(stats.spec.rounds, 0);
      }
      if (r.spec == SpecMode::kDraft) {  // self-draft: the drafted chains are accepted
        EXPECT_GT(stats.spec.accepted, 0);
      }
    }
  }
}

// The expanded prefill form (extend steps: per-head K/V through kv_b_proj, ragged attention;
// model/decoder.h MlaPrefill) against the absorbed form on the same requests (prefix hits and
// chunks, so extends over prefixes too): the same greedy tokens, logprobs within f32 rounding,
// and not bit-equal (the two forms did run: they round differently).
TEST(EngineMla, ExpandedPrefillAgreesWithAbsorbed) {
  const uint64_t seed = 6021;
  SCOPED_TRACE(::testing::Message() << "prompt seed " << seed);
  for (bool q_lora : {true, false}) {
    SCOPED_TRACE(q_lora ? "q-lora" : "no q-lora");
    model::LlamaModel& m = mla_model(q_lora).model;
    std::vector<std::vector<int32_t>> prompts = testing::make_prompts(seed, 6);
    auto run = [&](model::MlaPrefill form, const char* backend, int64_t window_keys = 0) {
      EngineConfig cfg =
          config_of(MlaRun{.backend = backend, .page = 16, .radix = true, .chunk = 16});
      cfg.mla_prefill = form;
      cfg.mla_window_keys = window_keys;
      Engine engine(m, cfg);
      std::vector<RequestId> ids;
      for (size_t i = 0; i < prompts.size(); ++i) {
        if (i == prompts.size() / 2)
          for (int s = 0; s < 3; ++s) engine.step();
        ids.push_back(
            engine.add_request({.prompt = prompts[i], .max_new_tokens = 6, .logprobs = 1}));
      }
      engine.run_until_idle();
      std::pair<std::vector<int32_t>, std::vector<float>> r;
      for (RequestId id : ids) {
        const RequestOutput& out = engine.output(id);
        EXPECT_EQ(out.state, RequestState::kFinished) << out.error;
        r.first.insert(r.first.end(), out.output_ids.begin(), out.output_ids.end());
        for (const model::TokenLogprobs& t : out.logprobs) r.second.push_back(t.logprob);
      }
      return r;
    };
    for (const char* backend : {"reference", "cpu"}) {
      SCOPED_TRACE(backend);
      const auto absorbed = run(model::MlaPrefill::kAbsorbed, backend);
      const auto expanded = run(model::MlaPrefill::kAuto, backend);
      // Windows of 24 keys: the chunks' prefixes (up to ~80 keys) in windows merged by LSE.
      const auto windowed = run(model::MlaPrefill::kAuto, backend, 24);
      for (const auto* form : {&expanded, &windowed}) {
        EXPECT_EQ(form->first, absorbed.first);
        ASSERT_EQ(form->second.size(), absorbed.second.size());
        ASSERT_FALSE(absorbed.second.empty());
        double worst = 0;
        for (size_t i = 0; i < absorbed.second.size(); ++i)
          worst = std::max(worst, double(std::fabs(form->second[i] - absorbed.second[i])));
        EXPECT_LE(worst, 1e-4);
        EXPECT_NE(form->second, absorbed.second) << "the expanded form did not run";
      }
      EXPECT_NE(windowed.second, expanded.second) << "no step ran in windows";
    }
  }
}

/// ReferenceBackend with `ragged` turned off in its capabilities.
class NoRagged final : public attention::AttentionBackend {
 public:
  explicit NoRagged(const attention::BackendContext& ctx) : ref_(ctx) {
    caps_ = ref_.capabilities();
    caps_.ragged = false;
  }
  std::string name() const override { return "no-ragged"; }
  const attention::BackendCapabilities& capabilities() const override { return caps_; }
  void init_forward_metadata(const attention::ForwardBatch& b) override {
    ref_.init_forward_metadata(b);
  }
  void forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                      const attention::AttentionLayer& l, const attention::ForwardBatch& b,
                      const TensorView& o, attention::SaveKv s) override {
    ref_.forward_extend(q, k, v, l, b, o, s);
  }
  void forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                      const attention::AttentionLayer& l, const attention::ForwardBatch& b,
                      const TensorView& o, attention::SaveKv s) override {
    ref_.forward_decode(q, k, v, l, b, o, s);
  }

 private:
  backends::ReferenceBackend ref_;
  attention::BackendCapabilities caps_;
};

// Decoder::expanded_mla's verdicts on step shapes (the tiny layout: r 32, rope 8, nope 16, v 12).
TEST(EngineMla, ExpandedFormChosenByStepShape) {
  auto platform = platform::make_cpu_platform();
  const model::LlamaModel& m = mla_model(true).model;
  auto ops = model::make_cpu_ops(*platform, DType::kF32);
  kv::KvPool pool(m.kv_pool_config(64, 16, model::LlamaModel::PoolLayers::kAll),
                  platform->allocator());
  kv::ReqToTokenTable table(4, 512);
  const attention::BackendContext ctx{
      .platform = platform.get(), .kv_pool = &pool, .req_to_token = &table};
  backends::ReferenceBackend ref(ctx);
  NoRagged plain(ctx);
  model::Decoder dec(m, *ops, &pool);
  // Requests of (prefix, new) tokens; kMixed when one is a decode row.
  auto step = [](std::vector<std::pair<int, int>> reqs, attention::ForwardMode mode) {
    attention::ForwardBatch b{.mode = mode, .batch_size = static_cast<int>(reqs.size())};
    for (auto [pre, n] : reqs) {
      b.req_pool_indices.push_back(1);
      b.seq_lens.push_back(pre + n);
      b.extend_prefix_lens.push_back(pre);
      b.extend_seq_lens.push_back(n);
    }
    return b;
  };
  using attention::ForwardMode;
  EXPECT_EQ(dec.expanded_mla_keys(step({{0, 100}}, ForwardMode::kExtend), ref), 100);  // a prefill
  EXPECT_EQ(dec.expanded_mla_keys(step({{20, 60}, {0, 7}}, ForwardMode::kExtend), ref), 87);
  // Few new tokens over many keys: the absorbed form does less work.
  EXPECT_EQ(dec.expanded_mla_keys(step({{200, 3}}, ForwardMode::kExtend), ref), 0);
  // A prefill of 30 beside a decode row of 200 keys: the decode row's expansion dominates.
  EXPECT_EQ(dec.expanded_mla_keys(step({{0, 30}, {199, 1}}, ForwardMode::kMixed), ref), 0);
  EXPECT_EQ(dec.expanded_mla_keys(step({{0, 30}, {9, 1}}, ForwardMode::kMixed), ref), 40);
  // Other modes, a window's key start, a backend without ragged attention, the option.
  attention::ForwardBatch decode{
      .mode = ForwardMode::kDecode, .batch_size = 1, .req_pool_indices = {1}, .seq_lens = {100}};
  EXPECT_EQ(dec.expanded_mla_keys(decode, ref), 0);
  attention::ForwardBatch windowed = step({{0, 100}}, ForwardMode::kExtend);
  windowed.kv_start = {0};
  EXPECT_EQ(dec.expanded_mla_keys(windowed, ref), 0);
  EXPECT_EQ(dec.expanded_mla_keys(step({{0, 100}}, ForwardMode::kExtend), plain), 0);
  // Windows of 48 keys: more keys go in windows (48 reserved), more new tokens absorbed.
  dec.set_mla_prefill(model::MlaPrefill::kAuto, 48);
  EXPECT_EQ(dec.expanded_mla_keys(step({{0, 40}}, ForwardMode::kExtend), ref), 40);
  EXPECT_EQ(dec.expanded_mla_keys(step({{20, 40}}, ForwardMode::kExtend), ref), 48);
  EXPECT_EQ(dec.expanded_mla_keys(step({{0, 100}}, ForwardMode::kExtend), ref), 0);
  dec.set_mla_prefill(model::MlaPrefill::kAbsorbed, 0);
  EXPECT_EQ(dec.expanded_mla_keys(step({{0, 100}}, ForwardMode::kExtend), ref), 0);
  // A pool in another dtype than the ops' (the gathered rows would need converting).
  kv::KvPoolConfig pc16 = m.kv_pool_config(64, 16, model::LlamaModel::PoolLayers::kAll);
  pc16.dtype = DType::kBF16;
  kv::KvPool pool16(pc16, platform->allocator());
  const attention::BackendContext ctx16{
      .platform = platform.get(), .kv_pool = &pool16, .req_to_token = &table};
  backends::ReferenceBackend ref16(ctx16);
  model::Decoder dec16(m, *ops, &pool16);
  EXPECT_EQ(dec16.expanded_mla_keys(step({{0, 100}}, ForwardMode::kExtend), ref16), 0);
}

/// mla_test_config(true) as DeepSeek-V3.2: a lightning indexer of 2 heads of 16 dims keeping
/// `topk`.
model::ModelConfig dsa_config(int topk) {
  model::ModelConfig c = testing::mla_test_config(true);
  c.family = model::ModelFamily::kDeepseekV32;
  c.dsa = model::DsaConfig{.index_n_heads = 2, .index_head_dim = 16, .index_topk = topk};
  c.name = "dsa-test";
  return c;
}

TEST(EngineMla, DsaIdenticalWithPrefixHitsChunkingAndPages) {
  const uint64_t seed = 7207;
  SCOPED_TRACE(::testing::Message() << "prompt seed " << seed);
  const int max_new = 8;
  // The indexer weights are drawn after the MLA ones: the same seed gives mla_model(true)'s
  // attention and MLP, so the dense run below differs only by the top-k.
  static testing::TestModel sparse(dsa_config(12), 20261206);
  std::vector<std::vector<int32_t>> prompts = testing::make_prompts(seed, 6);
  const auto first = alone(sparse.model, prompts, max_new);
  for (size_t i = 0; i < 2; ++i) {  // second turns: whole-prefix hits on any page size
    auto follow = prompts[i];
    follow.insert(follow.end(), first[i].begin(), first[i].end());
    follow.insert(follow.end(), {40, 41, 42});
    prompts.push_back(follow);
  }
  const auto want = alone(sparse.model, prompts, max_new);
  EXPECT_NE(want, alone(mla_model(true).model, prompts, max_new))
      << "top-12 of up to 86 tokens changed no greedy token: the sparse mask is not applied";
  // Speculation: verify rows see the prefix and their own tree path (the indexer's metadata
  // carries the tree mask), so the top-k, and the greedy tokens, are those of decoding. N-gram
  // drafts, and self-drafts (the DSA model drafting topk-2 trees: its chain steps are decodes,
  // its tree steps verify-shaped, both with the indexer).
  const MlaRun runs[] = {{"cpu", 1, true, 8},
                         {"cpu", 16, true, 16},
                         {"reference", 16, true, 0},
                         {"cpu", 64, false, 64},
                         {"cpu", 16, true, 0, SpecMode::kNgram},
                         {"reference", 1, true, 8, SpecMode::kNgram, 2},
                         {"cpu", 64, false, 0, SpecMode::kNgram, 2},
                         {"reference", 1, true, 8, SpecMode::kDraft},
                         {"cpu", 16, true, 0, SpecMode::kDraft}};
  for (const MlaRun& r : runs) {
    SCOPED_TRACE(r.backend + " page " + std::to_string(r.page) + (r.radix ? " radix" : "") +
                 " chunk " + std::to_string(r.chunk) + " spec " + spec_mode_name(r.spec) +
                 " topk " + std::to_string(r.ngram_topk));
    const EngineStats stats = run_and_check(sparse.model, r, prompts, want, max_new);
    if (r.spec != SpecMode::kNone) {
      EXPECT_GT(stats.spec.rounds, 0);
    }
  }
}

// DSA under the hierarchical cache: the host tier moves each page's index keys with its latent
// rows, so prefixes loaded back from the host select the same top-k. Three turns of six
// conversations (~500 live tokens) over a 128-token device pool; every turn's tokens equal each
// prompt run alone, and the host tier served hits.
TEST(EngineMla, DsaWithTheHostTierGivesTheSameTokens) {
  const uint64_t seed = 7208;
  SCOPED_TRACE(::testing::Message() << "prompt seed " << seed);
  const int max_new = 6;
  static testing::TestModel sparse(dsa_config(12), 20261206);
  for (const int page : {1, 16}) {
    SCOPED_TRACE(::testing::Message() << "page " << page);
    EngineConfig cfg = config_of(MlaRun{"cpu", page, true, 0});
    cfg.pool_tokens = 128;
    cfg.scheduler.max_running_requests = 2;
    cfg.hicache = tier::HiCacheConfig{.host = {.ratio = 8}};
    Engine engine(sparse.model, cfg);
    std::vector<std::vector<int32_t>> history = testing::make_prompts(seed, 6);
    for (int turn = 0; turn < 3; ++turn) {
      const auto want = alone(sparse.model, history, max_new);
      std::vector<RequestId> ids;
      for (const auto& h : history)
        ids.push_back(engine.add_request({.prompt = h, .max_new_tokens = max_new}));
      engine.run_until_idle();
      for (size_t c = 0; c < ids.size(); ++c) {
        const RequestOutput out = engine.output(ids[c]);
        ASSERT_EQ(out.state, RequestState::kFinished) << out.error;
        EXPECT_EQ(out.output_ids, want[c]) << "turn " << turn << " conversation " << c;
        history[c].insert(history[c].end(), out.output_ids.begin(), out.output_ids.end());
        history[c].insert(history[c].end(), {50, 51, static_cast<int32_t>(60 + turn)});
        engine.release(ids[c]);
      }
    }
    const EngineStats stats = engine.stats();
    EXPECT_GT(stats.tier.host_hit_tokens, 0) << "the host tier served no hit";
    EXPECT_EQ(engine.memory().leaked_pages(), 0);
    EXPECT_EQ(engine.memory().leaked_host_pages(), 0);
  }
}

TEST(EngineMla, DsaWithinTopkEqualsDenseMlaExactly) {
  const uint64_t seed = 7208;
  SCOPED_TRACE(::testing::Message() << "prompt seed " << seed);
  static testing::TestModel wide(dsa_config(128), 20261206);  // contexts stay below 128
  const std::vector<std::vector<int32_t>> prompts = testing::make_prompts(seed, 4);
  // Dense MLA absorbed as DSA is (the expanded prefill form rounds differently).
  auto run = [&](model::LlamaModel& m) {
    EngineConfig cfg = config_of(MlaRun{.backend = "cpu", .page = 16, .radix = true, .chunk = 16});
    cfg.mla_prefill = model::MlaPrefill::kAbsorbed;
    Engine engine(m, cfg);
    std::vector<RequestId> ids;
    for (const auto& p : prompts)
      ids.push_back(engine.add_request({.prompt = p, .max_new_tokens = 6, .logprobs = 2}));
    engine.run_until_idle();
    std::vector<std::vector<float>> lp;
    for (RequestId id : ids) {
      const RequestOutput& out = engine.output(id);
      EXPECT_EQ(out.state, RequestState::kFinished) << out.error;
      lp.emplace_back();
      for (const model::TokenLogprobs& t : out.logprobs) {
        lp.back().push_back(t.logprob);
        for (const auto& [tok, l] : t.top) lp.back().insert(lp.back().end(), {float(tok), l});
      }
    }
    return lp;
  };
  const auto dense = run(mla_model(true).model);
  EXPECT_EQ(run(wide.model), dense);  // bit-equal: the identity top-k skips the mask
  ASSERT_FALSE(dense.empty());
  EXPECT_FALSE(dense[0].empty());
}

// EAGLE heads refuse every MLA target, DSA ones included (EngineMla.RefusesEagle).
TEST(EngineMla, DsaRefusesBackendsWithoutTheHook) {
  static testing::TestModel sparse(dsa_config(12), 20261206);
  // A backend without the indexer hook (the cuda backend's capabilities) is refused by name.
  attention::BackendCapabilities caps = attention::full_feature_capabilities();
  caps.dsa = false;
  const auto why = attention::unsupported_reason(caps, sparse.model.backend_requirements(16));
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("DeepSeek sparse attention"), std::string::npos) << *why;
}

/// CPU ops without the MLA op (as a device without rope_interleaved would be): everything else
/// forwards.
class NoMlaOps final : public model::ModelOps {
 public:
  explicit NoMlaOps(platform::Platform& p) : cpu_(model::make_cpu_ops(p, DType::kF32)) {}
  DType dtype() const override { return cpu_->dtype(); }
  platform::Platform& platform() const override { return cpu_->platform(); }
  void* upload(std::span<const float> h) override { return cpu_->upload(h); }
  float* upload_f32(std::span<const float> h) override { return cpu_->upload_f32(h); }
  void embed(const void* t, const int32_t* ids, void* o, int64_t r, int64_t h, int64_t b,
             int64_t n) override {
    cpu_->embed(t, ids, o, r, h, b, n);
  }
  void copy_2d(void* d, int64_t dp, const void* s, int64_t sp, int64_t w, int64_t h) override {
    cpu_->copy_2d(d, dp, s, sp, w, h);
  }
  void add_rms_norm(const void* x, float* r, const void* w, void* o, int64_t n, int64_t h, float e,
                    bool f) override {
    cpu_->add_rms_norm(x, r, w, o, n, h, e, f);
  }
  void rms_norm_rows(const float* r, const int32_t* i, const void* w, void* o, int64_t n, int64_t h,
                     float e) override {
    cpu_->rms_norm_rows(r, i, w, o, n, h, e);
  }
  void linear(const void* x, const void* w, void* y, int64_t m, int64_t n, int64_t k,
              bool f) override {
    cpu_->linear(x, w, y, m, n, k, f);
  }
  void qkv_rope(const void* qkv, const void* b, const int32_t* p, const float* f, void* q, void* k,
                void* v, int64_t r, int hq, int hkv, int d) override {
    cpu_->qkv_rope(qkv, b, p, f, q, k, v, r, hq, hkv, d);
  }
  void silu_mul(const void* g, void* o, int64_t r, int64_t i) override {
    cpu_->silu_mul(g, o, r, i);
  }
  void soft_cap(float* x, int64_t n, float c) override { cpu_->soft_cap(x, n, c); }
  void sample(const float* l, const model::SampleRow* p, int32_t* o, int64_t r,
              int64_t v) override {
    cpu_->sample(l, p, o, r, v);
  }
  void adjust_logits(float* l, int64_t v, const model::LogitAdjust* a, int64_t n) override {
    cpu_->adjust_logits(l, v, a, n);
  }
  void mask_logits(float* l, int64_t v, const int32_t* r, const uint32_t* m, const int32_t* c,
                   int64_t n) override {
    cpu_->mask_logits(l, v, r, m, c, n);
  }

 private:
  std::unique_ptr<model::ModelOps> cpu_;
};

TEST(EngineMla, OpsWithoutTheMlaOpAreRefusedNamingIt) {
  auto platform = platform::make_cpu_platform();
  NoMlaOps ops(*platform);
  try {
    model::Decoder decoder(mla_model(false).model, ops);
    ADD_FAILURE() << "an MLA model on ops without rope_interleaved was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("rope_interleaved"), std::string::npos) << e.what();
  }
}

TEST(EngineMla, RefusesEagle) {
  const model::LlamaModel& m = mla_model(true).model;
  model::EagleConfig ec;
  ec.hidden_size = m.config().hidden_size;
  ec.vocab_size = m.config().vocab_size;
  try {
    model::EagleHead head(ec, model::EagleWeights{}, m);
    ADD_FAILURE() << "EAGLE head over an MLA target accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("MLA"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pagoda::engine
