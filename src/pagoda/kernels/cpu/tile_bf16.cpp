// AVX512-BF16 register-blocked micro-kernels of the extend tile path (see tile_bf16.h). Rows of
// the query tile live in vector lanes (16 per register); keys (scores) and output columns (P·V)
// are broadcast from memory as bf16 pairs, so K and V rows are consumed without a transpose.
#include "pagoda/kernels/cpu/tile_bf16.h"

#include <type_traits>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define PAGODA_TILE_BF16_X86 1
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers trip -Wuninitialized on their own _mm512_undefined_* (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
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

/// XB output columns x C row vectors; the accumulators are the transposed output itself. T =
/// uint32_t: `steps` key pairs of bf16 (vdpbf16ps); T = float: `steps` keys of f32 (FMA).
template <int XB, int C, class T>
PAGODA_BF16_TARGET void pv_block(const T* pt, const T* vpk, int steps, int dv, int ld, float* ot) {
  __m512 acc[XB][C];
  for (int i = 0; i < XB; ++i)
    for (int c = 0; c < C; ++c) acc[i][c] = _mm512_loadu_ps(ot + static_cast<int64_t>(i) * ld + 16 * c);
  for (int j = 0; j < steps; ++j) {
    const T* prow = pt + static_cast<int64_t>(j) * ld;
    const T* v = vpk + static_cast<int64_t>(j) * dv;
    if constexpr (std::is_same_v<T, float>) {
      __m512 pv[C];
      for (int c = 0; c < C; ++c) pv[c] = _mm512_loadu_ps(prow + 16 * c);
      for (int i = 0; i < XB; ++i) {
        const __m512 vb = _mm512_set1_ps(v[i]);
        for (int c = 0; c < C; ++c) acc[i][c] = _mm512_fmadd_ps(vb, pv[c], acc[i][c]);
      }
    } else {
      __m512i pv[C];
      for (int c = 0; c < C; ++c) pv[c] = _mm512_loadu_si512(prow + 16 * c);
      for (int i = 0; i < XB; ++i) {
        const __m512i vb = _mm512_set1_epi32(static_cast<int>(v[i]));
        for (int c = 0; c < C; ++c) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], as_bh(vb), as_bh(pv[c]));
      }
    }
  }
  for (int i = 0; i < XB; ++i)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(ot + static_cast<int64_t>(i) * ld + 16 * c, acc[i][c]);
}

template <int C, class T>
PAGODA_BF16_TARGET void pv_cols(const T* pt, const T* vpk, int steps, int dv, int ld, float* ot) {
  int x = 0;
  for (; x + 6 <= dv; x += 6) pv_block<6, C>(pt, vpk + x, steps, dv, ld, ot + static_cast<int64_t>(x) * ld);
  float* o = ot + static_cast<int64_t>(x) * ld;
  switch (dv - x) {
    case 5: pv_block<5, C>(pt, vpk + x, steps, dv, ld, o); break;
    case 4: pv_block<4, C>(pt, vpk + x, steps, dv, ld, o); break;
    case 3: pv_block<3, C>(pt, vpk + x, steps, dv, ld, o); break;
    case 2: pv_block<2, C>(pt, vpk + x, steps, dv, ld, o); break;
    case 1: pv_block<1, C>(pt, vpk + x, steps, dv, ld, o); break;
    default: break;
  }
}

/// Row vectors in groups of four (64 rows), then the remainder.
template <class T>
void pv_rows(const T* pt, const T* vpk, int steps, int dv, int ld, int nrv, float* ot) {
  int c = 0;
  for (; c + 4 <= nrv; c += 4) pv_cols<4>(pt + 16 * c, vpk, steps, dv, ld, ot + 16 * c);
  switch (nrv - c) {
    case 3: pv_cols<3>(pt + 16 * c, vpk, steps, dv, ld, ot + 16 * c); break;
    case 2: pv_cols<2>(pt + 16 * c, vpk, steps, dv, ld, ot + 16 * c); break;
    case 1: pv_cols<1>(pt + 16 * c, vpk, steps, dv, ld, ot + 16 * c); break;
    default: break;
  }
}

