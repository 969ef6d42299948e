// The amx backend's decode kernel (see amx_decode.h): Sᵀ = K·Qᵀ on AMX tiles, the online softmax
// with the rows in AVX-512 lanes, P·V with vdpbf16ps on key pairs.
#include "pagoda/kernels/cpu/amx_decode.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "pagoda/kernels/cpu/amx_support.h"
#include "pagoda/kernels/cpu/paged_attention.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__linux__)
#define PAGODA_AMX_DECODE_X86 1
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers trip -Wuninitialized on their own _mm512_undefined_* (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#else
#define PAGODA_AMX_DECODE_X86 0
#endif

namespace pagoda::kernels::cpu::detail {

namespace {

/// Keys per block: the rows of one AMX A tile.
constexpr int kBlockKeys = 16;
/// Rows per KV head the kernel serves: the lanes of one f32 vector (and columns of a C tile).
constexpr int kMaxRowsPerHead = 16;
constexpr float kLog2eF = 1.44269504088896340736f;
constexpr float kLn2F = 0.69314718055994530942f;

/// A zero bf16 row standing in for the keys past the chunk's end in a partial block.
alignas(64) const uint16_t kZeroRow[kCpuMaxHeadDim] = {};

}  // namespace

bool amx_decode_eligible(const CpuAttentionParams& p, const CpuWorkItem& it) {
  if (!p.amx_decode) return false;
  const int rph = (it.q_end - it.q_begin) * (it.group_end - it.group_begin);
  if (rph > kMaxRowsPerHead || p.q_dtype != DType::kBF16 || p.k.dtype != DType::kBF16 ||
      p.v.dtype != DType::kBF16 || p.head_dim_qk != p.head_dim_v || p.head_dim_qk % 32 != 0 ||
      p.mask == CpuMask::kCustom || p.window_left >= 0 || p.logit_cap > 0.f) {
    return false;
  }
  if (p.mask == CpuMask::kCausal) {
    // The item's first row must see the chunk's last key (then every row sees every key).
    const int b = it.request;
    const int qo_len = p.qo_indptr[b + 1] - p.qo_indptr[b];
    if (p.kv_len[b] - qo_len + it.q_begin < it.kv_end - 1) return false;
  }
  return amx_tiles_available();
}

#if PAGODA_AMX_DECODE_X86

#define PAGODA_AMX_DECODE_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,amx-tile,amx-bf16")))
#define PAGODA_AMX_DECODE_INLINE PAGODA_AMX_DECODE_TARGET inline __attribute__((always_inline))

namespace {

/// 2^x for x <= 0 (lanes below -126 give 2^-126, callers zero the masked keys themselves):
/// degree-6 minimax polynomial on the fraction, exponent by vscalefps; relative error < 2e-7.
PAGODA_AMX_DECODE_INLINE __m512 exp2_ps(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-126.f));
  const __m512 fi = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, fi);
  __m512 y = _mm512_set1_ps(1.535336188e-4f);
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.339887440e-3f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(9.618437357e-3f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(5.550332471e-2f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(2.402264791e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(6.931472028e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(y, fi);
}

/// acc rows r0 .. r0 + NR (ld floats apart) += Σ over key pairs k2 < npairs of
/// (p[2 k2], p[2 k2 + 1]) · (V rows 2 k2, 2 k2 + 1) on the 32 · NV / 2 dims at x of each V row.
/// pp[k2 · 16 + r] holds row r's bf16 pair; accumulators in the interleaved dim order.
template <int NR, int NV>
PAGODA_AMX_DECODE_INLINE void pv_rows(const uint32_t* pp, int r0, int npairs,
                                      const uint16_t* const* vrows, int x, float* acc,
                                      int64_t ld) {
  __m512 a[NR][NV];
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < NV; ++v) a[r][v] = _mm512_loadu_ps(acc + r * ld + v * 16);
  for (int k2 = 0; k2 < npairs; ++k2) {
    const uint16_t* va = vrows[2 * k2] + x;
    const uint16_t* vb = vrows[2 * k2 + 1] + x;
    __m512i w[NV];
    const __m512i x0 = _mm512_loadu_si512(va), y0 = _mm512_loadu_si512(vb);
    w[0] = _mm512_unpacklo_epi16(x0, y0);
    w[1] = _mm512_unpackhi_epi16(x0, y0);
    if constexpr (NV == 4) {
      const __m512i x1 = _mm512_loadu_si512(va + 32), y1 = _mm512_loadu_si512(vb + 32);
      w[2] = _mm512_unpacklo_epi16(x1, y1);
      w[3] = _mm512_unpackhi_epi16(x1, y1);
    }
    for (int r = 0; r < NR; ++r) {
      const __m512bh pr = (__m512bh)_mm512_set1_epi32(static_cast<int>(pp[k2 * 16 + r0 + r]));
      for (int v = 0; v < NV; ++v) a[r][v] = _mm512_dpbf16_ps(a[r][v], pr, (__m512bh)w[v]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(acc + r * ld + v * 16, a[r][v]);
}

template <int NR>
PAGODA_AMX_DECODE_INLINE void pv_head_rows(const uint32_t* pp, int r0, int npairs,
                                           const uint16_t* const* vrows, int dim, float* acc) {
  int x = 0;
  for (; x + 64 <= dim; x += 64) pv_rows<NR, 4>(pp, r0, npairs, vrows, x, acc + x, dim);
  if (x < dim) pv_rows<NR, 2>(pp, r0, npairs, vrows, x, acc + x, dim);
}

/// The natural dim of accumulator slot s of a row (pv_rows' order): within each 32 dims, slot
/// 16 h + i holds dim 8 (i / 4) + 4 h + i % 4 (vpunpck{l,h}wd work per 128-bit lane).
inline int natural_dim(int s) {
  const int c = s / 32, h = (s / 16) % 2, i = s % 16;
  return 32 * c + 8 * (i / 4) + 4 * h + i % 4;
}

}  // namespace

PAGODA_AMX_DECODE_TARGET void amx_decode_item(const CpuAttentionParams& p, const CpuWorkItem& it,
                                              const AmxDecodeScratch& s, float* lse_nat) {
  const int b = it.request;
  const int64_t qo_start = p.qo_indptr[b];
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int gs = it.group_end - it.group_begin;
  const int rph = (it.q_end - it.q_begin) * gs;
  const int nh = it.kv_head_end - it.kv_head_begin;
  const int dim = p.head_dim_qk, nc = dim / 32;
  const int64_t qchunk = int64_t{16} * rph;  // words of one packed (head, 32 dims) Q tile

  // Q rows as bf16 pairs, B-tile layout: word (pair d2, row r) of head hh, 32-dim chunk c at
  // q[(hh · nc + c) · 16 · rph + (d2 % 16) · rph + r].
  const auto* qbase = static_cast<const uint16_t*>(p.q);
  for (int hh = 0; hh < nh; ++hh) {
    const int h = it.kv_head_begin + hh;
    for (int r = 0; r < rph; ++r) {
      const int64_t token = qo_start + it.q_begin + r / gs;
      const int qhead = h * group + it.group_begin + r % gs;
      const uint16_t* src = qbase + token * p.q_stride_token + int64_t{qhead} * p.q_stride_head;
      uint32_t* dst = s.q + int64_t{hh} * nc * qchunk + r;
      for (int d2 = 0; d2 < dim / 2; ++d2) {
        dst[(d2 / 16) * qchunk + (d2 % 16) * rph] =
            uint32_t{src[2 * d2]} | (uint32_t{src[2 * d2 + 1]} << 16);
      }
    }
  }
  float* m = s.ml;
  float* l = s.ml + int64_t{16} * nh;
  for (int i = 0; i < 16 * nh; ++i) {
    m[i] = -std::numeric_limits<float>::infinity();
    l[i] = 0.f;
  }
  std::fill(s.acc, s.acc + int64_t{nh} * rph * dim, 0.f);
  float* st = s.s;  // [16 keys][16 rows] f32 scores
  auto* pp = reinterpret_cast<uint32_t*>(s.s + 256);  // [8 key pairs][16 rows] bf16 pairs
  std::fill(st, st + 256, 0.f);  // the C tile stores rph columns; the other lanes stay 0

  // Tile 0 = C (16 keys × rows f32), 1 = A (16 keys × 32 bf16 of K), 2 = B (16 dim pairs ×
  // rows of Q).
  AmxTileConfig cfg;
  cfg.colsb[0] = cfg.colsb[2] = static_cast<uint16_t>(rph * 4);
  _tile_loadconfig(&cfg);

  const auto* kbase = static_cast<const uint16_t*>(p.k.data);
  const auto* vbase = static_cast<const uint16_t*>(p.v.data);
  const int32_t* pages = p.kv_indices + p.kv_indptr[b];
  const __m512 scale2 = _mm512_set1_ps(p.sm_scale * p.k_scale * kLog2eF);
  const __mmask16 live = static_cast<__mmask16>((1u << rph) - 1u);
  auto* kg = reinterpret_cast<uint16_t*>(s.k);  // [16][dim] gathered K rows of one head
  // Element offsets (head 0) of the block's keys, and of the next block's for the prefetch.
  int64_t koff[kBlockKeys], voff[kBlockKeys], knext[kBlockKeys], vnext[kBlockKeys];
  const uint16_t* vrows[kBlockKeys];
  auto offsets = [&](int t, int count, int64_t* ko, int64_t* vo) {
    for (int j = 0; j < count; ++j) {
      const int64_t page = pages[(t + j) / p.page_size], slot = (t + j) % p.page_size;
      ko[j] = page * p.k.stride_page + slot * p.k.stride_slot;
      vo[j] = page * p.v.stride_page + slot * p.v.stride_slot;
    }
  };
  offsets(it.kv_begin, std::min(kBlockKeys, it.kv_end - it.kv_begin), knext, vnext);
  for (int t0 = it.kv_begin; t0 < it.kv_end; t0 += kBlockKeys) {
    const int n = std::min(kBlockKeys, it.kv_end - t0);
    std::copy(knext, knext + n, koff);
    std::copy(vnext, vnext + n, voff);
    const int n_next = std::clamp(it.kv_end - t0 - kBlockKeys, 0, kBlockKeys);
    offsets(t0 + kBlockKeys, n_next, knext, vnext);
    // One strided tile load per 32 dims where the 16 keys are consecutive slots of one page.
    const bool direct = n == kBlockKeys && (t0 % p.page_size) + kBlockKeys <= p.page_size;
    const int npairs = (n + 1) / 2;
    for (int hh = 0; hh < nh; ++hh) {
      const int h = it.kv_head_begin + hh;
      // Software prefetch of the next (block, head) step's K and V rows into L1: page gathers
      // defeat the hardware streamers, and one step ahead (8 KB for D 128) keeps the prefetched
      // lines in L1 until used (a whole block ahead, 64 KB, measured ~10 % slower; none, 28 %).
      const bool last = hh + 1 == nh;
      const int64_t hn = it.kv_head_begin + (last ? 0 : hh + 1);
      const int64_t* kp = last ? knext : koff;
      const int64_t* vp = last ? vnext : voff;
      for (int j = 0, count = last ? n_next : n; j < count; ++j) {
        const auto* kr = reinterpret_cast<const char*>(kbase + kp[j] + hn * p.k.stride_head);
        const auto* vr = reinterpret_cast<const char*>(vbase + vp[j] + hn * p.v.stride_head);
        for (int x = 0; x < dim * 2; x += 64) {
          _mm_prefetch(kr + x, _MM_HINT_T0);
          _mm_prefetch(vr + x, _MM_HINT_T0);
        }
      }
      const uint16_t* a = nullptr;
      int64_t a_stride = 0;
      if (direct) {
        a = kbase + koff[0] + int64_t{h} * p.k.stride_head;
        a_stride = p.k.stride_slot * 2;
      } else {
        for (int j = 0; j < kBlockKeys; ++j)
          std::memcpy(kg + int64_t{j} * dim,
                      j < n ? kbase + koff[j] + int64_t{h} * p.k.stride_head : kZeroRow,
                      static_cast<size_t>(dim) * 2);
        a = kg;
        a_stride = int64_t{dim} * 2;
      }
      const uint32_t* qh = s.q + int64_t{hh} * nc * qchunk;
      _tile_zero(0);
      for (int c = 0; c < nc; ++c) {
        _tile_loadd(1, a + 32 * c, a_stride);
        _tile_loadd(2, qh + c * qchunk, rph * 4);
        _tile_dpbf16ps(0, 1, 2);
      }
      _tile_stored(0, st, 64);

      // Online softmax, rows in lanes, base 2.
      __m512 sv[kBlockKeys];
      __m512 bm = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      for (int j = 0; j < kBlockKeys; ++j) {
        sv[j] = _mm512_mul_ps(_mm512_loadu_ps(st + 16 * j), scale2);
        if (j < n) bm = _mm512_max_ps(bm, sv[j]);
      }
      float* mh = m + 16 * hh;
      float* lh = l + 16 * hh;
      const __m512 m_old = _mm512_loadu_ps(mh);
      const __m512 m_new = _mm512_max_ps(m_old, bm);
      __m512 lsum = _mm512_loadu_ps(lh);
      float* acc = s.acc + int64_t{hh} * rph * dim;
      if ((_mm512_cmp_ps_mask(m_new, m_old, _CMP_GT_OQ) & live) != 0) {
        const __m512 alpha = exp2_ps(_mm512_sub_ps(m_old, m_new));
        lsum = _mm512_mul_ps(lsum, alpha);
        alignas(64) float al[16];
        _mm512_store_ps(al, alpha);
        for (int r = 0; r < rph; ++r) {
          const __m512 ar = _mm512_set1_ps(al[r]);
          float* row = acc + int64_t{r} * dim;
          for (int x = 0; x < dim; x += 16)
            _mm512_storeu_ps(row + x, _mm512_mul_ps(_mm512_loadu_ps(row + x), ar));
        }
        _mm512_storeu_ps(mh, m_new);
      }
      for (int k2 = 0; k2 < kBlockKeys / 2; ++k2) {
        const int j = 2 * k2;
        const __m512 p0 = j < n ? exp2_ps(_mm512_sub_ps(sv[j], m_new)) : _mm512_setzero_ps();
        const __m512 p1 =
            j + 1 < n ? exp2_ps(_mm512_sub_ps(sv[j + 1], m_new)) : _mm512_setzero_ps();
        lsum = _mm512_add_ps(lsum, _mm512_add_ps(p0, p1));
        const __m512i b0 = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(p0));
        const __m512i b1 = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(p1));
        _mm512_storeu_si512(pp + 16 * k2, _mm512_or_si512(b0, _mm512_slli_epi32(b1, 16)));
      }
      _mm512_storeu_ps(lh, lsum);

      for (int j = 0; j < kBlockKeys; ++j)
        vrows[j] = j < n ? vbase + voff[j] + int64_t{h} * p.v.stride_head : kZeroRow;
      int r0 = 0;
      for (; r0 + 4 <= rph; r0 += 4)
        pv_head_rows<4>(pp, r0, npairs, vrows, dim, acc + int64_t{r0} * dim);
      switch (rph - r0) {
        case 3: pv_head_rows<3>(pp, r0, npairs, vrows, dim, acc + int64_t{r0} * dim); break;
        case 2: pv_head_rows<2>(pp, r0, npairs, vrows, dim, acc + int64_t{r0} * dim); break;
        case 1: pv_head_rows<1>(pp, r0, npairs, vrows, dim, acc + int64_t{r0} * dim); break;
        default: break;
      }
    }
  }
  _tile_release();

  // Epilogue: natural dim order, 1 / l and v_scale; the LSE in natural units.
  float* tmp = reinterpret_cast<float*>(s.k);
  for (int hh = 0; hh < nh; ++hh) {
    for (int r = 0; r < rph; ++r) {
      const float lr = l[16 * hh + r];
      float* row = s.acc + (int64_t{hh} * rph + r) * dim;
      const int rr = hh * rph + r;
      if (!(lr > 0.f)) {
        std::fill(row, row + dim, 0.f);
        lse_nat[rr] = -std::numeric_limits<float>::infinity();
        continue;
      }
      const float f = p.v_scale / lr;
      for (int x = 0; x < dim; ++x) tmp[natural_dim(x)] = row[x] * f;
      std::memcpy(row, tmp, static_cast<size_t>(dim) * sizeof(float));
      lse_nat[rr] = (m[16 * hh + r] + std::log2(lr)) * kLn2F;
    }
  }
}

#else  // not x86-64 Linux with GCC or Clang: amx_tiles_available() is false, never called

void amx_decode_item(const CpuAttentionParams&, const CpuWorkItem&, const AmxDecodeScratch&,
                     float*) {}

#endif

}  // namespace pagoda::kernels::cpu::detail
