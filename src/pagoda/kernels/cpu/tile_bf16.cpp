// AVX512-BF16 register-blocked micro-kernels of the extend tile path (see tile_bf16.h). Rows of
// the query tile live in vector lanes (16 per register); keys (scores) and output columns (P·V)
// are broadcast from memory as bf16 pairs, so K and V rows are consumed without a transpose.
#include "pagoda/kernels/cpu/tile_bf16.h"

#include <cstdlib>
#include <cstring>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define PAGODA_TILE_BF16_X86 1
#include <immintrin.h>
#else
#define PAGODA_TILE_BF16_X86 0
#endif

namespace pagoda::kernels::cpu::detail {

#if PAGODA_TILE_BF16_X86

#define PAGODA_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace {

PAGODA_BF16_TARGET inline __m512bh as_bh(__m512i v) { return (__m512bh)v; }  // NOLINT: same-size cast

/// KB keys x C row vectors of scores; 6 x 4 = 24 accumulators stay in registers.
template <int KB, int C>
PAGODA_BF16_TARGET void scores_block(const uint32_t* const* kr, const uint32_t* qt, int dq2, int ld,
                                     float scale, float* st) {
  __m512 acc[KB][C];
  for (int k = 0; k < KB; ++k)
    for (int c = 0; c < C; ++c) acc[k][c] = _mm512_setzero_ps();
  for (int d2 = 0; d2 < dq2; ++d2) {
    __m512i q[C];
    for (int c = 0; c < C; ++c) q[c] = _mm512_loadu_si512(qt + static_cast<int64_t>(d2) * ld + 16 * c);
    for (int k = 0; k < KB; ++k) {
      const __m512i kb = _mm512_set1_epi32(static_cast<int>(kr[k][d2]));
      for (int c = 0; c < C; ++c) acc[k][c] = _mm512_dpbf16_ps(acc[k][c], as_bh(kb), as_bh(q[c]));
    }
  }
  const __m512 vs = _mm512_set1_ps(scale);
  for (int k = 0; k < KB; ++k)
    for (int c = 0; c < C; ++c)
      _mm512_storeu_ps(st + static_cast<int64_t>(k) * ld + 16 * c, _mm512_mul_ps(vs, acc[k][c]));
}

template <int C>
PAGODA_BF16_TARGET void scores_cols(const uint32_t* const* krows, int n, const uint32_t* qt, int dq2,
                                    int ld, float scale, float* st) {
  int j = 0;
  for (; j + 6 <= n; j += 6) scores_block<6, C>(krows + j, qt, dq2, ld, scale, st + static_cast<int64_t>(j) * ld);
  float* s = st + static_cast<int64_t>(j) * ld;
  switch (n - j) {
    case 5: scores_block<5, C>(krows + j, qt, dq2, ld, scale, s); break;
    case 4: scores_block<4, C>(krows + j, qt, dq2, ld, scale, s); break;
    case 3: scores_block<3, C>(krows + j, qt, dq2, ld, scale, s); break;
    case 2: scores_block<2, C>(krows + j, qt, dq2, ld, scale, s); break;
    case 1: scores_block<1, C>(krows + j, qt, dq2, ld, scale, s); break;
    default: break;
  }
}

/// XB output columns x C row vectors; the accumulators are the transposed output itself.
template <int XB, int C>
PAGODA_BF16_TARGET void pv_block(const uint32_t* pt, const uint32_t* vpk, int np, int dv, int ld,
                                 float* ot) {
  __m512 acc[XB][C];
  for (int i = 0; i < XB; ++i)
    for (int c = 0; c < C; ++c) acc[i][c] = _mm512_loadu_ps(ot + static_cast<int64_t>(i) * ld + 16 * c);
  for (int j2 = 0; j2 < np; ++j2) {
    __m512i pv[C];
    for (int c = 0; c < C; ++c) pv[c] = _mm512_loadu_si512(pt + static_cast<int64_t>(j2) * ld + 16 * c);
    const uint32_t* v = vpk + static_cast<int64_t>(j2) * dv;
    for (int i = 0; i < XB; ++i) {
      const __m512i vb = _mm512_set1_epi32(static_cast<int>(v[i]));
      for (int c = 0; c < C; ++c) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], as_bh(vb), as_bh(pv[c]));
    }
  }
  for (int i = 0; i < XB; ++i)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(ot + static_cast<int64_t>(i) * ld + 16 * c, acc[i][c]);
}

template <int C>
PAGODA_BF16_TARGET void pv_cols(const uint32_t* pt, const uint32_t* vpk, int np, int dv, int ld,
                                float* ot) {
  int x = 0;
  for (; x + 6 <= dv; x += 6) pv_block<6, C>(pt, vpk + x, np, dv, ld, ot + static_cast<int64_t>(x) * ld);
  float* o = ot + static_cast<int64_t>(x) * ld;
  switch (dv - x) {
    case 5: pv_block<5, C>(pt, vpk + x, np, dv, ld, o); break;
    case 4: pv_block<4, C>(pt, vpk + x, np, dv, ld, o); break;
    case 3: pv_block<3, C>(pt, vpk + x, np, dv, ld, o); break;
    case 2: pv_block<2, C>(pt, vpk + x, np, dv, ld, o); break;
    case 1: pv_block<1, C>(pt, vpk + x, np, dv, ld, o); break;
    default: break;
  }
}

