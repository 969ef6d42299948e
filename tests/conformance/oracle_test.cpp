// The conformance oracle against closed forms worked out by hand (one query, a few keys, head
// dim 1 or 2), so the oracle itself is checked by something other than the code it judges.
#include <cmath>

#include <gtest/gtest.h>

#include "pagoda/backends/conformance/oracle.h"

namespace pagoda::backends::conformance {
namespace {

using attention::AttentionLayer;

AttentionLayer layer1(int hq = 1, int hkv = 1) {
  return AttentionLayer{.layer_id = LayerId(0), .num_q_heads = hq, .num_kv_heads = hkv,
                        .head_dim_qk = 1, .head_dim_v = 1, .scaling = 1.f};
}

HostTensor q_of(std::initializer_list<float> values, int heads, int dim) {
  const auto n = static_cast<int64_t>(values.size()) / (heads * dim);
  HostTensor q({n, heads, dim}, DType::kF32);
  int64_t i = 0;
  for (float v : values) q.set(i++, v);
  return q;
}

double log2_sum_exp(std::initializer_list<double> s) {
  double z = 0;
  for (double x : s) z += std::exp(x);
  return std::log2(z);
}

// Keys k = {1, 2, -1} (dim 1), values v = {10, 20, 30}; q = 0.5 → logits 0.5, 1, -0.5.
const std::vector<float> kK{1.f, 2.f, -1.f}, kV{10.f, 20.f, 30.f};

TEST(ConformanceOracle, SoftmaxLseAndCausalDecode) {
  const Expected e = dense_oracle(kK, kV, 1, 1, {DenseRow{.qo_len = 1, .toks = {0, 1, 2}, .bits = {}}},
                                  q_of({0.5f}, 1, 1), layer1(), DType::kF32, false, 1);
  const double z = std::exp(0.5) + std::exp(1.0) + std::exp(-0.5);
  EXPECT_NEAR(e.out.get(0), (10 * std::exp(0.5) + 20 * std::exp(1.0) + 30 * std::exp(-0.5)) / z, 1e-5);
  EXPECT_NEAR(e.lse.get(0), log2_sum_exp({0.5, 1.0, -0.5}), 1e-6);
  // The LSE tolerance is half the move of the lightest key (-0.5) being dropped.
  const double p_min = std::exp(-0.5) / z;
  EXPECT_NEAR(e.lse_tol[0], std::min(0.5 * -std::log2(1 - p_min), 1e-3 * (1 + std::fabs(e.lse.get(0)))), 1e-9);
}

// A query the backend may round (q_rounding, relative): the LSE tolerance grows to the largest
// score move, scale · max_j |q k_j| · q_rounding / ln 2 (q = 8 over keys {1, 2, -1}: max |q k| =
// 16, scale 1), which covers the LSE of a query moved by half that much, which the one-key-exact
// tolerance of an unrounded query (about 3e-5 here: the lightest key weighs e^-24) refuses.
TEST(ConformanceOracle, QueryRoundingWidensTheLseToleranceToItsBound) {
  const DenseRow row{.qo_len = 1, .toks = {0, 1, 2}, .bits = {}};
  const Expected exact =
      dense_oracle(kK, kV, 1, 1, {row}, q_of({8.f}, 1, 1), layer1(), DType::kF32, false, 1);
  const Expected rounded = dense_oracle(kK, kV, 1, 1, {row}, q_of({8.f}, 1, 1), layer1(),
                                        DType::kF32, false, 1, 1.0 / 512);
  const double bound = 16.0 / 512 / std::log(2.0);
  EXPECT_LT(exact.lse_tol[0], 1e-4);
  EXPECT_NEAR(rounded.lse_tol[0], bound, 1e-12);
  const double f = 1 + 1.0 / 1024;
  const double moved = log2_sum_exp({8.0 * f, 16.0 * f, -8.0 * f});
  EXPECT_LE(std::fabs(moved - rounded.lse.get(0)), rounded.lse_tol[0]);
  EXPECT_GT(std::fabs(moved - exact.lse.get(0)), exact.lse_tol[0]);
}

TEST(ConformanceOracle, CausalExtendWindowSinkAndCap) {
  // Two queries over three keys: query 0 sees keys 0..1, query 1 sees 0..2 (bottom-right causal).
  const DenseRow row{.qo_len = 2, .toks = {0, 1, 2}, .bits = {}};
  AttentionLayer l = layer1();
  Expected e = dense_oracle(kK, kV, 1, 1, {row}, q_of({1.f, 1.f}, 1, 1), l, DType::kF32, false, 1);
  EXPECT_NEAR(e.out.get(0), (10 * std::exp(1.0) + 20 * std::exp(2.0)) / (std::exp(1.0) + std::exp(2.0)), 1e-5);
  EXPECT_NEAR(e.lse.get(1), log2_sum_exp({1, 2, -1}), 1e-6);
  // Window 0: each query sees only its own key.
  l.sliding_window = 0;
  e = dense_oracle(kK, kV, 1, 1, {row}, q_of({1.f, 1.f}, 1, 1), l, DType::kF32, false, 1);
  EXPECT_NEAR(e.out.get(0), 20, 1e-5);
  EXPECT_NEAR(e.out.get(1), 30, 1e-5);
  EXPECT_NEAR(e.lse.get(1), -1 / std::log(2.0), 1e-6);
  // Sink 0.3 joins the denominator only; cap 1.5 squashes the logits.
  l.sliding_window = -1;
  l.logit_cap = 1.5f;
  const std::vector<float> sinks{0.3f};
  l.sinks = sinks;
  e = dense_oracle(kK, kV, 1, 1, {row}, q_of({1.f, 1.f}, 1, 1), l, DType::kF32, false, 1);
  const double s0 = 1.5 * std::tanh(1 / 1.5), s1 = 1.5 * std::tanh(2 / 1.5), s2 = 1.5 * std::tanh(-1 / 1.5);
  const double z = std::exp(s0) + std::exp(s1) + std::exp(s2) + std::exp(0.3);
  EXPECT_NEAR(e.out.get(1), (10 * std::exp(s0) + 20 * std::exp(s1) + 30 * std::exp(s2)) / z, 1e-5);
  EXPECT_NEAR(e.lse.get(1), std::log2(z), 1e-6);
}

TEST(ConformanceOracle, NonCausalTreeMaskAndEmptyRow) {
  AttentionLayer l = layer1();
  l.mask = attention::MaskKind::kNonCausal;
  const DenseRow row{.qo_len = 2, .toks = {0, 1, 2}, .bits = {}};
  Expected e = dense_oracle(kK, kV, 1, 1, {row}, q_of({1.f, 1.f}, 1, 1), l, DType::kF32, false, 1);
  EXPECT_NEAR(e.lse.get(0), log2_sum_exp({1, 2, -1}), 1e-6);  // query 0 sees key 2 too
  // Custom mask: query 0 sees key 2 only, query 1 nothing (out 0, lse -inf).
  l.mask = attention::MaskKind::kCausal;
  const DenseRow masked{.qo_len = 2, .toks = {0, 1, 2}, .bits = {0, 0, 1, 0, 0, 0}};
  e = dense_oracle(kK, kV, 1, 1, {masked}, q_of({1.f, 1.f}, 1, 1), l, DType::kF32, false, 1);
  EXPECT_NEAR(e.out.get(0), 30, 1e-5);
  EXPECT_EQ(e.out.get(1), 0.f);
  EXPECT_TRUE(std::isinf(e.lse.get(1)) && e.lse.get(1) < 0);
}

TEST(ConformanceOracle, GqaMappingAndFp8Scales) {
  // Hq 4 over Hkv 2: heads 0, 1 read kv head 0; heads 2, 3 read kv head 1. One key per token.
  const std::vector<float> k{1.f, -1.f}, v{5.f, 7.f};  // token 0: kv head 0 -> (1, 5), head 1 -> (-1, 7)
  const Expected e = dense_oracle(k, v, 2, 2, {DenseRow{.qo_len = 1, .toks = {0}, .bits = {}}},
                                  q_of({1.f, 2.f, 3.f, 4.f}, 4, 1), layer1(4, 2), DType::kF32, false, 1);
  EXPECT_NEAR(e.out.get(1), 5, 1e-6);
  EXPECT_NEAR(e.out.get(2), 7, 1e-6);
  EXPECT_NEAR(e.lse.get(1), 2 / std::log(2.0), 1e-6);   // logit 2 · 1
  EXPECT_NEAR(e.lse.get(2), -3 / std::log(2.0), 1e-6);  // logit 3 · -1
  // fp8 e4m3 with k_scale 0.5: 0.3 / 0.5 = 0.6 is stored as 0.625 (3 mantissa bits) → k = 0.3125.
  AttentionLayer l = layer1();
  l.k_scale = 0.5f;
  l.v_scale = 2.f;
  const std::vector<float> k8{0.3f}, v8{3.f};  // 3 / 2 = 1.5, exact in e4m3 → v = 3
  const Expected f = dense_oracle(k8, v8, 1, 1, {DenseRow{.qo_len = 1, .toks = {0}, .bits = {}}},
                                  q_of({1.f}, 1, 1), l, DType::kFp8E4M3, false, 1);
  EXPECT_NEAR(f.lse.get(0), 0.3125 / std::log(2.0), 1e-6);
  EXPECT_NEAR(f.out.get(0), 3, 1e-6);
}

TEST(ConformanceOracle, MlaValuesAreTheLatentPrefix) {
  // MLA: one latent row of 3 (Dqk) whose first 2 elements are V; two tokens.
  const std::vector<float> latent{1.f, 2.f, 0.f, 3.f, 4.f, 1.f};
  AttentionLayer l{.layer_id = LayerId(0), .num_q_heads = 1, .num_kv_heads = 1, .head_dim_qk = 3,
                   .head_dim_v = 2, .scaling = 1.f, .is_mla = true};
  const Expected e = dense_oracle(latent, {}, 3, 0, {DenseRow{.qo_len = 1, .toks = {0, 1}, .bits = {}}},
                                  q_of({0.f, 0.f, 1.f}, 1, 3), l, DType::kF32, true, 2);
  const double w0 = 1, w1 = std::exp(1.0);  // logits 0 and 1
  EXPECT_NEAR(e.out.get(0), (1 * w0 + 3 * w1) / (w0 + w1), 1e-6);
  EXPECT_NEAR(e.out.get(1), (2 * w0 + 4 * w1) / (w0 + w1), 1e-6);
}

}  // namespace
}  // namespace pagoda::backends::conformance
