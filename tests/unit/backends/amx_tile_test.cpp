// kernels/cpu/amx_tile.h against double-precision products written here, on random bf16 values:
// the two packers (K groups of 16 keys, V key pairs by 16-column blocks) element by element,
// then S = Q·Kᵀ and acc += P·V over a key range that starts inside the packed buffers. Skipped
// (with the reason printed) on CPUs without AMX.
#include "pagoda/kernels/cpu/amx_tile.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "pagoda/core/float_convert.h"
#include "test_seed.h"

namespace pagoda::kernels::cpu::detail {
namespace {

TEST(AmxTile, PackedProductsMatchDouble) {
  if (!amx_tiles_available()) GTEST_SKIP() << "this CPU (or OS) offers no AMX bf16 tiles";
  const testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> val(-1.f, 1.f);
  const int rows = 64, dk = 96, dv = 64, keys = 128, j0 = 32, n = 64;
  auto fill = [&](size_t count) {
    std::vector<uint16_t> x(count);
    for (uint16_t& b : x) b = f32_to_bf16_bits(val(rng));
    return x;
  };
  const std::vector<uint16_t> q = fill(size_t{rows} * dk), k = fill(size_t{keys} * dk),
                              v = fill(size_t{keys} * dv), p = fill(size_t{rows} * n);
  // K: one group per 16 keys.
  std::vector<uint32_t> kb(size_t{keys} * dk / 2);
  for (int g = 0; g < keys; g += 16) {
    const uint16_t* rows16[16];
    for (int i = 0; i < 16; ++i) rows16[i] = k.data() + size_t(g + i) * dk;
    amx_pack_k_group(rows16, dk, kb.data() + size_t(g) * dk / 2);
  }
  for (int j = 0; j < keys; ++j)
    for (int d2 = 0; d2 < dk / 2; ++d2)
      ASSERT_EQ(kb[(size_t(j / 16) * (dk / 2) + d2) * 16 + j % 16],
                k[size_t(j) * dk + 2 * d2] | uint32_t{k[size_t(j) * dk + 2 * d2 + 1]} << 16)
          << "key " << j << " pair " << d2;
  // V: column blocks ldv pairs apart.
  const int64_t ldv = int64_t{keys} / 2 * 16;
  std::vector<uint32_t> vb(size_t(dv / 16) * ldv);
  for (int j2 = 0; j2 < keys / 2; ++j2)
    amx_pack_v_pair(v.data() + size_t(2 * j2) * dv, v.data() + size_t(2 * j2 + 1) * dv, dv,
                    vb.data() + size_t(j2) * 16, ldv);
  for (int j = 0; j < keys; ++j)
    for (int x = 0; x < dv; ++x) {
      const uint32_t pair = vb[size_t(x / 16) * ldv + size_t(j / 2) * 16 + x % 16];
      ASSERT_EQ(j % 2 == 0 ? pair & 0xFFFF : pair >> 16, v[size_t(j) * dv + x])
          << "key " << j << " column " << x;
    }
  // S over keys [j0, j0 + n).
  std::vector<float> s(size_t{rows} * n);
  amx_scores(q.data(), rows, dk, kb.data() + size_t(j0) * dk / 2, n, s.data());
  double worst = 0;
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < n; ++j) {
      double want = 0;
      for (int d = 0; d < dk; ++d)
        want += double{bf16_bits_to_f32(q[size_t(r) * dk + d])} *
                bf16_bits_to_f32(k[size_t(j0 + j) * dk + d]);
      worst = std::max(worst, std::abs(want - s[size_t(r) * n + j]));
    }
  EXPECT_LT(worst, 1e-4) << "scores";  // exact products, f32 sums of 96 terms below 1
  // acc += P·V over the same keys, onto a non-zero accumulator.
  std::vector<float> acc(size_t{rows} * dv);
  for (float& a : acc) a = val(rng);
  const std::vector<float> acc0 = acc;
  amx_pv_accumulate(p.data(), rows, n, vb.data() + size_t(j0 / 2) * 16, ldv, dv, acc.data());
  worst = 0;
  for (int r = 0; r < rows; ++r)
    for (int x = 0; x < dv; ++x) {
      double want = acc0[size_t(r) * dv + x];
      for (int j = 0; j < n; ++j)
        want += double{bf16_bits_to_f32(p[size_t(r) * n + j])} *
                bf16_bits_to_f32(v[size_t(j0 + j) * dv + x]);
      worst = std::max(worst, std::abs(want - acc[size_t(r) * dv + x]));
    }
  EXPECT_LT(worst, 1e-4) << "P·V";
}

}  // namespace
}  // namespace pagoda::kernels::cpu::detail
