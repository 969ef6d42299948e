// Float conversions against independent references: the compiler's _Float16 for f16, and for
// bf16 / fp8 a brute-force "nearest representable value, ties to even" search over every code.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "pagoda/core/dtype.h"
#include "pagoda/core/float_convert.h"
#include "test_seed.h"

namespace pagoda {
namespace {

// Nearest of all finite codes to x (ties -> even code), saturating, as the fp8 encoders promise.
// Compared by value, since +0 and -0 are equally near.
template <typename Decode>
uint32_t brute_force_nearest(float x, int num_codes, Decode decode) {
  double best_err = std::numeric_limits<double>::infinity();
  uint32_t best = 0;
  for (int c = 0; c < num_codes; ++c) {
    const float v = decode(static_cast<uint32_t>(c));
    if (!std::isfinite(v)) continue;
    const double err = std::fabs(static_cast<double>(v) - static_cast<double>(x));
    if (err < best_err || (err == best_err && (c & 1) == 0 && (best & 1) == 1)) {
      best_err = err;
      best = static_cast<uint32_t>(c);
    }
  }
  return best;
}

TEST(DType, NamesRoundTrip) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kFp8E4M3, DType::kFp8E5M2,
                  DType::kI32, DType::kI64, DType::kU8}) {
    auto parsed = parse_dtype(dtype_name(t));
    ASSERT_TRUE(parsed.has_value()) << dtype_name(t);
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_FALSE(parse_dtype("f33").has_value());
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kFp8E4M3), 1u);
}

TEST(FloatConvert, F16MatchesCompiler) {
  const testing::TestSeed seed(testing::process_seed());
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    float x = std::bit_cast<float>(bits(rng));
    if (std::isnan(x)) continue;
    const _Float16 h = static_cast<_Float16>(x);
    const uint16_t expect = std::bit_cast<uint16_t>(h);
    ASSERT_EQ(f32_to_f16_bits(x), expect) << "x=" << x;
  }
  for (uint32_t c = 0; c < 65536; ++c) {
    const _Float16 h = std::bit_cast<_Float16>(static_cast<uint16_t>(c));
    const float expect = static_cast<float>(h);
    const float got = f16_bits_to_f32(static_cast<uint16_t>(c));
    if (std::isnan(expect)) {
      ASSERT_TRUE(std::isnan(got));
    } else {
      ASSERT_EQ(got, expect) << "code " << c;
    }
  }
}

TEST(FloatConvert, Bf16RoundsToNearestEven) {
  const testing::TestSeed seed(testing::process_seed());
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1000.f, 1000.f);
  for (int i = 0; i < 100000; ++i) {
    const float x = u(rng);
    const uint16_t b = f32_to_bf16_bits(x);
    const float y = bf16_bits_to_f32(b);
    // The neighbours one ulp up and down in magnitude must not be closer (±0 has no neighbour
    // below it in magnitude: b - 1 would be a NaN pattern; the draw can be exactly 0).
    const float up = bf16_bits_to_f32(static_cast<uint16_t>(b + 1));
    ASSERT_LE(std::fabs(y - x), std::fabs(up - x)) << "x=" << x;
    if ((b & 0x7FFF) != 0) {
      const float dn = bf16_bits_to_f32(static_cast<uint16_t>(b - 1));
      ASSERT_LE(std::fabs(y - x), std::fabs(dn - x)) << "x=" << x;
    }
  }
  EXPECT_TRUE(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(std::nanf("")))));
  EXPECT_TRUE(std::isinf(bf16_bits_to_f32(f32_to_bf16_bits(3.4e38f * 10))));
}

TEST(FloatConvert, Fp8E4M3NearestSaturating) {
  const testing::TestSeed seed(testing::process_seed());
  std::mt19937 rng(seed);
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7F)));
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  std::uniform_real_distribution<float> u(-600.f, 600.f);
  std::uniform_real_distribution<float> small(-0.02f, 0.02f);
  auto decode = [](uint32_t c) { return e4m3_to_f32(static_cast<uint8_t>(c)); };
  for (int i = 0; i < 20000; ++i) {
    const float x = (i % 2) ? u(rng) : small(rng);
    ASSERT_EQ(decode(f32_to_e4m3(x)), decode(brute_force_nearest(x, 256, decode))) << "x=" << x;
  }
  for (int c = 0; c < 256; ++c) {
    if (std::isnan(decode(c))) continue;
    ASSERT_EQ(f32_to_e4m3(decode(c)), c == 0x80 ? 0x80 : c) << c;
  }
  EXPECT_EQ(f32_to_e4m3(1e9f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(-INFINITY), 0xFE);
}

TEST(FloatConvert, Fp8E5M2NearestSaturating) {
  const testing::TestSeed seed(testing::process_seed());
  std::mt19937 rng(seed);
  EXPECT_EQ(e5m2_to_f32(0x7B), 57344.0f);
  EXPECT_TRUE(std::isinf(e5m2_to_f32(0x7C)));
  auto decode = [](uint32_t c) { return e5m2_to_f32(static_cast<uint8_t>(c)); };
  std::uniform_real_distribution<float> u(-70000.f, 70000.f);
  std::uniform_real_distribution<float> small(-0.001f, 0.001f);
  for (int i = 0; i < 20000; ++i) {
    const float x = (i % 2) ? u(rng) : small(rng);
    ASSERT_EQ(decode(f32_to_e5m2(x)), decode(brute_force_nearest(x, 256, decode))) << "x=" << x;
  }
}

TEST(FloatConvert, ReadWriteGeneric) {
  unsigned char buf[16] = {};
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kFp8E4M3, DType::kFp8E5M2}) {
    write_from_f32(buf, t, 1, 1.5f);
    EXPECT_EQ(read_as_f32(buf, t, 1), 1.5f) << dtype_name(t);
  }
}

}  // namespace
}  // namespace pagoda
