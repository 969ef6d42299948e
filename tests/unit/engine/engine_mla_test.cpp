// DeepSeek MLA models (ModelConfig::mla) in the engine: greedy output is identical whatever the
// batching, with prefix-cache hits, chunked prefill, pages 1 / 16, both CPU backends and
// speculative decoding (n-gram and self-draft trees verified over the latent pool), against each
// prompt run alone on the reference backend (page 1, no radix, no chunking). The forward itself
// is checked against an independent NumPy forward by model_deepseek_numpy. What MLA does not
// support is refused with an error naming it (EAGLE heads here; tensor parallelism in
// model_deepseek_numpy).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine_test_util.h"
#include "pagoda/core/error.h"
#include "pagoda/model/decoder.h"
#include "pagoda/model/eagle_head.h"
#include "pagoda/platform/platform.h"

namespace pagoda::engine {
namespace {

/// A small DeepSeek-V3-style config: q LoRA, YaRN with both mscales != 1, v != nope.
model::ModelConfig mla_config(bool q_lora) {
  model::ModelConfig c;
  c.family = model::ModelFamily::kDeepseekV3;
  c.vocab_size = 320;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.num_layers = 2;
  c.num_q_heads = 4;
  c.num_kv_heads = 4;
  c.mla = model::MlaConfig{.q_lora_rank = q_lora ? 48 : 0,
                           .kv_lora_rank = 32,
                           .qk_nope_head_dim = 16,
                           .qk_rope_head_dim = 8,
                           .v_head_dim = 12};
  c.head_dim = 24;
  c.rope = model::RopeConfig{.theta = 10000.0,
                             .scaling = model::RopeScalingKind::kYarn,
                             .factor = 4.0,
                             .original_max_position = 32,
                             .mscale = 0.8,
                             .mscale_all_dim = 0.6};
  c.bos_token_id = 256;
  c.eos_token_id = 257;
  c.name = "mla-test";
  return c;
}

testing::TestModel& mla_model(bool q_lora) {
  static testing::TestModel with(mla_config(true), 20261206), without(mla_config(false), 20261206);
  return q_lora ? with : without;
}

struct MlaRun {
  std::string backend = "reference";
  int page = 1;
  bool radix = false;
  int chunk = 0;
  SpecMode spec = SpecMode::kNone;
};

EngineConfig config_of(const MlaRun& r) {
  EngineConfig cfg{.page_size = r.page,
                   .pool_tokens = 2048,
                   .radix_cache = r.radix,
                   .scheduler = SchedulerConfig{.max_running_requests = 6, .chunk_size = r.chunk},
                   .backend = testing::backend_named(r.backend),
                   .check_integrity = true};
  cfg.spec.mode = r.spec;
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
      Engine engine(m, config_of(r));
      std::vector<RequestId> ids;
      // The first half together, the rest after a few steps (they join running decodes).
      for (size_t i = 0; i < prompts.size(); ++i) {
        if (i == prompts.size() / 2)
          for (int s = 0; s < 3; ++s) engine.step();
        ids.push_back(engine.add_request({.prompt = prompts[i], .max_new_tokens = max_new}));
      }
      engine.run_until_idle();
      int64_t cached = 0;
      for (size_t i = 0; i < prompts.size(); ++i) {
        const RequestOutput& out = engine.output(ids[i]);
        ASSERT_EQ(out.state, RequestState::kFinished) << out.error;
        EXPECT_EQ(out.output_ids, want[i]) << "prompt " << i;
        cached += out.cached_tokens;
      }
      if (r.radix) {
        EXPECT_GT(cached, 0) << "no prefix-cache hit";
      }
      if (r.spec != SpecMode::kNone) {  // verify rounds ran over the latent pool
        EXPECT_GT(engine.stats().spec.rounds, 0);
      }
      if (r.spec == SpecMode::kDraft) {  // self-draft: the drafted chains are accepted
        EXPECT_GT(engine.stats().spec.accepted, 0);
      }
    }
  }
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
