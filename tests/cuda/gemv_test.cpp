/// small_m_gemm (model/cuda/gemv_kernels.h) against a host f64 reference on random data (the seed
/// is printed; PAGODA_TEST_SEED overrides it), at the projection shapes of the Llama-3.2-1B and
/// Llama-3-8B layouts plus odd shapes (n not a multiple of the block's rows, k tails), m = 1, 3, 8
/// (and 2, 5, 13, 16 on the odd shapes), bf16 and f16. Outputs are NaN-poisoned before every launch
/// and a poisoned guard after y must stay untouched.
///
/// Tolerance, with scale(i, j) = max(|ref(i, j)|, rms_j ref(i, :)) (the row's scale):
///   dtype output: |gpu - ref| <= 1e-2 * scale  (one bf16 rounding is <= 2^-9 |ref|; the f32
///                 accumulation and the fast-intrinsic SwiGLU add < 1e-5 of the scale)
///   f32 output:   |gpu - ref| <= 2e-3 * scale
/// Label "gpu": needs a GPU (skips without one).

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "gpu_test_common.h"
#include "pagoda/core/float_convert.h"
#include "pagoda/model/cuda/gemv_kernels.h"

namespace pagoda::model::cuda_kernels {
namespace {

using ::pagoda::gpu_test::have_gpu;
using ::pagoda::gpu_test::test_seed;
#define REQUIRE_GPU() PAGODA_REQUIRE_GPU()

const char* name(ActDType t) { return t == ActDType::kF16 ? "f16" : "bf16"; }

/// Device buffer of `bytes` (+ a guard) filled with 0xFF bytes (NaN in f32, f16 and bf16).
struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t n) : bytes(n) { EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 16)), cudaSuccess); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

/// xorshift64 stream, fast enough for the 262M-element LM head.
struct Rng {
  uint64_t s;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  /// Uniform in [-a, a).
  float uni(float a) { return a * (static_cast<float>(next() >> 40) * 0x1p-23f - 1.f); }
};

/// Random `dtype` values (16-bit codes) and their exact f32 values.
struct Mat {
  std::vector<uint16_t> bits;
  std::vector<float> v;
};

Mat random_mat(ActDType t, size_t n, Rng& rng, float a) {
  Mat m{std::vector<uint16_t>(n), std::vector<float>(n)};
  for (size_t i = 0; i < n; ++i) {
    const float x = rng.uni(a);
    if (t == ActDType::kBF16) {
      m.bits[i] = f32_to_bf16_bits(x);
      m.v[i] = bf16_bits_to_f32(m.bits[i]);
    } else {
      m.bits[i] = f32_to_f16_bits(x);
      m.v[i] = f16_bits_to_f32(m.bits[i]);
    }
  }
  return m;
}

struct Shape {
  int64_t k, n;
  bool swiglu, f32_out;
};

