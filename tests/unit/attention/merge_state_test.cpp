#include <cmath>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "pagoda/attention/batch_attention.h"

namespace pagoda::attention {
namespace {

TEST(MergeState, MatchesDirectComputationOverUnion) {
  const uint64_t seed = 20260721;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd;
  const int n = 3, h = 2, d = 5, la = 7, lb = 4;
  std::vector<float> va(n * h * d), vb(n * h * d), sa(n * h), sb(n * h), vo(n * h * d), so(n * h);
  std::vector<double> direct(n * h * d), direct_lse(n * h);
  for (int i = 0; i < n * h; ++i) {
    // Logits and values of two disjoint key sets; partial states computed separately.
    std::vector<double> logit(la + lb), val((la + lb) * d);
    for (auto& x : logit) x = 3 * nd(rng);
    for (auto& x : val) x = nd(rng);
    auto state = [&](int begin, int end, float* v, float* s) {
      double m = -1e300, sum = 0;
      for (int j = begin; j < end; ++j) m = std::max(m, logit[j]);
      std::vector<double> acc(d, 0);
      for (int j = begin; j < end; ++j) {
        sum += std::exp(logit[j] - m);
        for (int k = 0; k < d; ++k) acc[k] += std::exp(logit[j] - m) * val[j * d + k];
      }
      for (int k = 0; k < d; ++k) v[k] = float(acc[k] / sum);
      *s = float((m + std::log(sum)) / std::log(2.0));
    };
    state(0, la, &va[i * d], &sa[i]);
    state(la, la + lb, &vb[i * d], &sb[i]);
    float v_all[8], s_all;
    state(0, la + lb, v_all, &s_all);
    for (int k = 0; k < d; ++k) direct[i * d + k] = v_all[k];
    direct_lse[i] = s_all;
  }
  merge_state(TensorView(va.data(), DType::kF32, {n, h, d}), TensorView(sa.data(), DType::kF32, {n, h}),
              TensorView(vb.data(), DType::kF32, {n, h, d}), TensorView(sb.data(), DType::kF32, {n, h}),
              TensorView(vo.data(), DType::kF32, {n, h, d}), TensorView(so.data(), DType::kF32, {n, h}));
  for (int i = 0; i < n * h * d; ++i) EXPECT_NEAR(vo[i], direct[i], 1e-5) << i;
  for (int i = 0; i < n * h; ++i) EXPECT_NEAR(so[i], direct_lse[i], 1e-5) << i;
}

TEST(MergeState, NegInfStateContributesNothing) {
  const float inf = std::numeric_limits<float>::infinity();
  float va[2] = {1.f, 2.f}, vb[2] = {std::nanf(""), 5.f}, sa[1] = {0.5f}, sb[1] = {-inf};
  float vo[2], so[1];
  merge_state(TensorView(va, DType::kF32, {1, 1, 2}), TensorView(sa, DType::kF32, {1, 1}),
              TensorView(vb, DType::kF32, {1, 1, 2}), TensorView(sb, DType::kF32, {1, 1}),
              TensorView(vo, DType::kF32, {1, 1, 2}), TensorView(so, DType::kF32, {1, 1}));
  EXPECT_FLOAT_EQ(vo[0], 1.f);
  EXPECT_FLOAT_EQ(vo[1], 2.f);
  EXPECT_FLOAT_EQ(so[0], 0.5f);
  sa[0] = -inf;
  merge_state(TensorView(va, DType::kF32, {1, 1, 2}), TensorView(sa, DType::kF32, {1, 1}),
              TensorView(vb, DType::kF32, {1, 1, 2}), TensorView(sb, DType::kF32, {1, 1}),
              TensorView(vo, DType::kF32, {1, 1, 2}), TensorView(so, DType::kF32, {1, 1}));
  EXPECT_EQ(vo[0], 0.f);
  EXPECT_EQ(so[0], -inf);
}

TEST(RunParams, FromLayer) {
  AttentionLayer layer{.scaling = 0.25f, .logit_cap = 30.f, .sliding_window = 7, .k_scale = 2.f};
  const RunParams p = run_params_for(layer);
  EXPECT_EQ(p.sm_scale, 0.25f);
  EXPECT_EQ(p.logit_cap, 30.f);
  EXPECT_EQ(p.window_left, 7);
  EXPECT_EQ(p.k_scale, 2.f);
}

}  // namespace
}  // namespace pagoda::attention
