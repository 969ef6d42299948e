// logit_bias and penalties (logit_processing.h) against a dense reference of the same formulas
// (OpenAI presence / frequency over the output, HF / vLLM repetition over prompt + output).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <cstdio>
#include <optional>
#include <random>

#include "pagoda/core/error.h"
#include "logit_reference.h"
#include "pagoda/model/logit_processing.h"

namespace pagoda::model {
namespace {

TEST(LogitProcessing, MatchesDenseReferenceOnRandomRows) {
  const uint64_t seed = std::random_device{}();
  std::printf("[seed] %llu\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const int vocab = 4096, rows = 8;
  std::normal_distribution<float> normal(0.f, 3.f);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  std::vector<float> logits(static_cast<size_t>(rows) * vocab);
  for (float& x : logits) x = normal(rng);
  std::vector<LogitAdjust> adj;
  std::vector<std::vector<double>> want;
  for (int r = 0; r < rows; ++r) {
    auto tokens = [&](int n) {  // from a narrow range so tokens repeat
      std::vector<int32_t> t(static_cast<size_t>(n));
      for (auto& x : t) x = static_cast<int32_t>(rng() % 600);
      return t;
    };
    const auto prompt = tokens(1 + static_cast<int>(rng() % 300));
    const auto output = tokens(static_cast<int>(rng() % 120));
    LogitProcessing p;
    if (r % 4 != 1) p.presence_penalty = unit(rng) * 4.f - 2.f;
    if (r % 4 != 2) p.frequency_penalty = unit(rng) * 4.f - 2.f;
    if (r % 4 != 3) p.repetition_penalty = 0.25f + unit(rng) * 1.75f;
    if (r == 5) p = LogitProcessing{};  // a plain row between adjusted ones
    const int nbias = r == 5 ? 0 : static_cast<int>(rng() % 24);
    for (int i = 0; i < nbias; ++i)  // some of them repeat a token
      p.logit_bias.emplace_back(static_cast<int32_t>(rng() % 700), unit(rng) * 200.f - 100.f);
    p.validate(vocab);
    EXPECT_EQ(p.active(), r != 5);
    const size_t before = adj.size();
    std::vector<int32_t> all = prompt;  // counted in two pieces, as the engine's steps do
    all.insert(all.end(), output.begin(), output.end());
    TokenCounts counts;
    const auto cut = static_cast<size_t>(rng() % (all.size() + 1));
    counts.extend(std::span<const int32_t>(all).first(cut), static_cast<int32_t>(prompt.size()));
    counts.extend(all, static_cast<int32_t>(prompt.size()));
    append_logit_adjust(counts, p, r, adj);
    if (r == 5) {
      EXPECT_EQ(adj.size(), before) << "a plain row adds no entries";
    }
    want.push_back(testing::reference_processed_logits(
        std::span<const float>(logits).subspan(static_cast<size_t>(r) * vocab, vocab),
        std::span<const int32_t>(prompt), std::span<const int32_t>(output), p));
  }
  for (size_t i = 1; i < adj.size(); ++i)  // the order the worker requires
    ASSERT_LT(std::pair(adj[i - 1].row, adj[i - 1].token), std::pair(adj[i].row, adj[i].token));
  apply_logit_adjust(logits.data(), vocab, adj);
  for (int r = 0; r < rows; ++r)
    for (int v = 0; v < vocab; ++v) {
      const double w = want[static_cast<size_t>(r)][static_cast<size_t>(v)];
      ASSERT_NEAR(logits[static_cast<size_t>(r) * vocab + v], w, 1e-5 * (1.0 + std::abs(w)))
          << "row " << r << " token " << v;
    }
}

// Structured output's mask (append_token_mask) on top of logit_bias and penalties: every token
// outside the allowed bitmask ends at -inf, the others as the dense reference has them, and the
// entries keep the worker's (row, token) order.
TEST(LogitProcessing, TokenMaskLeavesOnlyAllowedTokens) {
  const uint64_t seed = std::random_device{}();
  std::printf("[seed] %llu\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const int vocab = 3000, rows = 6;  // not a multiple of 32: the last mask word is partial
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> logits(static_cast<size_t>(rows) * vocab);
  for (float& x : logits) x = normal(rng);
  std::vector<LogitAdjust> adj;
  std::vector<std::vector<double>> want;
  for (int r = 0; r < rows; ++r) {
    std::vector<int32_t> prompt(40), output(static_cast<size_t>(rng() % 60));
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % 500);
    for (auto& t : output) t = static_cast<int32_t>(rng() % 500);
    LogitProcessing p;
    if (r % 2 == 0) {
      p.presence_penalty = 0.5f;
      p.repetition_penalty = 1.3f;
      p.logit_bias = {{static_cast<int32_t>(rng() % 500), 5.f}, {2999, -3.f}};
    }
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), output.begin(), output.end());
    TokenCounts counts;
    if (p.penalized()) counts.extend(all, static_cast<int32_t>(prompt.size()));
    const size_t first = adj.size();
    append_logit_adjust(counts, p, r, adj);
    // Dense allowed sets (a few tokens, or most of them), as a bitmask.
    const double keep = r % 3 == 0 ? 0.01 : r % 3 == 1 ? 0.5 : 0.99;
    std::vector<uint32_t> mask(static_cast<size_t>(vocab + 31) / 32, 0);
    std::vector<bool> ok(static_cast<size_t>(vocab));
    for (int t = 0; t < vocab; ++t) {
      ok[static_cast<size_t>(t)] = std::uniform_real_distribution<double>(0, 1)(rng) < keep;
      if (ok[static_cast<size_t>(t)]) mask[static_cast<size_t>(t / 32)] |= 1u << (t % 32);
    }
    append_token_mask(mask, vocab, r, first, adj);
    std::vector<double> w = testing::reference_processed_logits(
        std::span<const float>(logits).subspan(static_cast<size_t>(r) * vocab, vocab),
        std::span<const int32_t>(prompt), std::span<const int32_t>(output), p);
    for (int t = 0; t < vocab; ++t)
      if (!ok[static_cast<size_t>(t)]) w[static_cast<size_t>(t)] = -INFINITY;
    want.push_back(std::move(w));
  }
  for (size_t i = 1; i < adj.size(); ++i)
    ASSERT_LT(std::pair(adj[i - 1].row, adj[i - 1].token), std::pair(adj[i].row, adj[i].token));
  apply_logit_adjust(logits.data(), vocab, adj);
  for (int r = 0; r < rows; ++r)
    for (int v = 0; v < vocab; ++v) {
      const double w = want[static_cast<size_t>(r)][static_cast<size_t>(v)];
      const float got = logits[static_cast<size_t>(r) * vocab + v];
      if (std::isinf(w)) {
        ASSERT_TRUE(std::isinf(got) && got < 0) << "row " << r << " token " << v << " " << got;
      } else {
        ASSERT_NEAR(got, w, 1e-5 * (1.0 + std::abs(w))) << "row " << r << " token " << v;
      }
    }
}

// TokenCounts extended token by token and in random chunks against a from-scratch recount of
// the prompt and the output at every point.
TEST(LogitProcessing, IncrementalCountsMatchARecount) {
  const uint64_t seed = std::random_device{}();
  std::printf("[seed] %llu\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 20; ++iter) {
    const auto range = static_cast<uint64_t>(2 + rng() % 3000);  // small ranges repeat tokens
    std::vector<int32_t> tokens(1 + rng() % 2000);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % range);
    const auto prompt_len = static_cast<int32_t>(1 + rng() % tokens.size());
    TokenCounts counts;
    size_t n = 0;
    while (n < tokens.size()) {
      n = std::min(tokens.size(), n + (rng() % 4 == 0 ? 1 + rng() % 300 : 1));
      counts.extend(std::span<const int32_t>(tokens).first(n), prompt_len);
      std::map<int32_t, TokenCounts::Count> want;
      for (size_t i = 0; i < n; ++i) {
        TokenCounts::Count& c = want[tokens[i]];
        c.token = tokens[i];
        if (static_cast<int32_t>(i) < prompt_len) c.prompt = true;
        else ++c.output;
      }
      ASSERT_EQ(counts.counted(), static_cast<int64_t>(n));
      ASSERT_EQ(counts.by_token().size(), want.size()) << "after " << n << " tokens";
      auto got = counts.by_token().begin();
      for (const auto& [t, c] : want) {  // in token order, each token once
        ASSERT_EQ(got->token, t) << "after " << n << " tokens";
        ASSERT_EQ(got->prompt, c.prompt) << "token " << t << " after " << n;
        ASSERT_EQ(got->output, c.output) << "token " << t << " after " << n;
        ++got;
      }
    }
  }
}

