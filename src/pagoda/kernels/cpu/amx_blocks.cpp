// amx_blocks.h's K-group packer (a 16 x 16 u32 transpose per 32 dims, AVX-512).
#include "pagoda/kernels/cpu/amx_blocks.h"

#if PAGODA_AMX_BLOCKS_X86 && defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers trip -Wuninitialized on their own _mm512_undefined_* (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace pagoda::kernels::cpu::detail {

#if PAGODA_AMX_BLOCKS_X86

#define PAGODA_AVX512_TARGET __attribute__((target("avx512f,avx512bw")))

namespace {

/// Transposes the 16 × 16 u32 matrix in r (row i = r[i]) in place.
PAGODA_AVX512_TARGET inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // r[4q + k] now holds, per 128-bit lane L, column 4 L + k' of rows 4q..4q+3 (k' = 0, 2, 1, 3).
  for (int i = 0; i < 8; ++i) {
    const int a = (i / 4) * 8 + i % 4;
    t[i] = _mm512_shuffle_i32x4(r[a], r[a + 4], 0x88);
    t[i + 8] = _mm512_shuffle_i32x4(r[a], r[a + 4], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 4], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 4], 0xdd);
    r[i + 4] = _mm512_shuffle_i32x4(t[i + 8], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_i32x4(t[i + 8], t[i + 12], 0xdd);
  }
}

}  // namespace

PAGODA_AVX512_TARGET void amx_pack_k_group(const uint16_t* const* rows, int dk, uint32_t* kb) {
  for (int d = 0; d < dk; d += 32) {
    __m512i r[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(rows[i] + d);
    transpose16(r);
    for (int k = 0; k < 16; ++k) _mm512_storeu_si512(kb + int64_t{d / 2 + k} * 16, r[k]);
  }
}

#else  // not x86-64 Linux with GCC or Clang: never available, never called

void amx_pack_k_group(const uint16_t* const*, int, uint32_t*) {}

#endif

}  // namespace pagoda::kernels::cpu::detail