/// Runs one problem and compares; w (device and host) is shared by the m values of a shape.
void run_case(ActDType t, const Shape& s, int64_t m, const Mat& w, const void* d_w, Rng& rng) {
  SCOPED_TRACE(::testing::Message() << name(t) << " k " << s.k << " n " << s.n << " m " << m
                                  << (s.swiglu ? " swiglu" : "") << (s.f32_out ? " f32_out" : ""));
  ASSERT_TRUE(small_m_gemm_supported(t, m, s.n, s.k));
  const int64_t xk = s.swiglu ? 2 * s.k : s.k;
  const Mat x = random_mat(t, static_cast<size_t>(m * xk), rng, 2.f);
  Dev d_x(x.bits.size() * 2);
  ASSERT_EQ(cudaMemcpy(d_x.p, x.bits.data(), d_x.bytes, cudaMemcpyHostToDevice), cudaSuccess);
  const size_t out_elem = s.f32_out ? 4 : 2;
  const size_t guard = 256;
  Dev d_y(static_cast<size_t>(m * s.n) * out_elem + guard);
  ASSERT_EQ(cudaMemset(d_y.p, 0xFF, d_y.bytes), cudaSuccess);
  ASSERT_EQ(small_m_gemm(t, d_x.p, d_w, d_y.p, s.f32_out, s.swiglu, m, s.n, s.k, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<unsigned char> out(d_y.bytes);
  ASSERT_EQ(cudaMemcpy(out.data(), d_y.p, d_y.bytes, cudaMemcpyDeviceToHost), cudaSuccess);

  // Guard after y untouched.
  int64_t guard_bad = 0;
  for (size_t b = out.size() - guard; b < out.size(); ++b) guard_bad += out[b] != 0xFF;
  EXPECT_EQ(guard_bad, 0) << "bytes written past y";

  // Host reference in f64.
  std::vector<double> a(static_cast<size_t>(m * s.k));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t l = 0; l < s.k; ++l) {
      if (s.swiglu) {
        const double g = x.v[i * xk + l], u = x.v[i * xk + s.k + l];
        a[i * s.k + l] = g / (1.0 + std::exp(-g)) * u;
      } else {
        a[i * s.k + l] = x.v[i * xk + l];
      }
    }
  std::vector<double> ref(static_cast<size_t>(m * s.n));
  for (int64_t j = 0; j < s.n; ++j) {
    const float* wr = w.v.data() + j * s.k;
    for (int64_t i = 0; i < m; ++i) {
      const double* ar = a.data() + i * s.k;
      double acc = 0;
      for (int64_t l = 0; l < s.k; ++l) acc += ar[l] * wr[l];
      ref[i * s.n + j] = acc;
    }
  }
  const double rel = s.f32_out ? 2e-3 : 1e-2;
  int64_t bad = 0, nan = 0;
  double worst = 0;
  for (int64_t i = 0; i < m; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < s.n; ++j) ss += ref[i * s.n + j] * ref[i * s.n + j];
    const double rms = std::sqrt(ss / double(s.n));
    for (int64_t j = 0; j < s.n; ++j) {
      const size_t idx = static_cast<size_t>(i * s.n + j);
      double got;
      if (s.f32_out) {
        float f;
        std::memcpy(&f, out.data() + idx * 4, 4);
        got = f;
      } else {
        uint16_t b;
        std::memcpy(&b, out.data() + idx * 2, 2);
        got = t == ActDType::kBF16 ? bf16_bits_to_f32(b) : f16_bits_to_f32(b);
      }
      const double r = ref[idx];
      if (std::isnan(got)) {
        if (nan++ < 3) ADD_FAILURE() << "NaN at row " << i << " col " << j << " (ref " << r << ")";
        continue;
      }
      const double tol = rel * std::max(std::fabs(r), rms);
      const double err = std::fabs(got - r);
      worst = std::max(worst, err / std::max(tol, 1e-300));
      if (err > tol && bad++ < 5)
        ADD_FAILURE() << "row " << i << " col " << j << " got " << got << " ref " << r
                      << " |err| " << err << " > tol " << tol;
    }
  }
  EXPECT_EQ(bad + nan, 0) << "worst err/tol " << worst;
}

void run_shapes(const std::vector<Shape>& shapes, const std::vector<int64_t>& ms, uint64_t seed) {
  Rng rng{seed * 0x9E3779B97F4A7C15ull + 1};
  for (ActDType t : {ActDType::kBF16, ActDType::kF16}) {
    for (const Shape& s : shapes) {
      const Mat w = random_mat(t, static_cast<size_t>(s.n * s.k), rng, 1.f);
      Dev d_w(w.bits.size() * 2);
      ASSERT_EQ(cudaMemcpy(d_w.p, w.bits.data(), d_w.bytes, cudaMemcpyHostToDevice), cudaSuccess);
      for (int64_t m : ms) run_case(t, s, m, w, d_w.p, rng);
    }
  }
}

