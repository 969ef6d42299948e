// logit_bias, penalties and logprobs through the engine: greedy outputs of a batch mixing processed and
// plain requests (chunked prefill, decode) against a naive f64 model whose logits go through the
// reference formulas (logit_reference.h) token by token.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <set>

#include "engine_spec_util.h"
#include "engine_test_util.h"
#include "logit_reference.h"
#include "random_constraint.h"
#include "pagoda/core/error.h"
#include "test_seed.h"

namespace pagoda::engine {
namespace {

using model::LogitProcessing;
using testing::NaiveLlama;
using testing::test_model;

/// Greedy continuation of `prompt` by the naive model with `p` applied before each argmax.
NaiveLlama::Greedy reference_greedy(const std::vector<int32_t>& prompt, int max_new,
                                    const LogitProcessing& p) {
  const auto& m = test_model();
  NaiveLlama naive(m.config, m.weights);
  std::vector<double> logits;
  for (int32_t t : prompt) logits = naive.feed(t);
  NaiveLlama::Greedy g;
  for (int i = 0; i < max_new; ++i) {
    const auto l = testing::reference_processed_logits(std::span<const double>(logits),
                                                       std::span<const int32_t>(prompt),
                                                       std::span<const int32_t>(g.tokens), p);
    const auto best = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    double second = -1e300;
    for (size_t v = 0; v < l.size(); ++v)
      if (static_cast<int32_t>(v) != best) second = std::max(second, l[v]);
    g.tokens.push_back(best);
    g.margins.push_back(l[static_cast<size_t>(best)] - second);
    if (i + 1 < max_new) logits = naive.feed(best);
  }
  return g;
}

int repeats(const std::vector<int32_t>& t) {
  return static_cast<int>(t.size() - std::set<int32_t>(t.begin(), t.end()).size());
}

TEST(EngineLogitProcessing, GreedyMatchesTheNaiveReference) {
  const testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  const int max_new = 16;
  const int vocab = test_model().config.vocab_size;
  const auto prompts = testing::make_prompts(seed, 6);
  const int32_t forced = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  std::vector<LogitProcessing> lps(6);
  lps[1].logit_bias = {{forced, 100.f}};
  lps[2].presence_penalty = 2.f;
  lps[3] = {.presence_penalty = -0.5f, .frequency_penalty = 1.5f};
  lps[4].repetition_penalty = 1.3f + unit(rng) * 0.7f;
  lps[5] = {.presence_penalty = unit(rng) * 4.f - 2.f,
            .frequency_penalty = unit(rng) * 4.f - 2.f,
            .repetition_penalty = 0.5f + unit(rng)};
  for (int i = 0; i < 12; ++i)
    lps[5].logit_bias.emplace_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)),
                                   unit(rng) * 20.f - 10.f);
  for (const std::string& backend : testing::exactness_backends()) {
    SCOPED_TRACE(backend);
    EngineConfig cfg{.page_size = 16,
                     .pool_tokens = 2048,
                     .scheduler = SchedulerConfig{.max_running_requests = 8, .chunk_size = 16},
                     .backend = testing::backend_named(backend),
                     .check_integrity = true};
    Engine engine(test_model().model, cfg);
    std::vector<RequestId> ids;
    for (size_t i = 0; i < prompts.size(); ++i)
      ids.push_back(engine.add_request({.prompt = prompts[i],
                                        .max_new_tokens = max_new,
                                        .logit_processing = lps[i],
                                        .ignore_eos = true}));
    engine.run_until_idle();
    for (size_t i = 0; i < prompts.size(); ++i)
      testing::expect_matches_naive(engine.output(ids[i]), reference_greedy(prompts[i], max_new, lps[i]),
                                    "request " + std::to_string(i));
    // A large bias forces its token at every step.
    EXPECT_EQ(engine.output(ids[1]).output_ids, std::vector<int32_t>(max_new, forced));
  }
}

// The test model's greedy output falls into repeats; a presence penalty (2, OpenAI's maximum)
// is larger than its logit spread, so no token comes twice.
TEST(EngineLogitProcessing, PresencePenaltyStopsRepetition) {
  const auto prompts = testing::make_prompts(7, 4);
  Engine engine(test_model().model, EngineConfig{.page_size = 16, .pool_tokens = 2048,
                                                 .backend = testing::backend_named("reference")});
  std::vector<RequestId> plain, penalised;
  for (const auto& p : prompts) {
    plain.push_back(engine.add_request({.prompt = p, .max_new_tokens = 24, .ignore_eos = true}));
    penalised.push_back(engine.add_request({.prompt = p,
                                            .max_new_tokens = 24,
                                            .logit_processing = {.presence_penalty = 2.f},
                                            .ignore_eos = true}));
  }
  engine.run_until_idle();
  int plain_repeats = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    plain_repeats += repeats(engine.output(plain[i]).output_ids);
    EXPECT_EQ(repeats(engine.output(penalised[i]).output_ids), 0) << "prompt " << i;
  }
  EXPECT_GT(plain_repeats, 0) << "the test needs a model that repeats without the penalty";
}

