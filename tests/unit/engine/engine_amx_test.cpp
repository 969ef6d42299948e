// The engine on the amx attention backend (--backend amx --kv-dtype bf16: the CPU model's f32
// queries rounded to bf16 over a bf16 KV pool; extends on the AMX tiles or oneDNN, decodes on the
// cpu kernels) against the naive fp64 model: greedy tokens equal up to the first near tie, for
// tiny Llama, Qwen2 (q/k/v biases, tied embeddings) and Mistral configs, in busy batches with
// the radix cache, chunked prefill and multi-turn follow-ups that hit it; a 0.4 margin, as for
// the bf16 GEMMs (bf16 q and KV move this model's logits by ~0.1). Its refusals (an f32 KV pool,
// a window) name what it does not support. Skipped, saying why, where the backend is not built.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine_test_util.h"
#include "pagoda/backends/builtin.h"

namespace pagoda::engine {
namespace {

using testing::TestModel;

bool amx_registered() {
  attention::BackendRegistry r;
  backends::register_builtin_backends(r);
  return r.contains("amx");
}

EngineConfig amx_config() {
  EngineConfig cfg{.page_size = 16,
                   .pool_tokens = 4096,
                   .radix_cache = true,
                   .scheduler = SchedulerConfig{.max_running_requests = 6, .chunk_size = 48},
                   .backend = testing::backend_named("amx"),
                   .check_integrity = true};
  cfg.kv_dtype = DType::kBF16;
  return cfg;
}

std::vector<model::ModelConfig> families() {
  model::ModelConfig qwen2 = testing::test_model_config();
  qwen2.family = model::ModelFamily::kQwen2;
  qwen2.qkv_bias = true;
  qwen2.tie_word_embeddings = true;
  qwen2.name = "qwen2";
  model::ModelConfig mistral = testing::test_model_config();
  mistral.family = model::ModelFamily::kMistral;
  mistral.name = "mistral";
  return {testing::test_model_config(), qwen2, mistral};
}

TEST(EngineAmx, GreedyMatchesNaiveForEachFamily) {
  if (!amx_registered()) GTEST_SKIP() << "this build has no amx backend (no oneDNN)";
  const uint64_t seed = 91;
  for (const model::ModelConfig& c : families()) {
    SCOPED_TRACE(::testing::Message()
                 << c.name << ", prompt seed " << seed << ", weight seed " << testing::kWeightSeed);
    TestModel m(c);
    Engine engine(m.model, amx_config());
    const int max_new = 8;
    std::vector<std::pair<RequestId, std::vector<int32_t>>> ids;
    for (const auto& p : testing::make_prompts(seed, 6))
      ids.emplace_back(engine.add_request({.prompt = p, .max_new_tokens = max_new}), p);
    engine.run_until_idle();
    for (int i = 0; i < 2; ++i) {  // follow-ups over the cached conversations
      std::vector<int32_t> follow = ids[static_cast<size_t>(i)].second;
      const auto out = engine.output(ids[static_cast<size_t>(i)].first).output_ids;
      follow.insert(follow.end(), out.begin(), out.end());
      for (int t = 0; t < 7; ++t) follow.push_back(50 + 3 * i + t);
      ids.emplace_back(engine.add_request({.prompt = follow, .max_new_tokens = max_new}), follow);
    }
    engine.run_until_idle();
    for (const auto& [id, prompt] : ids)
      testing::expect_matches_naive(
          engine.output(id),
          testing::NaiveLlama::generate(m.config, m.weights, prompt, max_new, false),
          c.name + " request " + std::to_string(id), 0.4);
    int64_t cached = 0;
    for (const auto& [id, prompt] : ids) cached += engine.output(id).cached_tokens;
    EXPECT_GT(cached, 0) << "the follow-ups never hit the radix cache";
    EXPECT_EQ(engine.memory().leaked_pages(), 0);
  }
}

TEST(EngineAmx, RefusesWhatItDoesNotSupportByName) {
  if (!amx_registered()) GTEST_SKIP() << "this build has no amx backend (no oneDNN)";
  auto message_of = [](model::LlamaModel& model, const EngineConfig& cfg) -> std::string {
    try {
      Engine engine(model, cfg);
      const RequestId id = engine.add_request({.prompt = {1, 2, 3}, .max_new_tokens = 2});
      engine.run_until_idle();
      return engine.output(id).error;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
      return e.what();
    }
  };
  EngineConfig f32_kv = amx_config();
  f32_kv.kv_dtype = DType::kF32;
  const std::string kv = message_of(testing::test_model().model, f32_kv);
  EXPECT_NE(kv.find("kv dtype f32"), std::string::npos) << kv;
  model::ModelConfig windowed = testing::test_model_config();
  windowed.family = model::ModelFamily::kMistral;
  windowed.layer_window.assign(static_cast<size_t>(windowed.num_layers), 64);
  TestModel w(windowed);
  const std::string win = message_of(w.model, amx_config());
  EXPECT_NE(win.find("window"), std::string::npos) << win;
}

}  // namespace
}  // namespace pagoda::engine
