// The CPU ops' GEMM modes (model/cpu_gemm.h over kernels/cpu/onednn_linear.h) against an f64
// reference on random data: oneDNN f32 at f32 accuracy for several M (each a cached primitive,
// one revisited), bf16 against the f64 product of the bf16-rounded inputs (where oneDNN has a
// bf16 matmul; elsewhere the refusal and its reason), packed sizes (bf16 half of f32), packing
// ahead of use (prepare: once, then used by linear()), and the mode names.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"
#include "pagoda/model/cpu_gemm.h"
#include "test_seed.h"

namespace pagoda::model {
namespace {

struct GemmData {
  int64_t n = 0, k = 0;
  std::vector<float> w;  ///< [n, k]
};

GemmData random_weights(std::mt19937_64& rng, int64_t n, int64_t k) {
  std::normal_distribution<float> d(0.f, 1.f);
  GemmData g{n, k, std::vector<float>(static_cast<size_t>(n * k))};
  for (float& v : g.w) v = d(rng);
  return g;
}

/// Checks y = x · wᵀ row by row against f64 sums of the inputs as `round` leaves them; the
/// allowed error is rel · Σ|x w| per element.
void expect_product(const GemmData& g, const std::vector<float>& x, const std::vector<float>& y,
                    int64_t m, float (*round)(float), double rel) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < g.n; ++j) {
      double ref = 0, mag = 0;
      for (int64_t i = 0; i < g.k; ++i) {
        const double p = static_cast<double>(round(x[r * g.k + i])) * round(g.w[j * g.k + i]);
        ref += p, mag += std::abs(p);
      }
      ASSERT_NEAR(y[r * g.n + j], ref, rel * mag + 1e-6) << "row " << r << " col " << j;
    }
}

float keep(float v) { return v; }
float to_bf16(float v) { return bf16_bits_to_f32(f32_to_bf16_bits(v)); }

/// Runs `runner` on random x for each M in `ms` and checks each product.
void check_ms(CpuGemmRunner& runner, const GemmData& g, std::mt19937_64& rng,
              std::initializer_list<int64_t> ms, float (*round)(float), double rel) {
  std::normal_distribution<float> d(0.f, 1.f);
  for (int64_t m : ms) {
    SCOPED_TRACE(::testing::Message() << "m " << m);
    std::vector<float> x(static_cast<size_t>(m * g.k)), y(static_cast<size_t>(m * g.n), NAN);
    for (float& v : x) v = d(rng);
    runner.linear(x.data(), g.w.data(), y.data(), m, g.n, g.k);
    expect_product(g, x, y, m, round, rel);
  }
}

TEST(CpuGemm, NamesRoundTripAndUnknownIsNone) {
  for (CpuGemm g : {CpuGemm::kOpenBlas, CpuGemm::kOnednn, CpuGemm::kOnednnF32})
    EXPECT_EQ(parse_cpu_gemm(cpu_gemm_name(g)), g);
  EXPECT_EQ(parse_cpu_gemm("mkl"), std::nullopt);
  EXPECT_EQ(cpu_gemm_unavailable(CpuGemm::kOpenBlas), "");
  // auto picks oneDNN only where it has native bf16 (and can then run it).
  EXPECT_EQ(auto_cpu_gemm() == CpuGemm::kOnednn, kernels::cpu::onednn_has_native_bf16());
}

TEST(CpuGemm, OnednnF32MatchesDoubleReference) {
  if (const std::string why = cpu_gemm_unavailable(CpuGemm::kOnednnF32); !why.empty())
    GTEST_SKIP() << why;
  const testing::TestSeed seed;
  std::printf("oneDNN ISA %s\n", kernels::cpu::onednn_isa_name().c_str());
  std::mt19937_64 rng(seed);
  const GemmData a = random_weights(rng, 96, 80), b = random_weights(rng, 40, 80);
  CpuGemmRunner runner(CpuGemm::kOnednnF32);
  // `a` packed up front (prepare, as at model load), `b` on first use: the same numbers, and
  // prepare packs nothing twice.
  runner.prepare(a.w.data(), a.n, a.k);
  const size_t prepared = runner.packed_bytes();
  EXPECT_GE(prepared, sizeof(float) * 96 * 80);
  runner.prepare(a.w.data(), a.n, a.k);
  EXPECT_EQ(runner.packed_bytes(), prepared);
  // Two weight matrices, several M each (M = 3 twice: the cached primitive; 77: two 32-row
  // blocks and a 13-row tail block), interleaved.
  check_ms(runner, a, rng, {1, 3, 32}, keep, 1e-5);
  EXPECT_EQ(runner.packed_bytes(), prepared);  // a's linear() used the prepared copy
  check_ms(runner, b, rng, {77, 3}, keep, 1e-5);
  check_ms(runner, a, rng, {3, 5}, keep, 1e-5);
  EXPECT_GE(runner.packed_bytes(), sizeof(float) * (96 * 80 + 40 * 80));
}

TEST(CpuGemm, OpenBlasPreparesNothing) {
  std::mt19937_64 rng(1);
  const GemmData a = random_weights(rng, 8, 8);
  CpuGemmRunner runner(CpuGemm::kOpenBlas);
  runner.prepare(a.w.data(), a.n, a.k);
  EXPECT_EQ(runner.packed_bytes(), 0u);
}

TEST(CpuGemm, OnednnBf16MatchesRoundedReferenceOrRefuses) {
  const std::string why = cpu_gemm_unavailable(CpuGemm::kOnednn);
  if (!why.empty()) {
    // The refusal is an Error naming the mode and the reason, never a silent fallback.
    try {
      CpuGemmRunner runner(CpuGemm::kOnednn);
      ADD_FAILURE() << "constructed although unavailable: " << why;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
      EXPECT_NE(std::string(e.what()).find("--cpu-gemm onednn"), std::string::npos) << e.what();
    }
    GTEST_SKIP() << "bf16 numerics not checked: " << why;
  }
  const testing::TestSeed seed;
  std::printf("oneDNN ISA %s\n", kernels::cpu::onednn_isa_name().c_str());
  std::mt19937_64 rng(seed);
  const GemmData a = random_weights(rng, 128, 96);
  CpuGemmRunner runner(CpuGemm::kOnednn);
  // f32 accumulation of the bf16-rounded inputs: f32 summation error only.
  check_ms(runner, a, rng, {1, 7, 64, 70, 7}, to_bf16, 1e-5);  // 70: a block and a 6-row tail
  EXPECT_GE(runner.packed_bytes(), sizeof(uint16_t) * 128 * 96);
  EXPECT_LT(runner.packed_bytes(), sizeof(float) * 128 * 96);  // bf16: about half of f32
}

}  // namespace
}  // namespace pagoda::model