// logprobs are the log-softmax of the processed row each token was sampled from (after bias and
// penalties, before temperature): the naive model fed the engine's tokens, its logits through the
// reference processing, log-softmax in double.
TEST(EngineLogitProcessing, LogprobsAreTheLogSoftmaxOfTheProcessedRow) {
  const testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  const int vocab = test_model().config.vocab_size;
  const auto prompts = testing::make_prompts(seed, 4);
  std::vector<LogitProcessing> lps(4);
  lps[1].logit_bias = {{static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)), 3.f}};
  lps[2] = {.presence_penalty = 1.f, .frequency_penalty = 0.5f, .repetition_penalty = 1.2f};
  const int32_t tops[] = {5, 0, model::kMaxLogprobs, -1};
  const float temps[] = {0.f, 0.f, 0.7f, 0.f};
  Engine engine(test_model().model,
                EngineConfig{.page_size = 16, .pool_tokens = 2048,
                             .scheduler = SchedulerConfig{.max_running_requests = 8, .chunk_size = 16},
                             .backend = testing::backend_named("reference")});
  std::vector<RequestId> ids;
  for (size_t i = 0; i < prompts.size(); ++i)
    ids.push_back(engine.add_request({.prompt = prompts[i],
                                      .max_new_tokens = 10,
                                      .sampling = {.temperature = temps[i], .seed = seed + i},
                                      .logit_processing = lps[i],
                                      .logprobs = tops[i],
                                      .ignore_eos = true}));
  engine.run_until_idle();
  EXPECT_TRUE(engine.output(ids[3]).logprobs.empty()) << "a request that did not ask";
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE(::testing::Message() << "request " << i);
    const RequestOutput out = engine.output(ids[i]);
    ASSERT_EQ(out.logprobs.size(), out.output_ids.size());
    const auto& m = test_model();
    NaiveLlama naive(m.config, m.weights);
    std::vector<double> logits;
    for (int32_t t : prompts[i]) logits = naive.feed(t);
    for (size_t k = 0; k < out.output_ids.size(); ++k) {
      const auto l = testing::reference_processed_logits(
          std::span<const double>(logits), std::span<const int32_t>(prompts[i]),
          std::span<const int32_t>(out.output_ids).first(k), lps[i]);
      const double mx = *std::max_element(l.begin(), l.end());
      double z = 0;
      for (double x : l) z += std::exp(x - mx);
      auto ref = [&](int32_t t) { return l[static_cast<size_t>(t)] - mx - std::log(z); };
      const model::TokenLogprobs& got = out.logprobs[k];
      const int32_t token = out.output_ids[k];
      EXPECT_NEAR(got.logprob, ref(token), 1e-3) << "token " << k;
      ASSERT_EQ(got.top.size(), static_cast<size_t>(tops[i]));
      for (size_t j = 0; j < got.top.size(); ++j) {
        EXPECT_NEAR(got.top[j].second, ref(got.top[j].first), 1e-3) << "token " << k;
        if (j > 0) {
          EXPECT_LE(got.top[j].second, got.top[j - 1].second);
        }
      }
      const double best = ref(static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
      if (!got.top.empty()) {
        EXPECT_NEAR(got.top[0].second, best, 1e-3);
      }
      if (temps[i] == 0.f) {
        EXPECT_NEAR(got.logprob, best, 1e-3) << "greedy takes the max";
      }
      logits = naive.feed(token);
    }
  }
}

