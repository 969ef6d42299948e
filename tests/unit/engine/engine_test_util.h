#pragma once
// Shared fixtures of the engine tests: the test model, deterministic prompts with shared
// prefixes, naive greedy references (cached per prompt) and the comparison helper.

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "naive_llama.h"
#include "pagoda/attention/registry.h"
#include "pagoda/backends/builtin.h"
#include "pagoda/engine/engine.h"
#include "pagoda/model/llama.h"
#include "test_model.h"

namespace pagoda::testing {

inline constexpr uint64_t kWeightSeed = 20240611;

/// A model with seeded random weights (the shared test model by default).
struct TestModel {
  explicit TestModel(model::ModelConfig c = test_model_config(), uint64_t seed = kWeightSeed)
      : config(std::move(c)), weights(model::make_random_weights(config, seed)),
        model(config, weights) {}
  model::ModelConfig config;
  model::ModelWeights weights;
  model::LlamaModel model;
};

inline TestModel& test_model() {
  static TestModel m;
  return m;
}

/// Backends to run exactness tests on: "reference" and, when registered, "cpu".
inline std::vector<std::string> exactness_backends() {
  attention::BackendRegistry r;
  backends::register_builtin_backends(r);
  std::vector<std::string> names = {"reference"};
  if (r.contains("cpu")) names.push_back("cpu");
  return names;
}

/// A backend selection naming one backend for prefill and decode.
inline backends::BackendSelection backend_named(const std::string& name) {
  backends::BackendSelection s;
  s.attention = name;
  return s;
}

/// `n` prompts: groups sharing a system prefix (page-crossing lengths), plus a few unrelated
/// short and long ones. Deterministic in `seed`.
inline std::vector<std::vector<int32_t>> make_prompts(uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  auto rand_tokens = [&](int len) {
    std::vector<int32_t> t(len);
    for (auto& x : t) x = static_cast<int32_t>(rng() % 256);
    return t;
  };
  const std::vector<std::vector<int32_t>> systems = {rand_tokens(37), rand_tokens(20)};
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p;
    if (i % 4 != 3) p = systems[i % 2];
    const auto tail = rand_tokens(1 + static_cast<int>(rng() % 30));
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
  }
  return prompts;
}

/// Naive greedy continuation of `prompt` (cached).
inline const NaiveLlama::Greedy& naive_greedy(const std::vector<int32_t>& prompt, int max_new) {
  static std::map<std::pair<std::vector<int32_t>, int>, NaiveLlama::Greedy> cache;
  auto key = std::make_pair(prompt, max_new);
  auto it = cache.find(key);
  if (it == cache.end()) {
    const auto& m = test_model();
    it = cache.emplace(key, NaiveLlama::generate(m.config, m.weights, prompt, max_new, false))
             .first;
  }
  return it->second;
}

/// Greedy tokens equal the naive ones. At the first difference the naive top-2 logit gap must be
/// a near tie (< `tie`; 1e-3: f32 vs f64 rounding can legitimately flip it); comparison stops
/// there.
inline void expect_matches_naive(const engine::RequestOutput& out,
                                 const NaiveLlama::Greedy& ref, const std::string& what,
                                 double tie = 1e-3) {
  ASSERT_EQ(out.state, engine::RequestState::kFinished) << what;
  ASSERT_NE(out.finish_reason, engine::FinishReason::kError) << what << ": " << out.error;
  ASSERT_LE(out.output_ids.size(), ref.tokens.size()) << what;
  for (size_t i = 0; i < out.output_ids.size(); ++i) {
    if (out.output_ids[i] == ref.tokens[i]) continue;
    ASSERT_LT(ref.margins[i], tie) << what << ": token " << i << " is " << out.output_ids[i]
                                    << ", naive " << ref.tokens[i] << " (margin "
                                    << ref.margins[i] << ")";
    std::printf("[note] %s: near tie at token %zu (margin %.2e), comparison stops\n",
                what.c_str(), i, ref.margins[i]);
    return;
  }
}

}  // namespace pagoda::testing