TEST(SmallMGemm, ModelShapesMatchHost) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed(8101);
  std::cout << "seed " << seed << "\n";
  // Llama-3.2-1B (hidden 2048, inter 8192, vocab 128256) and Llama-3-8B (4096, 14336).
  const std::vector<Shape> shapes = {
      {2048, 3072, false, false},   {2048, 2048, false, false},  {2048, 16384, false, false},
      {8192, 2048, true, false},    {2048, 128256, false, true}, {4096, 6144, false, false},
      {14336, 4096, true, false},
  };
  run_shapes(shapes, {1, 3, 8}, seed);
}

TEST(SmallMGemmOdd, OddShapesMatchHost) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed(8102);
  std::cout << "seed " << seed << "\n";
  // n not a multiple of any block's rows; k with a tail of the unrolled loop (chunks not a
  // multiple of 32 lanes or of the unroll); tiny k; f32 and swiglu combinations.
  const std::vector<Shape> shapes = {
      {8, 5, false, false},       {24, 3, true, true},        {520, 1001, false, false},
      {2056, 777, true, false},   {4104, 333, false, true},   {72, 4099, true, true},
      {16392, 61, false, false},
  };
  run_shapes(shapes, {1, 2, 3, 5, 8, 13, 16}, seed);
}

TEST(SmallMGemm, Deterministic) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed(8103);
  std::cout << "seed " << seed << "\n";
  Rng rng{seed};
  const int64_t m = 8, n = 2048, k = 8192;
  const Mat w = random_mat(ActDType::kBF16, size_t(n * k), rng, 1.f);
  const Mat x = random_mat(ActDType::kBF16, size_t(m * 2 * k), rng, 2.f);
  Dev d_w(w.bits.size() * 2), d_x(x.bits.size() * 2), d_y(size_t(m * n) * 4);
  ASSERT_EQ(cudaMemcpy(d_w.p, w.bits.data(), d_w.bytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_x.p, x.bits.data(), d_x.bytes, cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<unsigned char> first;
  for (int rep = 0; rep < 3; ++rep) {
    ASSERT_EQ(cudaMemset(d_y.p, 0xFF, d_y.bytes), cudaSuccess);
    ASSERT_EQ(small_m_gemm(ActDType::kBF16, d_x.p, d_w.p, d_y.p, true, true, m, n, k, nullptr),
              cudaSuccess);
    std::vector<unsigned char> out(d_y.bytes);
    ASSERT_EQ(cudaMemcpy(out.data(), d_y.p, d_y.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    if (rep == 0)
      first = out;
    else
      EXPECT_EQ(std::memcmp(first.data(), out.data(), out.size()), 0) << "run " << rep;
  }
}

TEST(SmallMGemm, RejectsUnsupported) {
  EXPECT_FALSE(small_m_gemm_supported(ActDType::kF32, 1, 16, 16));
  EXPECT_FALSE(small_m_gemm_supported(ActDType::kBF16, 0, 16, 16));
  EXPECT_FALSE(small_m_gemm_supported(ActDType::kBF16, kSmallMGemmMaxRows + 1, 16, 16));
  EXPECT_FALSE(small_m_gemm_supported(ActDType::kBF16, 1, 0, 16));
  EXPECT_FALSE(small_m_gemm_supported(ActDType::kBF16, 1, 16, 12));
  EXPECT_TRUE(small_m_gemm_supported(ActDType::kF16, kSmallMGemmMaxRows, 1, 8));
  // Rejected before any CUDA call: unsupported shape, misaligned pointers.
  alignas(16) static unsigned char buf[64];
  EXPECT_EQ(small_m_gemm(ActDType::kBF16, buf, buf, buf, false, false, 1, 1, 12, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(small_m_gemm(ActDType::kBF16, buf + 2, buf, buf, false, false, 1, 1, 8, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(small_m_gemm(ActDType::kBF16, buf, buf + 8, buf, false, false, 1, 1, 8, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace pagoda::model::cuda_kernels
