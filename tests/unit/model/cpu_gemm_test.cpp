// The CPU ops' GEMM modes (model/cpu_gemm.h over kernels/cpu/onednn_linear.h) against an f64
// reference on random data: oneDNN f32 at f32 accuracy for several M (each a cached primitive,
// one revisited), bf16 against the f64 product of the bf16-rounded inputs (where oneDNN has a
// bf16 matmul; elsewhere the refusal and its reason), packed sizes (bf16 half of f32), packing
// ahead of use (prepare: once, then used by linear()), the mode names, and the fused SwiGLU
// product of the bf16 mode (silu_mul_bf16 against an f64 SwiGLU rounded to bf16; swiglu_linear
// against the f64 product of that operand; the other modes decline it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"
#include "pagoda/kernels/cpu/amx_linear.h"
#include "pagoda/model/cpu_gemm.h"
#include "pagoda/model/ops.h"
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

/// Why `mode` cannot run here ("" when it can); when it cannot, checks that constructing a
/// runner is an Error(kUnsupported) naming "--cpu-gemm <mode>", never a silent fallback.
std::string expect_refusal_if_unavailable(CpuGemm mode) {
  const std::string why = cpu_gemm_unavailable(mode);
  if (why.empty()) return why;
  const std::string flag = "--cpu-gemm " + std::string(cpu_gemm_name(mode));
  try {
    CpuGemmRunner runner(mode);
    ADD_FAILURE() << "constructed although unavailable: " << why;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
  }
  return why;
}

TEST(CpuGemm, NamesRoundTripAndUnknownIsNone) {
  for (CpuGemm g : {CpuGemm::kOpenBlas, CpuGemm::kOnednn, CpuGemm::kOnednnF32, CpuGemm::kAmx})
    EXPECT_EQ(parse_cpu_gemm(cpu_gemm_name(g)), g);
  EXPECT_EQ(parse_cpu_gemm("mkl"), std::nullopt);
  EXPECT_EQ(cpu_gemm_unavailable(CpuGemm::kOpenBlas), "");
  // auto picks the AMX GEMM where it runs, else oneDNN where it has native bf16.
  const bool amx = cpu_gemm_unavailable(CpuGemm::kAmx).empty();
  EXPECT_EQ(auto_cpu_gemm() == CpuGemm::kAmx, amx);
  EXPECT_EQ(auto_cpu_gemm() == CpuGemm::kOnednn, !amx && kernels::cpu::onednn_has_native_bf16());
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
  // Two weight matrices, several M each (M = 3 twice: the cached primitive; 77: one product of
  // 96 rows, the last 19 zero padding), interleaved.
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
  if (const std::string why = expect_refusal_if_unavailable(CpuGemm::kOnednn); !why.empty())
    GTEST_SKIP() << "bf16 numerics not checked: " << why;
  const testing::TestSeed seed;
  std::printf("oneDNN ISA %s\n", kernels::cpu::onednn_isa_name().c_str());
  std::mt19937_64 rng(seed);
  const GemmData a = random_weights(rng, 128, 96);
  CpuGemmRunner runner(CpuGemm::kOnednn);
  // f32 accumulation of the bf16-rounded inputs: f32 summation error only.
  check_ms(runner, a, rng, {1, 7, 64, 70, 7}, to_bf16, 1e-5);  // 70: 96 rows, 26 of them padding
  EXPECT_GE(runner.packed_bytes(), sizeof(uint16_t) * 128 * 96);
  EXPECT_LT(runner.packed_bytes(), sizeof(float) * 128 * 96);  // bf16: about half of f32
}

