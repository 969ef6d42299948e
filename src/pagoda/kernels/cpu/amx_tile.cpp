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

#include "pagoda/kernels/cpu/amx_blocks.h"

namespace pagoda::kernels::cpu::detail {

#if PAGODA_AMX_TILE_X86

#define PAGODA_AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))

namespace {

constexpr AmxTileConfig kAmxTileConfig{};

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
        amx_block_step(q0 + e, q0 + 16 * dk + e, qs, k0 + e / 2 * 16, k0 + group + e / 2 * 16, 64);
      amx_store_block(s + int64_t{r} * n + c, int64_t{n} * 4);
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
      const uint32_t* v0 = vb + int64_t{x / 16} * ldv;
      amx_load_block(a0, as);
      for (int j = 0; j < n; j += 32)
        amx_block_step(p0 + j, p0 + 16 * n + j, ps, v0 + j / 2 * 16, v0 + ldv + j / 2 * 16, 64);
      amx_store_block(a0, as);
    }
  }
  _tile_release();
}

#define PAGODA_AVX512_TARGET __attribute__((target("avx512f,avx512bw")))

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
void amx_pack_v_pair(const uint16_t*, const uint16_t*, int, uint32_t*, int64_t) {}

#endif

}  // namespace pagoda::kernels::cpu::detail