/// Horizontal sums of four vectors: out[k] = Σ lanes of a_k.
PAGODA_BF16_TARGET inline void reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3, float* out) {
  const __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  const __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  const __m512d w01 = _mm512_castps_pd(s01), w23 = _mm512_castps_pd(s23);
  const __m512 s = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(w01, w23)),
                                 _mm512_castpd_ps(_mm512_unpackhi_pd(w01, w23)));
  // Lanes 4b..4b+3 of s hold block b's partial sums of a0..a3.
  const __m512 t = _mm512_add_ps(s, _mm512_shuffle_f32x4(s, s, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 u = _mm512_add_ps(t, _mm512_shuffle_f32x4(t, t, _MM_SHUFFLE(2, 3, 0, 1)));
  _mm_storeu_ps(out, _mm512_castps512_ps128(u));
}

/// R rows x 4 keys (nk <= 4 real ones; missing keys repeat the last and are not stored).
template <int R>
PAGODA_BF16_TARGET void dec_scores(const uint16_t* const* qrows, const uint16_t* const* kp,
                                   int64_t off, int nk, int dim, float scale, float* s, int ls) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < 4; ++k) acc[r][k] = _mm512_setzero_ps();
  const uint16_t* kr[4];
  for (int k = 0; k < 4; ++k) kr[k] = kp[k < nk ? k : nk - 1] + off;
  for (int c = 0; c < dim; c += 32) {
    __m512i kv[4];
    for (int k = 0; k < 4; ++k) kv[k] = _mm512_loadu_si512(kr[k] + c);
    for (int r = 0; r < R; ++r) {
      const __m512i qv = _mm512_loadu_si512(qrows[r] + c);
      for (int k = 0; k < 4; ++k) acc[r][k] = _mm512_dpbf16_ps(acc[r][k], as_bh(qv), as_bh(kv[k]));
    }
  }
  for (int r = 0; r < R; ++r) {
    float out[4];
    reduce4(acc[r][0], acc[r][1], acc[r][2], acc[r][3], out);
    for (int k = 0; k < nk; ++k) s[r * ls + k] = scale * out[k];
  }
}

alignas(64) constexpr uint16_t kInterleaveLo[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                    37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                    11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
alignas(64) constexpr uint16_t kInterleaveHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21,
                                                    53, 22, 54, 23, 55, 24, 56, 25, 57, 26, 58,
                                                    27, 59, 28, 60, 29, 61, 30, 62, 31, 63};

/// R rows, 64 output columns [x, x + 64) (or 32 when `half`), all key pairs.
template <int R>
PAGODA_BF16_TARGET void dec_pv(const uint32_t* pp, int lpp, const uint16_t* const* vp, int64_t off,
                               int n, int x, bool half, float* acc, int la) {
  const __m512i ilo = _mm512_loadu_si512(kInterleaveLo);
  const __m512i ihi = _mm512_loadu_si512(kInterleaveHi);
  const int nv = half ? 2 : 4;
  __m512 a[R][4];
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < 4; ++k)
      a[r][k] = k < nv ? _mm512_loadu_ps(acc + r * la + x + 16 * k) : _mm512_setzero_ps();
  for (int j = 0; j < n; j += 2) {
    const uint16_t* va = vp[j] + off + x;
    const uint16_t* vb = vp[j + 1 < n ? j + 1 : j] + off + x;
    __m512i v[4];
    const __m512i a0 = _mm512_loadu_si512(va), b0 = _mm512_loadu_si512(vb);
    v[0] = _mm512_permutex2var_epi16(a0, ilo, b0);
    v[1] = _mm512_permutex2var_epi16(a0, ihi, b0);
    if (!half) {
      const __m512i a1 = _mm512_loadu_si512(va + 32), b1 = _mm512_loadu_si512(vb + 32);
      v[2] = _mm512_permutex2var_epi16(a1, ilo, b1);
      v[3] = _mm512_permutex2var_epi16(a1, ihi, b1);
    } else {
      v[2] = v[3] = _mm512_setzero_si512();
    }
    for (int r = 0; r < R; ++r) {
      const __m512i pb = _mm512_set1_epi32(static_cast<int>(pp[r * lpp + j / 2]));
      for (int k = 0; k < 4; ++k) a[r][k] = _mm512_dpbf16_ps(a[r][k], as_bh(v[k]), as_bh(pb));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < nv; ++k) _mm512_storeu_ps(acc + r * la + x + 16 * k, a[r][k]);
}