// token_logprobs against log(softmax) in long double and a full sort (ties by id).
TEST(LogitProcessing, TokenLogprobsAreTheLogSoftmax) {
  const uint64_t seed = std::random_device{}();
  std::printf("[seed] %llu\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 4.f);
  for (int iter = 0; iter < 20; ++iter) {
    const int vocab = 50 + static_cast<int>(rng() % 5000);
    std::vector<float> logits(static_cast<size_t>(vocab));
    for (float& x : logits) x = std::round(normal(rng) * 8.f) / 8.f;  // with ties
    const auto token = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
    const auto n = static_cast<int32_t>(rng() % (kMaxLogprobs + 1));
    const TokenLogprobs got = token_logprobs(logits, token, n);
    long double z = 0;
    for (float l : logits) z += std::exp(static_cast<long double>(l));
    auto lp = [&](int32_t t) {
      return static_cast<double>(std::log(std::exp(static_cast<long double>(logits[t])) / z));
    };
    EXPECT_NEAR(got.logprob, lp(token), 1e-4);
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    for (int32_t i = 0; i < vocab; ++i) order[static_cast<size_t>(i)] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    ASSERT_EQ(got.top.size(), static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
      EXPECT_EQ(got.top[i].first, order[static_cast<size_t>(i)]) << "rank " << i;
      EXPECT_NEAR(got.top[i].second, lp(order[static_cast<size_t>(i)]), 1e-4) << "rank " << i;
    }
  }
}

TEST(LogitProcessing, ValidateNamesTheBadValue) {
  auto code = [](const LogitProcessing& p) -> std::optional<ErrorCode> {
    try {
      p.validate(100);
    } catch (const Error& e) {
      return e.code();
    }
    return std::nullopt;
  };
  EXPECT_EQ(code({.presence_penalty = 2.f, .frequency_penalty = -2.f, .repetition_penalty = 2.f,
                  .logit_bias = {{99, -100.f}, {0, 100.f}}}),
            std::nullopt);
  EXPECT_EQ(code({.presence_penalty = 2.5f}), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code({.frequency_penalty = NAN}), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code({.repetition_penalty = 0.f}), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code({.repetition_penalty = 2.5f}), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code({.logit_bias = {{100, 1.f}}}), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code({.logit_bias = {{-1, 1.f}}}), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code({.logit_bias = {{3, 101.f}}}), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace pagoda::model
