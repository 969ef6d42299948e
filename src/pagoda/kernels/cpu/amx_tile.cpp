// AMX micro-kernels of the amx backend's extend (see amx_tile.h). Both products work on 32 × 32
// output blocks: four f32 accumulator tiles (tmm0-3), two A tiles (tmm4-5: 16 rows × 32 bf16) and
// two B tiles (tmm6-7: 16 pairs × 16 columns) per step of 32 along the reduction.
#include "pagoda/kernels/cpu/amx_tile.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__linux__)
#define PAGODA_AMX_TILE_X86 1
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers trip -Wuninitialized on their own _mm512_undefined_* (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#else
#define PAGODA_AMX_TILE_X86 0
#endif

namespace pagoda::kernels::cpu::detail {

#if PAGODA_AMX_TILE_X86

#define PAGODA_AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))

namespace {

constexpr AmxTileConfig kAmxTileConfig{};

/// One step of a 32 × 32 output block in tmm0-3: A tiles of 16 rows at a0 and a1 (rows `as` bytes
/// apart), B tiles at b0 and b1 (rows `bs` bytes apart); each product right after the loads it
/// needs, so the next loads overlap it.
PAGODA_AMX_TARGET inline __attribute__((always_inline)) void block_step(
    const void* a0, const void* a1, int64_t as, const void* b0, const void* b1, int64_t bs) {
  _tile_loadd(4, a0, as);
  _tile_loadd(6, b0, bs);
  _tile_dpbf16ps(0, 4, 6);
  _tile_loadd(7, b1, bs);
  _tile_dpbf16ps(1, 4, 7);
  _tile_loadd(5, a1, as);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}

/// tmm0-3 to the 32 × 32 f32 block at c (rows `cs` bytes apart, 16 columns of f32 per tile).
PAGODA_AMX_TARGET inline __attribute__((always_inline)) void store_block(float* c, int64_t cs) {
  float* c1 = reinterpret_cast<float*>(reinterpret_cast<char*>(c) + 16 * cs);
  _tile_stored(0, c, cs);
  _tile_stored(1, c + 16, cs);
  _tile_stored(2, c1, cs);
  _tile_stored(3, c1 + 16, cs);
}

}  // namespace

PAGODA_AMX_TARGET void amx_scores(const uint16_t* q, int rows, int dk, const uint32_t* kb, int n,
                                  float* s) {
  _tile_loadconfig(&kAmxTileConfig);
  const int64_t qs = int64_t{dk} * 2, group = int64_t{dk} / 2 * 16;
  for (int r = 0; r < rows; r += 32) {
    const uint16_t* q0 = q + int64_t{r} * dk;
    for (int c = 0; c < n; c += 32) {
      const uint32_t* k0 = kb + int64_t{c / 16} * group;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int e = 0; e < dk; e += 32)
        block_step(q0 + e, q0 + 16 * dk + e, qs, k0 + e / 2 * 16, k0 + group + e / 2 * 16, 64);
      store_block(s + int64_t{r} * n + c, int64_t{n} * 4);
    }
  }
  _tile_release();
}

PAGODA_AMX_TARGET void amx_pv_accumulate(const uint16_t* p, int rows, int n, const uint32_t* vb,
                                         int64_t ldv, int dv, float* acc) {
  _tile_loadconfig(&kAmxTileConfig);
  const int64_t ps = int64_t{n} * 2, as = int64_t{dv} * 4;
  for (int r = 0; r < rows; r += 32) {
    const uint16_t* p0 = p + int64_t{r} * n;
    for (int x = 0; x < dv; x += 32) {
      float* a0 = acc + int64_t{r} * dv + x;
      float* a1 = a0 + int64_t{16} * dv;
      const uint32_t* v0 = vb + int64_t{x / 16} * ldv;
      _tile_loadd(0, a0, as);
      _tile_loadd(1, a0 + 16, as);
      _tile_loadd(2, a1, as);
      _tile_loadd(3, a1 + 16, as);
      for (int j = 0; j < n; j += 32)
        block_step(p0 + j, p0 + 16 * n + j, ps, v0 + j / 2 * 16, v0 + ldv + j / 2 * 16, 64);
      store_block(a0, as);
    }
  }
  _tile_release();
}

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

PAGODA_AVX512_TARGET void amx_pack_v_pair(const uint16_t* a, const uint16_t* b, int dv,
                                          uint32_t* vb, int64_t ldv) {
  for (int c = 0; c < dv / 16; ++c) {
    const __m512i lo =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 16 * c)));
    const __m512i hi =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 * c)));
    _mm512_storeu_si512(vb + c * ldv, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
  }
}

#else  // not x86-64 Linux with GCC or Clang: never available, never called

void amx_scores(const uint16_t*, int, int, const uint32_t*, int, float*) {}
void amx_pv_accumulate(const uint16_t*, int, int, const uint32_t*, int64_t, int, float*) {}
void amx_pack_k_group(const uint16_t* const*, int, uint32_t*) {}
void amx_pack_v_pair(const uint16_t*, const uint16_t*, int, uint32_t*, int64_t) {}

#endif

}  // namespace pagoda::kernels::cpu::detail