// pagoda's AMX GEMM (kernels/cpu/amx_linear.h): shapes that are not multiples of 32 (edge
// blocks), k past one chunk (accumulator tiles stored and reloaded between chunks), more column
// blocks than one work item takes, M of one tile (<= 16: decode), of whole and partial 32-row
// blocks, and a shorter M after a longer one (stale operand rows must not leak in).
TEST(CpuGemm, AmxMatchesRoundedReferenceOrRefuses) {
  if (const std::string why = expect_refusal_if_unavailable(CpuGemm::kAmx); !why.empty())
    GTEST_SKIP() << "AMX GEMM not checked: " << why;
  const testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  const GemmData a = random_weights(rng, 100, 70), b = random_weights(rng, 300, 1100);
  CpuGemmRunner runner(CpuGemm::kAmx);
  runner.prepare(b.w.data(), b.n, b.k);
  EXPECT_GE(runner.packed_bytes(), sizeof(uint16_t) * 300 * 1100);
  check_ms(runner, a, rng, {1, 7, 16, 17, 33, 64, 70, 7}, to_bf16, 1e-5);
  check_ms(runner, b, rng, {40, 5, 96}, to_bf16, 1e-5);
  EXPECT_LT(runner.packed_bytes(), sizeof(float) * (100 * 70 + 300 * 1100));
}

// bf16 weights (WeightRef of uint16 bits, as a checkpoint loaded with keep_bf16 gives them) in
// the bf16 modes: the same products, bit for bit, as their values widened to f32, which the
// tests above check against f64; OpenBLAS refuses them (CpuOps widens them for it instead).
TEST(CpuGemm, Bf16WeightsComputeAsTheirWidenedValues) {
  const testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  GemmData g = random_weights(rng, 100, 300);
  std::vector<uint16_t> bits(g.w.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    bits[i] = f32_to_bf16_bits(g.w[i]);
    g.w[i] = bf16_bits_to_f32(bits[i]);
  }
  int checked = 0;
  for (CpuGemm mode : {CpuGemm::kOnednn, CpuGemm::kAmx}) {
    if (!cpu_gemm_unavailable(mode).empty()) continue;
    SCOPED_TRACE(cpu_gemm_name(mode));
    CpuGemmRunner wide(mode), kept(mode);
    kept.prepare(bits.data(), g.n, g.k);
    std::normal_distribution<float> d(0.f, 1.f);
    for (int64_t m : {1, 17, 40}) {
      std::vector<float> x(static_cast<size_t>(m * g.k));
      for (float& v : x) v = d(rng);
      std::vector<float> ya(static_cast<size_t>(m * g.n), NAN), yb = ya;
      wide.linear(x.data(), g.w.data(), ya.data(), m, g.n, g.k);
      kept.linear(x.data(), bits.data(), yb.data(), m, g.n, g.k);
      for (size_t i = 0; i < ya.size(); ++i) ASSERT_EQ(ya[i], yb[i]) << "m " << m << " at " << i;
    }
    EXPECT_EQ(kept.packed_bytes(), wide.packed_bytes());
    ++checked;
  }
  CpuGemmRunner blas(CpuGemm::kOpenBlas);
  std::vector<float> x(static_cast<size_t>(g.k)), y(static_cast<size_t>(g.n));
  try {
    blas.linear(x.data(), bits.data(), y.data(), 1, g.n, g.k);
    ADD_FAILURE() << "openblas ran bf16 weights";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal) << e.what();
  }
  if (checked == 0) GTEST_SKIP() << "no bf16 GEMM mode runs here (openblas refusal checked)";
}

/// The f64 SwiGLU silu(g) * u of one element.
double swiglu_ref(float g, float u) {
  return static_cast<double>(g) / (1.0 + std::exp(-static_cast<double>(g))) * u;
}

/// gate_up [m, 2k] of normal draws scaled by `scale` (wide enough for exp's clamps).
std::vector<float> random_gate_up(std::mt19937_64& rng, int64_t m, int64_t k, float scale) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> gu(static_cast<size_t>(m * 2 * k));
  for (float& v : gu) v = d(rng);
  return gu;
}

