#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "pagoda/core/error.h"
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
  SCOPED_TRACE(testing::Message() << "seed " << seed);
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
}

}  // namespace
}  // namespace pagoda::model
