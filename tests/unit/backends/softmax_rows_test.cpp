// kernels/cpu/softmax_rows.h against a double-precision softmax written here: random scores over
// several key blocks (partial and empty visible ranges, -inf scores, a fully masked row, a block
// that raises a row's max past the lazy margin), P checked entry by entry, then the output and the
// base-2 LSE the blocks add up to; scale_row_to against core's scalar converters.
#include "pagoda/kernels/cpu/softmax_rows.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "pagoda/core/float_convert.h"
#include "test_seed.h"

namespace pagoda::kernels::cpu {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

float p_at(const std::vector<uint16_t>& p16, const std::vector<float>& p32, DType t, size_t i) {
  return t == DType::kBF16 ? bf16_bits_to_f32(p16[i]) : p32[i];
}

TEST(SoftmaxRows, BlocksAddUpToTheDoubleSoftmax) {
  const testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> score(0.f, 3.f);
  std::uniform_real_distribution<float> val(-1.f, 1.f);
  const int rows = 9, n = 48, blocks = 4, dv = 5;
  const float scale = 0.37f;
  const double c = double{scale} / std::log(2.0);  // base-2 units per raw score
  for (DType t : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(dtype_name(t));
    // Scores and visibility per (block, row); row 0 sees nothing, row 1's first block holds only
    // -inf scores, block 2 lifts rows 2..4 by 40 (past the lazy margin: a rescale).
    std::vector<float> s(static_cast<size_t>(blocks) * rows * n);
    std::vector<int32_t> vis(static_cast<size_t>(blocks) * rows);
    std::uniform_int_distribution<int> count(0, n);
    for (int k = 0; k < blocks; ++k)
      for (int r = 0; r < rows; ++r) {
        const size_t at = static_cast<size_t>(k) * rows + r;
        vis[at] = r == 0 ? 0 : (r == 5 ? n : count(rng));
        for (int j = 0; j < n; ++j) {
          float x = score(rng) + (k == 2 && r >= 2 && r <= 4 ? 40.f : 0.f);
          if ((r == 1 && k == 0) || (r == 6 && j % 7 == 0))
            x = -std::numeric_limits<float>::infinity();
          s[at * n + static_cast<size_t>(j)] = x;
        }
      }
    std::vector<float> v(static_cast<size_t>(blocks) * n * dv);
    for (float& x : v) x = val(rng);
    std::vector<float> m(rows, -std::numeric_limits<float>::infinity()), l(rows, 0.f);
    std::vector<float> acc(static_cast<size_t>(rows) * dv, 0.f), p32(static_cast<size_t>(rows) * n);
    std::vector<uint16_t> p16(p32.size());
    for (int k = 0; k < blocks; ++k) {
      const float* sk = s.data() + static_cast<size_t>(k) * rows * n;
      softmax_rows_block({.s = sk,
                          .rows = rows,
                          .n = n,
                          .visible = vis.data() + k * rows,
                          .scale = scale,
                          .m = m.data(),
                          .l = l.data(),
                          .p_dtype = t,
                          .p = t == DType::kBF16 ? static_cast<void*>(p16.data()) : p32.data(),
                          .acc = acc.data(),
                          .dv = dv});
      for (int r = 0; r < rows; ++r) {
        const int vr = vis[static_cast<size_t>(k) * rows + r];
        for (int j = 0; j < n; ++j) {
          const size_t i = static_cast<size_t>(r) * n + j;
          const float got = p_at(p16, p32, t, i);
          const double x = c * sk[i];
          const double want =
              j < vr && m[r] != -std::numeric_limits<float>::infinity() ? std::exp2(x - m[r]) : 0.0;
          ASSERT_NEAR(got, want, want * 0x1p-8 + 1e-30)
              << "block " << k << " row " << r << " key " << j;
          ASSERT_EQ(got, bf16_bits_to_f32(f32_to_bf16_bits(got))) << "P is bf16-exact";
        }
      }
      // The P·V the backend's matmul adds (in double here) on top of the rescaled acc.
      for (int r = 0; r < rows; ++r)
        for (int x = 0; x < dv; ++x) {
          double add = 0;
          for (int j = 0; j < n; ++j)
            add += double{p_at(p16, p32, t, static_cast<size_t>(r) * n + j)} *
                   v[(static_cast<size_t>(k) * n + j) * dv + x];
          acc[static_cast<size_t>(r) * dv + x] += static_cast<float>(add);
        }
    }
    for (int r = 0; r < rows; ++r) {
      SCOPED_TRACE(::testing::Message() << "row " << r);
      double mx = -kInf;
      for (int k = 0; k < blocks; ++k)
        for (int j = 0; j < vis[static_cast<size_t>(k) * rows + r]; ++j)
          mx = std::max(mx, c * s[(static_cast<size_t>(k) * rows + r) * n + j]);
      if (mx == -kInf) {  // nothing visible (row 0) or only -inf scores
        EXPECT_EQ(l[r], 0.f);
        EXPECT_EQ(m[r], -std::numeric_limits<float>::infinity());
        for (int x = 0; x < dv; ++x) EXPECT_EQ(acc[static_cast<size_t>(r) * dv + x], 0.f);
        continue;
      }
      double sum = 0;
      std::vector<double> o(dv, 0.0);
      for (int k = 0; k < blocks; ++k)
        for (int j = 0; j < vis[static_cast<size_t>(k) * rows + r]; ++j) {
          const double p = std::exp2(c * s[(static_cast<size_t>(k) * rows + r) * n + j] - mx);
          sum += p;
          for (int x = 0; x < dv; ++x) o[x] += p * v[(static_cast<size_t>(k) * n + j) * dv + x];
        }
      EXPECT_NEAR(m[r] + std::log2(double{l[r]}), mx + std::log2(sum), 2e-6 * (1 + std::abs(mx)));
      for (int x = 0; x < dv; ++x)
        EXPECT_NEAR(acc[static_cast<size_t>(r) * dv + x] / l[r], o[x] / sum, 4e-3);
    }
    EXPECT_EQ(l[0], 0.f);
  }
}

TEST(SoftmaxRows, ScaleRowToMatchesTheScalarConverters) {
  const testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> val(0.f, 100.f);
  const int n = 37;  // whole vectors and a scalar tail
  std::vector<float> src(n);
  for (float& x : src) x = val(rng);
  src[3] = std::numeric_limits<float>::quiet_NaN();
  src[n - 1] = std::numeric_limits<float>::infinity();
  const float factor = 0.013f;
  std::vector<float> f32(n);
  std::vector<uint16_t> b16(n);
  scale_row_to(src.data(), n, factor, f32.data(), DType::kF32);
  scale_row_to(src.data(), n, factor, b16.data(), DType::kBF16);
  for (int i = 0; i < n; ++i) {
    const float want = src[i] * factor;
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f32[i]));
      EXPECT_TRUE(std::isnan(bf16_bits_to_f32(b16[i])));
      continue;
    }
    EXPECT_EQ(f32[i], want) << i;
    EXPECT_EQ(b16[i], f32_to_bf16_bits(want)) << i;
  }
}

}  // namespace
}  // namespace pagoda::kernels::cpu