TEST(SiluMulBf16, WithinOneBf16UlpOfTheRoundedF64SwiGlu) {
  const testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  const int64_t m = 5, k = 3000;  // k: a row of two 2048-element chunks, the second partial
  std::vector<float> gu = random_gate_up(rng, m, k, 8.f);
  // The exp clamps and the special values: large |g| (silu is g or 0), 0, NaN.
  const float specials[] = {-100.f, -88.5f, -87.f, 87.5f, 89.f, 200.f, 0.f, -0.f, NAN};
  for (size_t i = 0; i < std::size(specials); ++i) gu[i] = specials[i];
  std::vector<uint16_t> out(static_cast<size_t>(m * k));
  silu_mul_bf16(gu.data(), out.data(), m, k);
  int64_t off_by_one = 0;
  for (int64_t t = 0; t < m; ++t)
    for (int64_t i = 0; i < k; ++i) {
      const float g = gu[static_cast<size_t>(t * 2 * k + i)];
      const float u = gu[static_cast<size_t>(t * 2 * k + k + i)];
      const uint16_t got = out[static_cast<size_t>(t * k + i)];
      if (std::isnan(g)) {
        EXPECT_TRUE(std::isnan(bf16_bits_to_f32(got))) << "row " << t << " i " << i;
        continue;
      }
      const uint16_t want = f32_to_bf16_bits(static_cast<float>(swiglu_ref(g, u)));
      // Same sign and magnitude within one step of the bf16 grid (a value near a rounding
      // boundary may land on either side; the bits of same-signed bf16 values are ordered).
      // Past exp's clamp (g < -87) both are below 1e-30: zero for any sum they join.
      const int diff = std::abs(static_cast<int>(got) - static_cast<int>(want));
      const bool tiny = std::abs(bf16_bits_to_f32(got)) < 1e-30f &&
                        std::abs(bf16_bits_to_f32(want)) < 1e-30f;
      if (tiny) continue;
      ASSERT_LE(diff, 1)
          << "row " << t << " g " << g << " u " << u << ": " << bf16_bits_to_f32(got) << " vs "
          << bf16_bits_to_f32(want);
      off_by_one += diff;
    }
  // Rounding-boundary cases are rare: a systematic error (a wrong exp) would shift many.
  EXPECT_LT(off_by_one, m * k / 100) << off_by_one << " of " << m * k << " one ulp off";
}

TEST(CpuGemm, SwigluLinearFusedInBf16ModeOnly) {
  const testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  const GemmData down = random_weights(rng, 48, 72);  // [n, k]: k is the SwiGLU width
  for (CpuGemm g : {CpuGemm::kOpenBlas, CpuGemm::kOnednnF32}) {
    if (!cpu_gemm_unavailable(g).empty()) continue;
    CpuGemmRunner runner(g);
    std::vector<float> gu = random_gate_up(rng, 2, down.k, 2.f), y(2 * down.n, 7.f);
    EXPECT_FALSE(runner.swiglu_linear(gu.data(), down.w.data(), y.data(), 2, down.n, down.k))
        << cpu_gemm_name(g);
    EXPECT_EQ(y[0], 7.f) << cpu_gemm_name(g) << " wrote although it declined";
  }
  int checked = 0;
  for (CpuGemm mode : {CpuGemm::kOnednn, CpuGemm::kAmx}) {
    if (const std::string why = cpu_gemm_unavailable(mode); !why.empty()) {
      std::printf("the fused bf16 path of --cpu-gemm %s is not checked: %s\n",
                  std::string(cpu_gemm_name(mode)).c_str(), why.c_str());
      continue;
    }
    ++checked;
    SCOPED_TRACE(cpu_gemm_name(mode));
    CpuGemmRunner runner(mode);
    // M 40 and 70: padded products (64, 96 rows); 1 and 7: decode-sized; 7 again: cached.
    for (int64_t m : {1, 7, 40, 70, 7}) {
      SCOPED_TRACE(::testing::Message() << "m " << m);
      const std::vector<float> gu = random_gate_up(rng, m, down.k, 2.f);
      std::vector<float> y(static_cast<size_t>(m * down.n), NAN);
      ASSERT_TRUE(runner.swiglu_linear(gu.data(), down.w.data(), y.data(), m, down.n, down.k));
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < down.n; ++j) {
          // The operand as the reference rounds it; silu_mul_bf16 may differ by one bf16 ulp
          // (2^-8 relative) on an element, so that much of each |a w| is allowed on top of the
          // f32 accumulation.
          double ref = 0, mag = 0;
          for (int64_t i = 0; i < down.k; ++i) {
            const double a = to_bf16(static_cast<float>(
                swiglu_ref(gu[static_cast<size_t>(r * 2 * down.k + i)],
                           gu[static_cast<size_t>(r * 2 * down.k + down.k + i)])));
            const double p = a * to_bf16(down.w[static_cast<size_t>(j * down.k + i)]);
            ref += p, mag += std::abs(p);
          }
          ASSERT_NEAR(y[static_cast<size_t>(r * down.n + j)], ref,
                      (1e-5 + 1.0 / 256) * mag + 1e-6)
              << "row " << r << " col " << j;
        }
    }
  }
  if (checked == 0) GTEST_SKIP() << "no bf16 GEMM mode runs here";
}