// Token constraints through the engine (WorkerBatch::mask_rows / token_mask, chunked prefill and
// decode, mixed with plain and logit_bias requests): greedy outputs equal the naive model's argmax
// over each step's allowed set (of the reference-processed logits), and sampled constrained
// requests only ever draw allowed tokens. The test model's vocabulary (300) is not a multiple of 32.
TEST(EngineLogitProcessing, TokenConstraintsMatchTheMaskedNaiveReference) {
  const testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  const int max_new = 12, n = 7;
  const int vocab = test_model().config.vocab_size;
  const auto prompts = testing::make_prompts(seed, n);
  std::vector<std::shared_ptr<testing::RandomConstraint>> cons(n);
  const int every[n] = {2, 8, 0, 40, 1000, 0, 8};  // 0: plain; 1000: mostly one token
  for (int i = 0; i < n; ++i)
    if (every[i] > 0) cons[i] = std::make_shared<testing::RandomConstraint>(rng(), every[i], vocab);
  std::vector<LogitProcessing> lps(n);
  lps[3].logit_bias = {{static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)), 100.f}};
  lps[5].presence_penalty = 1.f;
  Engine engine(test_model().model,
                EngineConfig{.page_size = 16,
                             .pool_tokens = 2048,
                             .scheduler = SchedulerConfig{.max_running_requests = 8,
                                                          .chunk_size = 16},
                             .backend = testing::backend_named("reference"),
                             .check_integrity = true});
  std::vector<RequestId> ids;
  for (int i = 0; i < n; ++i)
    ids.push_back(engine.add_request({.prompt = prompts[static_cast<size_t>(i)],
                                      .max_new_tokens = max_new,
                                      .logit_processing = lps[static_cast<size_t>(i)],
                                      .constraint = cons[static_cast<size_t>(i)],
                                      .ignore_eos = true}));
  auto sampled = std::make_shared<testing::RandomConstraint>(rng(), 8, vocab);
  const RequestId sampled_id = engine.add_request(
      {.prompt = prompts[0], .max_new_tokens = max_new,
       .sampling = {.temperature = 1.f, .seed = rng()}, .constraint = sampled,
       .ignore_eos = true});
  engine.run_until_idle();
  const auto& m = test_model();
  for (int i = 0; i < n; ++i) {
    const std::vector<int32_t>& prompt = prompts[static_cast<size_t>(i)];
    NaiveLlama naive(m.config, m.weights);
    std::vector<double> logits;
    for (int32_t t : prompt) logits = naive.feed(t);
    NaiveLlama::Greedy g;
    for (int k = 0; k < max_new; ++k) {
      auto l = testing::reference_processed_logits(std::span<const double>(logits),
                                                   std::span<const int32_t>(prompt),
                                                   std::span<const int32_t>(g.tokens),
                                                   lps[static_cast<size_t>(i)]);
      if (cons[static_cast<size_t>(i)] != nullptr)
        for (int32_t t = 0; t < vocab; ++t)
          if (!cons[static_cast<size_t>(i)]->allows(k, t)) l[static_cast<size_t>(t)] = -1e300;
      const auto best = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
      double second = -1e300;
      for (int32_t t = 0; t < vocab; ++t)
        if (t != best) second = std::max(second, l[static_cast<size_t>(t)]);
      g.tokens.push_back(best);
      g.margins.push_back(second == -1e300 ? 1e300 : l[static_cast<size_t>(best)] - second);
      if (k + 1 < max_new) logits = naive.feed(best);
    }
    testing::expect_matches_naive(engine.output(ids[static_cast<size_t>(i)]), g,
                                  "request " + std::to_string(i));
    EXPECT_EQ(engine.output(ids[static_cast<size_t>(i)]).output_ids.size(),
              static_cast<size_t>(max_new));
    if (cons[static_cast<size_t>(i)] != nullptr) {
      EXPECT_EQ(cons[static_cast<size_t>(i)]->violations, 0) << "request " << i;
    }
  }
  EXPECT_EQ(engine.output(sampled_id).output_ids.size(), static_cast<size_t>(max_new));
  EXPECT_EQ(sampled->violations, 0);
}

TEST(EngineLogitProcessing, BadValuesAndSpeculationAreRefused) {
  Engine engine(test_model().model, EngineConfig{.page_size = 16, .pool_tokens = 1024,
                                                 .backend = testing::backend_named("reference")});
  const int vocab = test_model().config.vocab_size;
  auto code = [](Engine& e, GenerateRequest g) -> std::optional<ErrorCode> {
    try {
      e.add_request(std::move(g));
    } catch (const Error& err) {
      return err.code();
    }
    return std::nullopt;
  };
  EXPECT_EQ(code(engine, {.prompt = {1, 2}, .logit_processing = {.logit_bias = {{vocab, 1.f}}}}),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code(engine, {.prompt = {1, 2}, .logit_processing = {.presence_penalty = 3.f}}),
            ErrorCode::kInvalidArgument);
  Engine spec(test_model().model,
              EngineConfig{.page_size = 16, .pool_tokens = 1024,
                           .backend = testing::backend_named("reference"),
                           .spec = testing::spec_config(SpecMode::kNgram, 1, 3)});
  EXPECT_EQ(code(spec, {.prompt = {1, 2}, .logit_processing = {.frequency_penalty = 1.f}}),
            ErrorCode::kUnsupported);
  EXPECT_EQ(code(spec, {.prompt = {1, 2}, .logprobs = 2}), ErrorCode::kUnsupported);
  EXPECT_EQ(code(engine, {.prompt = {1, 2}, .logprobs = model::kMaxLogprobs + 1}),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code(spec, {.prompt = {1, 2}}), std::nullopt);
}

}  // namespace
}  // namespace pagoda::engine
