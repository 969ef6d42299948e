// logit_bias and penalties (logit_processing.h) against a dense reference of the same formulas
// (OpenAI presence / frequency over the output, HF / vLLM repetition over prompt + output).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>

#include "pagoda/core/error.h"
#include "logit_reference.h"
#include "pagoda/model/host_sampling.h"
#include "pagoda/model/logit_processing.h"
#include "pagoda/model/model_ops.h"
#include "pagoda/platform/platform.h"
#include "token_mask_reference.h"
#include "test_seed.h"

namespace pagoda::model {
namespace {

TEST(LogitProcessing, MatchesDenseReferenceOnRandomRows) {
  const testing::TestSeed seed;
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

// Structured output's mask (apply_token_mask) after logit_bias and penalties, the worker's order:
// every token outside the allowed bitmask ends at -inf, the others as the dense reference has
// them.
TEST(LogitProcessing, TokenMaskLeavesOnlyAllowedTokens) {
  const testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  const int vocab = 3000, rows = 6;  // not a multiple of 32: the last mask word is partial
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> logits(static_cast<size_t>(rows) * vocab);
  for (float& x : logits) x = normal(rng);
  std::vector<LogitAdjust> adj;
  std::vector<int32_t> mask_rows;
  std::vector<uint32_t> masks;
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
    append_logit_adjust(counts, p, r, adj);
    // Dense allowed sets (a few tokens, or most of them), as a bitmask.
    const double keep = r % 3 == 0 ? 0.01 : r % 3 == 1 ? 0.5 : 0.99;
    std::vector<uint32_t> mask(static_cast<size_t>(token_mask_words(vocab)), 0);
    std::vector<bool> ok(static_cast<size_t>(vocab));
    for (int t = 0; t < vocab; ++t) {
      ok[static_cast<size_t>(t)] = std::uniform_real_distribution<double>(0, 1)(rng) < keep;
      if (ok[static_cast<size_t>(t)]) mask[static_cast<size_t>(t / 32)] |= 1u << (t % 32);
    }
    masks.insert(masks.end(), mask.begin(), mask.end());
    mask_rows.push_back(r);
    std::vector<double> w = testing::reference_processed_logits(
        std::span<const float>(logits).subspan(static_cast<size_t>(r) * vocab, vocab),
        std::span<const int32_t>(prompt), std::span<const int32_t>(output), p);
    for (int t = 0; t < vocab; ++t)
      if (!ok[static_cast<size_t>(t)]) w[static_cast<size_t>(t)] = -INFINITY;
    want.push_back(std::move(w));
  }
  apply_logit_adjust(logits.data(), vocab, adj);
  apply_token_mask(logits.data(), vocab, mask_rows, masks);
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

// The host sampler with token masks (CpuOps: mask_logits then sample) against a reference that
// masks from per-token booleans: masked rows hold -inf exactly where the mask forbids and their
// other logits bit for bit, rows without a mask are untouched, a greedy row takes the lowest-id
// maximum among the allowed tokens, a sampled row an allowed token (the one sample_row draws from
// the reference-masked row; a one-token mask gives that token). The vocabulary is not a multiple
// of 32 and the bits past it are poisoned, as are the mask buffer's words past the staged count
// (NaN patterns) and the row list past it (real rows, which a read past the count would mask).
TEST(LogitProcessing, TokenMaskOnTheHostSamplerMatchesAReference) {
  const testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  auto platform = platform::make_cpu_platform();
  auto ops = make_cpu_ops(*platform, DType::kF32);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  int single = 0;  // rows whose mask allowed one token
  for (int round = 0; round < 4; ++round) {
    const auto vocab = static_cast<int64_t>(32000 + 32 * (rng() % 100) + 1 + rng() % 31);
    ASSERT_NE(vocab % 32, 0);
    const int rows = 12;
    SCOPED_TRACE(::testing::Message() << "round " << round << " vocab " << vocab);
    std::vector<float> logits(static_cast<size_t>(rows * vocab));
    for (float& x : logits) x = normal(rng);
    const testing::RandomTokenMasks m = testing::random_token_masks(rng, vocab, rows);
    // Staged as the worker stages them: capacity for every row, *count of them in use.
    std::vector<int32_t> row_buf(static_cast<size_t>(rows));
    std::vector<uint32_t> mask_buf(static_cast<size_t>(rows * m.words), 0x7FC00000u);  // NaN
    for (int i = 0; i < rows; ++i) row_buf[static_cast<size_t>(i)] = rows - 1 - i;
    std::copy(m.rows.begin(), m.rows.end(), row_buf.begin());
    std::copy(m.packed.begin(), m.packed.end(), mask_buf.begin());
    for (size_t i = m.packed.size(); i < mask_buf.size(); i += 7) mask_buf[i] = 0u;
    std::vector<SampleRow> params(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r)
      if (rng() % 2 == 0)
        params[static_cast<size_t>(r)] = SampleRow{.temperature = 0.5f + unit(rng),
                                                   .top_k = rng() % 2 == 0 ? 0 : 64,
                                                   .top_p = rng() % 2 == 0 ? 1.f : 0.9f,
                                                   .seed = rng(),
                                                   .step = static_cast<int64_t>(rng() % 100)};
    std::vector<float> want = logits;
    testing::reference_token_mask(want, m);
    const std::vector<float> original = logits;
    const auto count = static_cast<int32_t>(m.rows.size());
    ops->mask_logits(logits.data(), vocab, row_buf.data(), mask_buf.data(), &count, rows);
    ASSERT_EQ(std::memcmp(logits.data(), want.data(), logits.size() * sizeof(float)), 0)
        << "masked logits differ from the reference";
    std::vector<int32_t> out(static_cast<size_t>(rows), -1);
    ops->sample(logits.data(), params.data(), out.data(), rows, vocab);
    std::vector<int32_t> order;
    std::vector<double> probs;
    for (int r = 0; r < rows; ++r) {
      SCOPED_TRACE(::testing::Message() << "row " << r);
      const auto it = std::find(m.rows.begin(), m.rows.end(), r);
      const bool greedy = params[static_cast<size_t>(r)].temperature == 0.f;
      const auto row = std::span<const float>(want).subspan(static_cast<size_t>(r * vocab),
                                                            static_cast<size_t>(vocab));
      if (it == m.rows.end()) {  // untouched: the plain sampler's choice on the original row
        const std::vector<bool> all(static_cast<size_t>(vocab), true);
        if (greedy) {
          EXPECT_EQ(out[r], testing::reference_masked_argmax(original, vocab, r, all));
        }
        EXPECT_EQ(out[r], sample_row(row, params[static_cast<size_t>(r)], order, probs));
        continue;
      }
      const std::vector<bool>& ok = m.allowed[static_cast<size_t>(it - m.rows.begin())];
      ASSERT_TRUE(out[r] >= 0 && out[r] < vocab && ok[static_cast<size_t>(out[r])]) << out[r];
      if (greedy) {
        EXPECT_EQ(out[r], testing::reference_masked_argmax(original, vocab, r, ok));
      } else {
        EXPECT_EQ(out[r], sample_row(row, params[static_cast<size_t>(r)], order, probs));
      }
      if (std::count(ok.begin(), ok.end(), true) == 1) {
        EXPECT_EQ(out[r], std::find(ok.begin(), ok.end(), true) - ok.begin());
        ++single;
      }
    }
    // A staged count of 0 (a graph's unconstrained replay) changes nothing.
    const int32_t none = 0;
    const std::vector<float> before = logits;
    ops->mask_logits(logits.data(), vocab, row_buf.data(), mask_buf.data(), &none, rows);
    EXPECT_EQ(std::memcmp(logits.data(), before.data(), logits.size() * sizeof(float)), 0);
  }
  EXPECT_GT(single, 0) << "no row had a one-token mask";
}

TEST(LogitProcessing, MaskAllowsSomeReadsOnlyTheVocabulary) {
  const int64_t vocab = 70;  // 3 words, 6 tokens in the last
  std::vector<uint32_t> m(3, 0u);
  EXPECT_FALSE(mask_allows_some(m, vocab));
  m[2] = ~0u << 6;  // only bits past the vocabulary
  EXPECT_FALSE(mask_allows_some(m, vocab));
  m[2] |= 1u << 5;  // token 69
  EXPECT_TRUE(mask_allows_some(m, vocab));
  m = {0u, 1u << 31, 0u};  // token 63
  EXPECT_TRUE(mask_allows_some(m, vocab));
  EXPECT_TRUE(mask_allows_some(std::vector<uint32_t>{1u << 31}, 32));
}

// TokenCounts extended token by token and in random chunks against a from-scratch recount of
// the prompt and the output at every point.
TEST(LogitProcessing, IncrementalCountsMatchARecount) {
  const testing::TestSeed seed;
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
  const testing::TestSeed seed;
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