TEST(AmxLinear, ForwardInputRefusesRowsItWasNotReadiedFor) {
  if (const std::string why = kernels::cpu::amx_linear_unavailable(); !why.empty())
    GTEST_SKIP() << why;
  const std::vector<float> w(16 * 8, 1.f);
  kernels::cpu::AmxLinear lin(w.data(), 16, 8);
  std::vector<float> y(3 * 16);
  (void)lin.input(2);
  EXPECT_THROW(lin.forward_input(y.data(), 3), Error);
  EXPECT_THROW(kernels::cpu::AmxLinear(w.data(), 0, 8), Error);
  // A bf16 input written by hand at input_ld() apart: rows of ones and twos.
  uint16_t* x = lin.input(2);
  std::fill(x, x + 8, f32_to_bf16_bits(1.f));
  std::fill(x + lin.input_ld(), x + lin.input_ld() + 8, f32_to_bf16_bits(2.f));
  lin.forward_input(y.data(), 2);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 8.f);
    EXPECT_EQ(y[16 + j], 16.f);
  }
  // The operand buffer is the thread's, shared by every AmxLinear: another matrix's input()
  // in between, or a NaN product before, must not leak in (k 40: padding columns 40..63 are
  // read by the tile loads against zero weights).
  const std::vector<float> wide_w(64 * 2048, 1.f), nan_x(4 * 2048, NAN);
  kernels::cpu::AmxLinear wide(wide_w.data(), 64, 2048);
  std::vector<float> wide_y(4 * 64);
  wide.forward(nan_x.data(), wide_y.data(), 4);
  EXPECT_TRUE(std::isnan(wide_y[0]));
  const std::vector<float> w40(16 * 40, 0.5f), x40(3 * 40, 2.f);
  kernels::cpu::AmxLinear narrow(w40.data(), 16, 40);
  std::vector<float> y40(3 * 16, NAN);
  narrow.forward(x40.data(), y40.data(), 3);
  for (float v : y40) EXPECT_EQ(v, 40.f);
  (void)wide.input(3);
  EXPECT_THROW(narrow.forward_input(y40.data(), 3), Error);  // readied by another matrix
}

TEST(OnednnLinear, ForwardInputRefusesRowsItWasNotReadiedFor) {
  if (const std::string why = cpu_gemm_unavailable(CpuGemm::kOnednnF32); !why.empty())
    GTEST_SKIP() << why;
  const std::vector<float> w(16 * 8, 1.f);
  kernels::cpu::OnednnLinear lin(w.data(), 16, 8, DType::kF32);
  std::vector<float> y(3 * 16);
  (void)lin.input(2);
  try {
    lin.forward_input(y.data(), 3);
    ADD_FAILURE() << "ran 3 rows on an input readied for 2";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
  // An f32 input written by hand: rows of ones and twos, [2, 8] · [16, 8]ᵀ of ones.
  auto* x = static_cast<float*>(lin.input(2));
  std::fill(x, x + 8, 1.f);
  std::fill(x + 8, x + 16, 2.f);
  lin.forward_input(y.data(), 2);
  EXPECT_EQ(y[0], 8.f);
  EXPECT_EQ(y[16 + 15], 16.f);
}

}  // namespace
}  // namespace pagoda::model
