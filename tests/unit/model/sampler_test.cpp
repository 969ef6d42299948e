#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "pagoda/core/error.h"
#include "pagoda/model/cuda/philox.h"
#include "pagoda/model/sampler.h"

namespace pagoda::model {
namespace {

std::vector<float> random_logits(uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, 2.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(Sampler, GreedyIsArgmax) {
  const auto logits = random_logits(1, 300);
  Sampler s(SamplingParams{});
  EXPECT_EQ(s.sample(logits), argmax(logits));
  Sampler k1(SamplingParams{.temperature = 1.f, .top_k = 1, .seed = 9});
  EXPECT_EQ(k1.sample(logits), argmax(logits));
}

TEST(Sampler, SameSeedSameSequenceDifferentSeedDiffers) {
  const uint64_t seed = 12345;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const SamplingParams p{.temperature = 1.0f, .top_k = 50, .top_p = 0.95f, .seed = seed};
  Sampler a(p), b(p), c(SamplingParams{.temperature = 1.0f, .top_k = 50, .top_p = 0.95f,
                                       .seed = seed + 1});
  int differ = 0;
  for (int i = 0; i < 64; ++i) {
    const auto logits = random_logits(seed + i, 300);
    const int32_t x = a.sample(logits);
    EXPECT_EQ(x, b.sample(logits));
    differ += x != c.sample(logits);
  }
  EXPECT_GT(differ, 0);
}

TEST(Sampler, TopKAndTopPRestrictTheSupport) {
  const auto logits = random_logits(7, 100);
  std::vector<int32_t> order(100);
  for (int i = 0; i < 100; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  Sampler k(SamplingParams{.temperature = 2.f, .top_k = 3, .seed = 3});
  Sampler p(SamplingParams{.temperature = 1.f, .top_p = 1e-6f, .seed = 3});
  for (int i = 0; i < 200; ++i) {
    const int32_t t = k.sample(logits);
    EXPECT_TRUE(t == order[0] || t == order[1] || t == order[2]) << t;
    EXPECT_EQ(p.sample(logits), order[0]);
  }
}

TEST(Sampler, MatchesTheSoftmaxDistribution) {
  const std::vector<float> logits = {0.f, std::log(3.f)};
  Sampler s(SamplingParams{.temperature = 1.f, .seed = 2024});
  int ones = 0;
  const int n = 8000;
  for (int i = 0; i < n; ++i) ones += s.sample(logits);
  EXPECT_NEAR(static_cast<double>(ones) / n, 0.75, 0.03);
}

TEST(Sampler, RejectsBadParams) {
  EXPECT_THROW(Sampler(SamplingParams{.temperature = -1.f}), Error);
  EXPECT_THROW(Sampler(SamplingParams{.temperature = 1.f, .top_p = 0.f}), Error);
  EXPECT_THROW(Sampler(SamplingParams{.temperature = NAN}), Error);
  EXPECT_THROW(Sampler(SamplingParams{.temperature = 1.f, .min_p = 1.f}), Error);
  EXPECT_THROW(Sampler(SamplingParams{.temperature = 1.f, .min_p = -0.1f}), Error);
  EXPECT_THROW(Sampler(SamplingParams{.temperature = 1.f, .min_p = NAN}), Error);
  EXPECT_NO_THROW(Sampler(SamplingParams{.temperature = 1.f, .min_p = 0.5f}));
}

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheMax) {
  // p / p_max = 1, 0.5, 0.2, 0.05: min_p 0.3 keeps ids 0 and 1 with probabilities 2/3 and 1/3.
  const std::vector<float> logits = {0.f, std::log(0.5f), std::log(0.2f), std::log(0.05f)};
  Sampler s(SamplingParams{.temperature = 1.f, .seed = 77, .min_p = 0.3f});
  const int n = 6000;
  int ones = 0;
  for (int i = 0; i < n; ++i) {
    const int32_t t = s.sample(logits);
    ASSERT_TRUE(t == 0 || t == 1) << t;
    ones += t;
  }
  EXPECT_NEAR(static_cast<double>(ones) / n, 1.0 / 3.0, 0.03);
  // min_p applies after top-k / top-p, relative to the most likely token.
  Sampler k(SamplingParams{.temperature = 1.f, .top_k = 3, .seed = 5, .min_p = 0.1f});
  Sampler all(SamplingParams{.temperature = 1.f, .seed = 5, .min_p = 0.01f});
  bool saw3 = false;
  for (int i = 0; i < 4000; ++i) {
    EXPECT_LT(k.sample(logits), 3);
    saw3 |= all.sample(logits) == 3;
  }
  EXPECT_TRUE(saw3) << "min_p below every ratio keeps every token";
}

TEST(Sampler, MinPZeroKeepsTheRandomStream) {
  // min_p = 0 changes nothing: same draws as before the field existed.
  const auto logits = random_logits(3, 500);
  Sampler a(SamplingParams{.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .seed = 99});
  Sampler b(SamplingParams{.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .seed = 99,
                           .min_p = 0.f});
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.sample(logits), b.sample(logits));
}

TEST(Philox, KnownAnswersAndUniform) {
  // Random123 known-answer vectors for Philox4x32-10.
  const Philox4x32Out z = philox4x32_10(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(z.v[0], 0x6627e8d5u);
  EXPECT_EQ(z.v[1], 0xe169c58du);
  EXPECT_EQ(z.v[2], 0xbc57ac4cu);
  EXPECT_EQ(z.v[3], 0x9b00dbd8u);
  const Philox4x32Out f = philox4x32_10(~0u, ~0u, ~0u, ~0u, ~0u, ~0u);
  EXPECT_EQ(f.v[0], 0x408f276du);
  EXPECT_EQ(f.v[3], 0x6d5451fdu);
  const Philox4x32Out pi = philox4x32_10(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u,
                                         0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(pi.v[0], 0xd16cfe09u);
  EXPECT_EQ(pi.v[3], 0x24126ea1u);
  // philox_uniform is the draw's top 53 bits; roughly uniform with mean 1/2.
  EXPECT_EQ(philox_uniform(1, 2), static_cast<double>(philox_draw64(1, 2) >> 11) * 0x1.0p-53);
  double sum = 0;
  for (int64_t step = 0; step < 10000; ++step) {
    const double u = philox_uniform(12345, step);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.01);
  EXPECT_NE(philox_draw64(1, 0), philox_draw64(2, 0));
  EXPECT_NE(philox_draw64(1, 0), philox_draw64(1, 1));
}

}  // namespace
}  // namespace pagoda::model