/// f32 variant of pv_block: one key per step, values broadcast as f32.
template <int XB, int C>
PAGODA_BF16_TARGET void pv_block_f32(const float* pf, const float* vf, int n, int dv, int ld,
                                     float* ot) {
  __m512 acc[XB][C];
  for (int i = 0; i < XB; ++i)
    for (int c = 0; c < C; ++c) acc[i][c] = _mm512_loadu_ps(ot + static_cast<int64_t>(i) * ld + 16 * c);
  for (int j = 0; j < n; ++j) {
    __m512 pv[C];
    for (int c = 0; c < C; ++c) pv[c] = _mm512_loadu_ps(pf + static_cast<int64_t>(j) * ld + 16 * c);
    const float* v = vf + static_cast<int64_t>(j) * dv;
    for (int i = 0; i < XB; ++i) {
      const __m512 vb = _mm512_set1_ps(v[i]);
      for (int c = 0; c < C; ++c) acc[i][c] = _mm512_fmadd_ps(vb, pv[c], acc[i][c]);
    }
  }
  for (int i = 0; i < XB; ++i)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(ot + static_cast<int64_t>(i) * ld + 16 * c, acc[i][c]);
}

template <int C>
PAGODA_BF16_TARGET void pv_cols_f32(const float* pf, const float* vf, int n, int dv, int ld,
                                    float* ot) {
  int x = 0;
  for (; x + 6 <= dv; x += 6) pv_block_f32<6, C>(pf, vf + x, n, dv, ld, ot + static_cast<int64_t>(x) * ld);
  float* o = ot + static_cast<int64_t>(x) * ld;
  switch (dv - x) {
    case 5: pv_block_f32<5, C>(pf, vf + x, n, dv, ld, o); break;
    case 4: pv_block_f32<4, C>(pf, vf + x, n, dv, ld, o); break;
    case 3: pv_block_f32<3, C>(pf, vf + x, n, dv, ld, o); break;
    case 2: pv_block_f32<2, C>(pf, vf + x, n, dv, ld, o); break;
    case 1: pv_block_f32<1, C>(pf, vf + x, n, dv, ld, o); break;
    default: break;
  }
}

bool detect() {
  const char* env = std::getenv("PAGODA_CPU_BF16");
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bf16");
}

}  // namespace

bool cpu_avx512bf16_available() {
  static const bool ok = detect();
  return ok;
}

void tile_scores_bf16(const uint32_t* const* krows, int n, const uint32_t* qt, int dq2, int ld,
                      int nrv, float scale, float* st) {
  // Row vectors in groups of four (64 rows), then the remainder.
  int c = 0;
  for (; c + 4 <= nrv; c += 4) scores_cols<4>(krows, n, qt + 16 * c, dq2, ld, scale, st + 16 * c);
  switch (nrv - c) {
    case 3: scores_cols<3>(krows, n, qt + 16 * c, dq2, ld, scale, st + 16 * c); break;
    case 2: scores_cols<2>(krows, n, qt + 16 * c, dq2, ld, scale, st + 16 * c); break;
    case 1: scores_cols<1>(krows, n, qt + 16 * c, dq2, ld, scale, st + 16 * c); break;
    default: break;
  }
}

void tile_pv_bf16(const uint32_t* pt, const uint32_t* vpk, int np, int dv, int ld, int nrv,
                  float* ot) {
  int c = 0;
  for (; c + 4 <= nrv; c += 4) pv_cols<4>(pt + 16 * c, vpk, np, dv, ld, ot + 16 * c);
  switch (nrv - c) {
    case 3: pv_cols<3>(pt + 16 * c, vpk, np, dv, ld, ot + 16 * c); break;
    case 2: pv_cols<2>(pt + 16 * c, vpk, np, dv, ld, ot + 16 * c); break;
    case 1: pv_cols<1>(pt + 16 * c, vpk, np, dv, ld, ot + 16 * c); break;
    default: break;
  }
}

void tile_pv_f32(const float* pf, const float* vf, int n, int dv, int ld, int nrv, float* ot) {
  int c = 0;
  for (; c + 4 <= nrv; c += 4) pv_cols_f32<4>(pf + 16 * c, vf, n, dv, ld, ot + 16 * c);
  switch (nrv - c) {
    case 3: pv_cols_f32<3>(pf + 16 * c, vf, n, dv, ld, ot + 16 * c); break;
    case 2: pv_cols_f32<2>(pf + 16 * c, vf, n, dv, ld, ot + 16 * c); break;
    case 1: pv_cols_f32<1>(pf + 16 * c, vf, n, dv, ld, ot + 16 * c); break;
    default: break;
  }
}

#else  // not x86 GCC/Clang: the tile path is never taken

bool cpu_avx512bf16_available() { return false; }
void tile_scores_bf16(const uint32_t* const*, int, const uint32_t*, int, int, int, float, float*) {}
void tile_pv_bf16(const uint32_t*, const uint32_t*, int, int, int, int, float*) {}
void tile_pv_f32(const float*, const float*, int, int, int, int, float*) {}

#endif

}  // namespace pagoda::kernels::cpu::detail
