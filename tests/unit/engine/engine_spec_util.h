#pragma once
// Shared fixtures of the speculative-decoding engine tests: spec configs, repetitive prompts
// (so n-gram drafting finds matches) and a run that compares spec output with the plain engine.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "engine_test_util.h"
#include "pagoda/model/eagle_head.h"

namespace pagoda::testing {

/// Backends of the spec matrix: reference, cpu (when registered), and hybrid (cpu prefill +
/// reference decode; verify routed to prefill).
inline std::vector<std::string> spec_backends() {
  std::vector<std::string> names = exactness_backends();
  if (names.size() > 1) names.push_back("hybrid");
  return names;
}

inline backends::BackendSelection spec_backend(const std::string& name) {
  if (name != "hybrid") return backend_named(name);
  backends::BackendSelection s;
  s.prefill = "cpu";
  s.decode = "reference";
  return s;
}

/// Prompts whose tails repeat earlier spans (editing / retrieval-like), deterministic in seed.
inline std::vector<std::vector<int32_t>> repetitive_prompts(uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> seg(6 + rng() % 10);
    for (auto& x : seg) x = static_cast<int32_t>(rng() % 256);
    std::vector<int32_t> p;
    const int reps = 2 + static_cast<int>(rng() % 2);
    for (int r = 0; r < reps; ++r) p.insert(p.end(), seg.begin(), seg.end());
    p.insert(p.end(), seg.begin(), seg.begin() + static_cast<long>(rng() % seg.size()));
    out.push_back(p);
  }
  return out;
}

/// A random EAGLE head (mechanics only: it rarely guesses right) over test_model(); the EAGLE-3
/// one has a draft vocabulary of 200 of the 300 ids (d2t).
inline const model::EagleHead& test_eagle_head(model::EagleLayout layout) {
  static std::map<model::EagleLayout, std::unique_ptr<model::EagleHead>> heads;
  auto& h = heads[layout];
  if (h == nullptr) {
    const auto& t = test_model();
    const model::EagleConfig c =
        model::eagle_config_for(t.config, layout, layout == model::EagleLayout::kEagle3 ? 200 : 0);
    h = std::make_unique<model::EagleHead>(c, model::make_random_eagle_weights(c, t.config, 77),
                                           t.model);
  }
  return *h;
}

/// An EAGLE-1 head's weights that pass the target's feature through (fc = [0 | I], o_proj = 0,
/// down_proj = 0): it predicts lm_head(final_norm(f_p)), the target's own top-k at the root's
/// parent position, at every depth, so a round accepts exactly where the target repeats.
inline model::EagleWeights echo_eagle_weights(const model::EagleConfig& ec,
                                              const model::ModelConfig& target) {
  const int64_t h = target.hidden_size;
  model::EagleWeights w = model::make_random_eagle_weights(ec, target, 5);
  std::fill(w.fc.begin(), w.fc.end(), 0.f);
  for (int64_t r = 0; r < h; ++r) w.fc[static_cast<size_t>(r * 2 * h + h + r)] = 1.f;
  std::fill(w.fc_bias.begin(), w.fc_bias.end(), 0.f);
  std::fill(w.o_proj.begin(), w.o_proj.end(), 0.f);
  std::fill(w.down_proj.begin(), w.down_proj.end(), 0.f);
  return w;
}

/// Prints a matrix case's round statistics; a self-draft chain (kDraft, topk 1, no draft model)
/// is the target's own greedy chain, so every drafted token must be accepted.
inline void report_spec_case(const std::string& name, const engine::EngineStats& st,
                             engine::SpecMode mode, int topk) {
  std::printf("[spec] %s: %lld rounds, accept length %.2f, accepted %lld of %lld drafted\n",
              name.c_str(), static_cast<long long>(st.spec_steps), st.spec.mean_accept_length(),
              static_cast<long long>(st.spec.accepted),
              static_cast<long long>(st.spec.draft_tokens));
  if (mode == engine::SpecMode::kDraft && topk == 1) {
    EXPECT_EQ(st.spec.accepted, st.spec.draft_tokens) << name;
  }
}

inline engine::SpecConfig spec_config(engine::SpecMode mode, int topk, int steps,
                                      model::EagleLayout layout = model::EagleLayout::kEagle3) {
  engine::SpecConfig s;
  s.mode = mode;
  s.topk = topk;
  s.steps = steps;
  s.num_draft_tokens = topk == 1 ? steps + 1 : std::min(16, 1 + topk * steps + 2);
  s.min_accepted = 0.0;  // keep speculating: the tests exercise the spec path
  if (mode == engine::SpecMode::kEagle) s.eagle_head = &test_eagle_head(layout);
  return s;
}

/// Greedy outputs of the plain engine (no speculation) for (backend, page size), cached.
inline const std::vector<std::vector<int32_t>>& plain_outputs(
    const std::string& backend, int page, const std::vector<std::vector<int32_t>>& prompts,
    int max_new) {
  static std::map<std::tuple<std::string, int, std::vector<std::vector<int32_t>>, int>,
                  std::vector<std::vector<int32_t>>>
      cache;
  auto key = std::make_tuple(backend, page, prompts, max_new);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  engine::Engine e(test_model().model,
                   engine::EngineConfig{.page_size = page,
                                        .pool_tokens = 8192,
                                        .backend = spec_backend(backend)});
  std::vector<engine::RequestId> ids;
  for (const auto& p : prompts)
    ids.push_back(e.add_request({.prompt = p, .max_new_tokens = max_new}));
  e.run_until_idle();
  std::vector<std::vector<int32_t>> outs;
  for (auto id : ids) outs.push_back(e.output(id).output_ids);
  return cache.emplace(key, std::move(outs)).first->second;
}

/// Spec output equals the plain engine's token for token; where it does not, the naive f64 model
/// must show a near tie at that token (f32 rounding may flip it) and the comparison stops there.
inline void expect_lossless(const std::vector<int32_t>& spec_out,
                            const std::vector<int32_t>& plain_out,
                            const std::vector<int32_t>& prompt, int max_new,
                            const std::string& what) {
  ASSERT_EQ(spec_out.size(), plain_out.size()) << what;
  for (size_t i = 0; i < spec_out.size(); ++i) {
    if (spec_out[i] == plain_out[i]) continue;
    const auto& ref = naive_greedy(prompt, max_new);
    ASSERT_LT(ref.margins[i], 1e-3) << what << ": token " << i << " spec " << spec_out[i]
                                    << " plain " << plain_out[i];
    std::printf("[note] %s: near tie at token %zu, comparison stops\n", what.c_str(), i);
    return;
  }
}

}  // namespace pagoda::testing