bool detect() {
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
  pv_rows(pt, vpk, np, dv, ld, nrv, ot);
}

void tile_pv_f32(const float* pf, const float* vf, int n, int dv, int ld, int nrv, float* ot) {
  pv_rows(pf, vf, n, dv, ld, nrv, ot);
}

void decode_scores_bf16(const uint16_t* const* qrows, int rows, const uint16_t* const* kp,
                        int64_t off, int n, int dim, float scale, float* s, int ls) {
  for (int j = 0; j < n; j += 4) {
    const int nk = n - j < 4 ? n - j : 4;
    int r = 0;
    for (; r + 4 <= rows; r += 4) dec_scores<4>(qrows + r, kp + j, off, nk, dim, scale, s + r * ls + j, ls);
    switch (rows - r) {
      case 3: dec_scores<3>(qrows + r, kp + j, off, nk, dim, scale, s + r * ls + j, ls); break;
      case 2: dec_scores<2>(qrows + r, kp + j, off, nk, dim, scale, s + r * ls + j, ls); break;
      case 1: dec_scores<1>(qrows + r, kp + j, off, nk, dim, scale, s + r * ls + j, ls); break;
      default: break;
    }
  }
}

PAGODA_BF16_TARGET void decode_pack_p_bf16(const float* p, int lp, int rows, int npad, uint32_t* pp,
                                           int lpp) {
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < npad; j += 16) {
      const __m256bh b = _mm512_cvtneps_pbh(_mm512_loadu_ps(p + r * lp + j));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pp + r * lpp + j / 2), (__m256i)b);  // NOLINT
    }
  }
}

void decode_pv_bf16(const uint32_t* pp, int lpp, int rows, const uint16_t* const* vp, int64_t off,
                    int n, int dim, float* acc, int la) {
  for (int x = 0; x < dim; x += 64) {
    const bool half = x + 64 > dim;
    int r = 0;
    for (; r + 4 <= rows; r += 4) dec_pv<4>(pp + r * lpp, lpp, vp, off, n, x, half, acc + r * la, la);
    switch (rows - r) {
      case 3: dec_pv<3>(pp + r * lpp, lpp, vp, off, n, x, half, acc + r * la, la); break;
      case 2: dec_pv<2>(pp + r * lpp, lpp, vp, off, n, x, half, acc + r * la, la); break;
      case 1: dec_pv<1>(pp + r * lpp, lpp, vp, off, n, x, half, acc + r * la, la); break;
      default: break;
    }
  }
}

#else  // not x86 GCC/Clang: the tile path is never taken

bool cpu_avx512bf16_available() { return false; }
bool cpu_decode_bf16_enabled() { return false; }
void tile_scores_bf16(const uint32_t* const*, int, const uint32_t*, int, int, int, float, float*) {}
void tile_pv_bf16(const uint32_t*, const uint32_t*, int, int, int, int, float*) {}
void tile_pv_f32(const float*, const float*, int, int, int, int, float*) {}
void decode_scores_bf16(const uint16_t* const*, int, const uint16_t* const*, int64_t, int, int,
                        float, float*, int) {}
void decode_pack_p_bf16(const float*, int, int, int, uint32_t*, int) {}
void decode_pv_bf16(const uint32_t*, int, int, const uint16_t* const*, int64_t, int, int, float*,
                    int) {}

#endif

}  // namespace pagoda::kernels::cpu::detail
