// CPU paged attention: one work item = (request, KV-head range, query-head sub-group, query
// tile, key chunk). Keys are streamed in blocks of schedule.kv_block; for each block and KV head
// the K rows are converted to f32 once and scored against every query row of the group (GQA:
// each KV byte is read once per group), then the V rows are converted once and accumulated.
// bf16 decode-like items (few rows per head) skip the f32 copy and read K/V straight from the
// cache in pair-split order (ScoresBf16 / AccumulatePVBf16 in simd_rows-inl.h).
// Split-KV items leave (o, lse) partials that the merge phase combines.
#include "pagoda/kernels/cpu/paged_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "pagoda/kernels/cpu/amx_decode.h"
#include "pagoda/kernels/cpu/output_writer.h"
#include "pagoda/kernels/cpu/scratch_layout.h"
#include "pagoda/kernels/cpu/tile_bf16.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "pagoda/kernels/cpu/paged_attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "pagoda/kernels/cpu/simd_rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace pagoda::kernels::cpu {
namespace HWY_NAMESPACE {

/// Items with at most this many query rows per KV head (decode, small GQA verify) read bf16 K/V
/// straight from the cache (ScoresBf16 / AccumulatePVBf16); larger tiles amortise a f32 copy.
constexpr int kDirectMaxRowsPerHead = 16;

/// First key of a custom-mask row's sliding window: its (window + 1)-th last visible key, since
/// under a custom mask a query sits at position (visible keys) - 1 and its r-th visible key at r
/// (attention/batch_attention.h); 0 when the row sees at most window + 1 keys.
int CustomWindowStart(const uint8_t* bits, int64_t bit_base, int kv_len, int window) {
  int need = window + 1;
  for (int j = kv_len - 1; j >= 0; --j) {
    const int64_t bit = bit_base + j;
    if (((bits[bit >> 3] >> (bit & 7)) & 1) != 0 && --need == 0) return j;
  }
  return 0;
}

/// Visible key range of each query row (token) of the item, clipped to the item's chunk, and
/// the union [*ulo, *uhi) over the rows (empty when ulo >= uhi).
void ItemMasks(const CpuAttentionParams& p, const CpuWorkItem& it, RowMask* masks, int* ulo,
               int* uhi) {
  const int b = it.request;
  const int qo_len = p.qo_indptr[b + 1] - p.qo_indptr[b];
  const int kv_len = p.kv_len[b];
  *ulo = it.kv_end;
  *uhi = it.kv_begin;
  for (int qi = 0; qi < it.q_end - it.q_begin; ++qi) {
    const int i = it.q_begin + qi;
    const int diag = kv_len - qo_len + i;
    RowMask rm;
    rm.lo = it.kv_begin;
    rm.hi = it.kv_end;
    if (p.mask == CpuMask::kCausal) rm.hi = std::min(rm.hi, diag + 1);
    if (p.mask == CpuMask::kCustom) {
      rm.bits = p.custom_mask + p.mask_indptr[b];
      rm.bit_base = static_cast<int64_t>(i) * kv_len;
      if (p.window_left >= 0) {
        rm.lo = std::max(rm.lo, CustomWindowStart(rm.bits, rm.bit_base, kv_len, p.window_left));
      }
    } else if (p.window_left >= 0) {
      rm.lo = std::max(rm.lo, diag - p.window_left);
    }
    if (rm.lo < rm.hi) {
      *ulo = std::min(*ulo, rm.lo);
      *uhi = std::max(*uhi, rm.hi);
    }
    masks[qi] = rm;
  }
}

/// Writes one finished row (normalised output o[0, Dv), natural lse) of item row r: the final
/// output, or its partial slot for the split-KV merge.
void FinishRow(const CpuAttentionParams& p, const CpuSchedule& sch, const CpuWorkItem& it, int r,
               const float* o, float lse) {
  const int gs = it.group_end - it.group_begin;
  const int rph = (it.q_end - it.q_begin) * gs;
  if (it.partial < 0) {
    const int group = p.num_qo_heads / p.num_kv_heads;
    const int h = it.kv_head_begin + r / rph;
    const int qi = (r % rph) / gs;
    const int qhead = h * group + it.group_begin + r % gs;
    detail::write_output_row(p, p.qo_indptr[it.request] + it.q_begin + qi, qhead, o, lse);
  } else {
    const int64_t slot = static_cast<int64_t>(it.partial) * sch.max_rows + r;
    float* dst = sch.partial_out + slot * p.head_dim_v;
    for (int x = 0; x < p.head_dim_v; ++x) dst[x] = o[x];
    sch.partial_lse[slot] = lse;
  }
}

#include "pagoda/kernels/cpu/tile_item-inl.h"

void ProcessItem(const CpuAttentionParams& p, const CpuSchedule& sch, const CpuWorkItem& it,
                 float* scratch) {
  if (TileEligible(p, it)) {
    ProcessItemTile(p, sch, it, scratch);
    return;
  }
  if (detail::amx_decode_eligible(p, it)) {
    const detail::ScratchLayout lay(sch.max_rows, sch.max_rows, p.head_dim_qk, p.head_dim_v,
                                    sch.kv_block);
    const detail::AmxDecodeScratch s{.q = reinterpret_cast<uint32_t*>(scratch + lay.q),
                                     .k = reinterpret_cast<uint32_t*>(scratch + lay.k),
                                     .s = scratch + lay.v,
                                     .acc = scratch + lay.acc,
                                     .ml = scratch + lay.amx_ml};
    float* lse = scratch + lay.m;
    detail::amx_decode_item(p, it, s, lse);
    const int rows = (it.kv_head_end - it.kv_head_begin) * (it.q_end - it.q_begin) *
                     (it.group_end - it.group_begin);
    for (int r = 0; r < rows; ++r)
      FinishRow(p, sch, it, r, scratch + lay.acc + static_cast<int64_t>(r) * p.head_dim_v, lse[r]);
    return;
  }
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int b = it.request;
  const int64_t qo_start = p.qo_indptr[b];
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int gs = it.group_end - it.group_begin;
  const int qr = it.q_end - it.q_begin;
  const int nh = it.kv_head_end - it.kv_head_begin;
  const int rph = qr * gs;  // rows per KV head
  const int rows = nh * rph;
  const int dqk = p.head_dim_qk, dv = p.head_dim_v;
  const int dqk_pad = cpu_padded_dim(dqk), dv_pad = cpu_padded_dim(dv);
  const int T = sch.kv_block;
  const detail::ScratchLayout lay(sch.max_rows, sch.max_rows, dqk, dv, T);
  float* qf = scratch + lay.q;
  float* kf = scratch + lay.k;
  float* vf = scratch + lay.v;
  float* sc = scratch + lay.s;
  float* acc = scratch + lay.acc;
  float* mrow = scratch + lay.m;
  float* lrow = scratch + lay.l;

  // Queries, pre-scaled so that q·k is already the (pre-cap) logit in natural units.
  const float cap = p.logit_cap;
  const float qscale = p.sm_scale * p.k_scale / (cap > 0.f ? cap : 1.f);
  const size_t qes = dtype_size(p.q_dtype);
  // Direct bf16 path: q rows and accumulators in pair-split order (see simd_rows-inl.h).
  const bool direct = p.k.dtype == DType::kBF16 && p.v.dtype == DType::kBF16 &&
                      dqk % PairChunk() == 0 && dv % PairChunk() == 0 &&
                      rph <= kDirectMaxRowsPerHead;
  // AVX512-BF16 decode (opt-in: p.bf16_decode): bf16 q rows read in place (scores exact in
  // f32); P in bf16 only for a bf16 output. Accumulators are then in natural order, else in
  // pair-split order.
  const bool dot16 = direct && p.q_dtype == DType::kBF16 && dqk % 32 == 0 && p.bf16_decode &&
                     detail::cpu_avx512bf16_available();
  const bool pv16 = dot16 && p.out_dtype == DType::kBF16 && dv % 32 == 0;
  const uint16_t* qrows[kCpuMaxRows];
  for (int r = 0; r < rows; ++r) {
    const int h = it.kv_head_begin + r / rph;
    const int qi = (r % rph) / gs;
    const int qhead = h * group + it.group_begin + r % gs;
    const auto* src = static_cast<const unsigned char*>(p.q) +
                      ((qo_start + it.q_begin + qi) * p.q_stride_token +
                       static_cast<int64_t>(qhead) * p.q_stride_head) * static_cast<int64_t>(qes);
    float* row = qf + static_cast<int64_t>(r) * dqk_pad;
    qrows[r] = reinterpret_cast<const uint16_t*>(src);
    ConvertRow(p.q_dtype, src, dqk, dqk_pad, row);
    ScaleRow(row, qscale, dqk_pad);
    if (direct) PairSplitRow(row, dqk, /*inverse=*/false, kf);
    mrow[r] = neg_inf;
    lrow[r] = 0.f;
    for (int x = 0; x < dv_pad; ++x) acc[static_cast<int64_t>(r) * dv_pad + x] = 0.f;
  }

  // Visible key range of each query row of the tile, clipped to the item's chunk.
  RowMask masks[kCpuMaxRows];
  int ulo = 0, uhi = 0;
  ItemMasks(p, it, masks, &ulo, &uhi);

  const size_t kes = dtype_size(p.k.dtype);
  const size_t ves = dtype_size(p.v.dtype);
  const auto* kbase = static_cast<const unsigned char*>(p.k.data);
  const auto* vbase = static_cast<const unsigned char*>(p.v.data);
  const int32_t* pages = p.kv_indices + p.kv_indptr[b];
  int64_t koff[256];  // element offsets of this block's keys
  int64_t voff[256];
  const hwy::bfloat16_t* kp[256];
  const hwy::bfloat16_t* vp[256];
  const unsigned char* next_k[256];
  const unsigned char* next_v[256];
  int n_pref = 0;
  int64_t pref_kspan = 0, pref_vspan = 0;
  for (int t0 = ulo; t0 < uhi; t0 += T) {
    const int n = std::min(T, uhi - t0);
    const int npad = (n + 15) / 16 * 16;
    int page_idx = t0 / p.page_size;
    int slot = t0 % p.page_size;
    const int n_next = t0 + T < uhi ? std::min(T, uhi - t0 - T) : 0;
    for (int j = 0; j < n; ++j) {
      const int64_t page = pages[page_idx];
      koff[j] = page * p.k.stride_page + slot * p.k.stride_slot;
      voff[j] = page * p.v.stride_page + slot * p.v.stride_slot;
      if (++slot == p.page_size) {
        slot = 0;
        ++page_idx;
      }
    }
    // Software prefetch of the next block's K/V rows (all heads of the item): page gathers
    // defeat the hardware stream prefetchers.
    n_pref = 0;
    if (n_next > 0) {
      const int n2 = std::min(T, uhi - t0 - T);
      n_pref = 0;  // spreading measured slower than the burst (L3-resident decode)
      pref_kspan = static_cast<int64_t>(nh) * p.k.stride_head * static_cast<int64_t>(kes);
      pref_vspan = static_cast<int64_t>(nh) * p.v.stride_head * static_cast<int64_t>(ves);
      int pi = (t0 + T) / p.page_size;
      int sl = (t0 + T) % p.page_size;
      const int64_t kspan = static_cast<int64_t>(nh) * p.k.stride_head * static_cast<int64_t>(kes);
      const int64_t vspan = static_cast<int64_t>(nh) * p.v.stride_head * static_cast<int64_t>(ves);
      const int64_t kh0 = static_cast<int64_t>(it.kv_head_begin) * p.k.stride_head;
      const int64_t vh0 = static_cast<int64_t>(it.kv_head_begin) * p.v.stride_head;
      for (int j = 0; j < n2; ++j) {
        const int64_t page = pages[pi];
        const auto* kr = kbase + (page * p.k.stride_page + sl * p.k.stride_slot + kh0) * static_cast<int64_t>(kes);
        const auto* vr = vbase + (page * p.v.stride_page + sl * p.v.stride_slot + vh0) * static_cast<int64_t>(ves);
        if (n_pref > 0) {
          // Issued later, spread over this block's key groups (a burst of thousands of
          // prefetches stalls on the miss queue).
          next_k[j] = kr;
          next_v[j] = vr;
        } else {
          for (int64_t b0 = 0; b0 < kspan; b0 += 64) hwy::Prefetch(kr + b0);
          for (int64_t b0 = 0; b0 < vspan; b0 += 64) hwy::Prefetch(vr + b0);
        }
        if (++sl == p.page_size) {
          sl = 0;
          ++pi;
        }
      }
    }
    if (direct) {
      // Token-major order: a group of keys is scored (and later accumulated) for every KV head
      // of the item before the next group, so each page is read front to back (one 2 KB token
      // row after the other for 8 heads x 128 x bf16) and the hardware stream prefetchers
      // follow (the next-block software prefetch above covers the page gathers).
      const auto* kb = static_cast<const hwy::bfloat16_t*>(p.k.data);
      const auto* vb = static_cast<const hwy::bfloat16_t*>(p.v.data);
      for (int j = 0; j < n; ++j) {
        kp[j] = kb + koff[j];
        vp[j] = vb + voff[j];
      }
      for (int j0 = 0; j0 < n; j0 += 4) {
        const int nj = std::min(4, n - j0);
        for (int hh = 0; hh < nh; ++hh) {
          const int64_t off = static_cast<int64_t>(it.kv_head_begin + hh) * p.k.stride_head;
          const float* qh = qf + static_cast<int64_t>(hh * rph) * dqk_pad;
          float* sh = sc + static_cast<int64_t>(hh * rph) * T + j0;
          if (dot16) {
            if (hh == 0) {
              // Next block's K rows, proportionally to this block's progress.
              for (int j = j0 * n_pref / n; j < std::min(n_pref, (j0 + 4) * n_pref / n); ++j)
                for (int64_t b0 = 0; b0 < pref_kspan; b0 += 64) hwy::Prefetch(next_k[j] + b0);
            }
            detail::decode_scores_bf16(qrows + hh * rph, rph,
                                       reinterpret_cast<const uint16_t* const*>(kp + j0), off, nj,
                                       dqk, qscale, sh, T);
            continue;
          }
          int rr = 0;
          for (; rr + 4 <= rph; rr += 4) {
            ScoresBf16<4>(qh + static_cast<int64_t>(rr) * dqk_pad, dqk_pad, kp + j0, off, nj, dqk,
                          sh + static_cast<int64_t>(rr) * T, T);
          }
          const float* qt = qh + static_cast<int64_t>(rr) * dqk_pad;
          float* st = sh + static_cast<int64_t>(rr) * T;
          switch (rph - rr) {
            case 3: ScoresBf16<3>(qt, dqk_pad, kp + j0, off, nj, dqk, st, T); break;
            case 2: ScoresBf16<2>(qt, dqk_pad, kp + j0, off, nj, dqk, st, T); break;
            case 1: ScoresBf16<1>(qt, dqk_pad, kp + j0, off, nj, dqk, st, T); break;
            default: break;
          }
        }
      }
      bool any = false;
      for (int r = 0; r < rows; ++r) {
        any |= SoftmaxBlock(sc + static_cast<int64_t>(r) * T, n, npad, t0, masks[(r % rph) / gs],
                            cap, mrow + r, lrow + r, acc + static_cast<int64_t>(r) * dv_pad,
                            dv_pad);
      }
      if (!any) continue;
      if (pv16) {
        // P as bf16 pairs, in place over each score row (row stride T), then 16 keys at a time
        // for every KV head.
        auto* pp = reinterpret_cast<uint32_t*>(sc);
        detail::decode_pack_p_bf16(sc, T, rows, npad, pp, T);
        for (int j0 = 0; j0 < n; j0 += 16) {
          const int nj = std::min(16, n - j0);
          for (int j = j0 * n_pref / n; j < std::min(n_pref, (j0 + 16) * n_pref / n); ++j)
            for (int64_t b0 = 0; b0 < pref_vspan; b0 += 64) hwy::Prefetch(next_v[j] + b0);
          for (int hh = 0; hh < nh; ++hh) {
            const int64_t off = static_cast<int64_t>(it.kv_head_begin + hh) * p.v.stride_head;
            detail::decode_pv_bf16(pp + static_cast<int64_t>(hh * rph) * T + j0 / 2, T,
                                   rph, reinterpret_cast<const uint16_t* const*>(vp + j0), off, nj,
                                   dv, acc + static_cast<int64_t>(hh * rph) * dv_pad, dv_pad);
          }
        }
        continue;
      }
      constexpr int kPvKeys = 8;
      for (int j0 = 0; j0 < n; j0 += kPvKeys) {
        const int nj = std::min(kPvKeys, n - j0);
        for (int hh = 0; hh < nh; ++hh) {
          const int64_t off = static_cast<int64_t>(it.kv_head_begin + hh) * p.v.stride_head;
          const float* ph = sc + static_cast<int64_t>(hh * rph) * T + j0;
          float* ah = acc + static_cast<int64_t>(hh * rph) * dv_pad;
          int rr = 0;
          for (; rr + 4 <= rph; rr += 4) {
            AccumulatePVBf16<4>(ph + static_cast<int64_t>(rr) * T, T, nj, vp + j0, off, dv,
                                ah + static_cast<int64_t>(rr) * dv_pad, dv_pad);
          }
          const float* pt = ph + static_cast<int64_t>(rr) * T;
          float* at = ah + static_cast<int64_t>(rr) * dv_pad;
          switch (rph - rr) {
            case 3: AccumulatePVBf16<3>(pt, T, nj, vp + j0, off, dv, at, dv_pad); break;
            case 2: AccumulatePVBf16<2>(pt, T, nj, vp + j0, off, dv, at, dv_pad); break;
            case 1: AccumulatePVBf16<1>(pt, T, nj, vp + j0, off, dv, at, dv_pad); break;
            default: break;
          }
        }
      }
      continue;
    }
    for (int hh = 0; hh < nh; ++hh) {
      const int h = it.kv_head_begin + hh;
      for (int j = 0; j < n; ++j) {
        const int64_t e = koff[j] + static_cast<int64_t>(h) * p.k.stride_head;
        ConvertRow(p.k.dtype, kbase + e * static_cast<int64_t>(kes), dqk, dqk_pad,
                   kf + static_cast<int64_t>(j) * dqk_pad);
      }
      const int r0 = hh * rph;
      int rr0 = 0;
      for (; rr0 + 4 <= rph; rr0 += 4) {
        DotKeys4(qf + static_cast<int64_t>(r0 + rr0) * dqk_pad, kf, dqk_pad, n, dqk_pad,
                 sc + static_cast<int64_t>(rr0) * T, T);
      }
      for (int rr = rr0; rr < rph; rr += 2) {
        const bool two = rr + 1 < rph;
        DotKeys(qf + static_cast<int64_t>(r0 + rr) * dqk_pad,
                two ? qf + static_cast<int64_t>(r0 + rr + 1) * dqk_pad : nullptr, kf, dqk_pad, n,
                dqk_pad, sc + static_cast<int64_t>(rr) * T,
                two ? sc + static_cast<int64_t>(rr + 1) * T : nullptr);
      }
      bool any = false;
      for (int rr = 0; rr < rph; ++rr) {
        const int r = r0 + rr;
        any |= SoftmaxBlock(sc + static_cast<int64_t>(rr) * T, n, npad, t0, masks[rr / gs], cap,
                            mrow + r, lrow + r, acc + static_cast<int64_t>(r) * dv_pad, dv_pad);
      }
      if (!any) continue;
      for (int j = 0; j < n; ++j) {
        const int64_t e = voff[j] + static_cast<int64_t>(h) * p.v.stride_head;
        ConvertRow(p.v.dtype, vbase + e * static_cast<int64_t>(ves), dv, dv_pad,
                   vf + static_cast<int64_t>(j) * dv_pad);
      }
      int rr = 0;
      for (; rr + 4 <= rph; rr += 4) {
        AccumulatePVRows<4>(sc + static_cast<int64_t>(rr) * T, T, n, vf, dv_pad, dv_pad,
                            acc + static_cast<int64_t>(r0 + rr) * dv_pad, dv_pad);
      }
      for (; rr < rph; ++rr) {
        AccumulatePVRows<1>(sc + static_cast<int64_t>(rr) * T, T, n, vf, dv_pad, dv_pad,
                            acc + static_cast<int64_t>(r0 + rr) * dv_pad, dv_pad);
      }
    }
  }

  // Epilogue: normalise, then either write the final row or store the partial state.
  for (int r = 0; r < rows; ++r) {
    float* o = acc + static_cast<int64_t>(r) * dv_pad;
    const float l = lrow[r];
    const float lse = l > 0.f ? mrow[r] + std::log(l) : neg_inf;
    ScaleRow(o, l > 0.f ? p.v_scale / l : 0.f, dv_pad);
    if (direct && !pv16) PairSplitRow(o, dv, /*inverse=*/true, vf);
    FinishRow(p, sch, it, r, o, lse);
  }
}

/// Streaming read: returns the sum of data[0, n).
double StreamSum(const float* HWY_RESTRICT data, int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  VF a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    a0 = hn::Add(a0, hn::LoadU(d, data + i));
    a1 = hn::Add(a1, hn::LoadU(d, data + i + N));
    a2 = hn::Add(a2, hn::LoadU(d, data + i + 2 * N));
    a3 = hn::Add(a3, hn::LoadU(d, data + i + 3 * N));
  }
  double s = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
  for (; i < n; ++i) s += data[i];
  return s;
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace pagoda::kernels::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pagoda::kernels::cpu {

HWY_EXPORT(ProcessItem);
HWY_EXPORT(StreamSum);
HWY_EXPORT(TargetName);

int64_t cpu_attention_scratch_floats(int max_rows, int max_rows_per_head, int head_dim_qk,
                                     int head_dim_v, int kv_block) {
  // The kernel addresses scores by max_rows (a row's score slot is its in-head index).
  (void)max_rows_per_head;
  return detail::ScratchLayout(max_rows, max_rows, head_dim_qk, head_dim_v, kv_block).total;
}

namespace {

/// Combines the partial states of one merge item and writes the final rows.
void merge_item(const CpuAttentionParams& p, const CpuSchedule& sch, const CpuMergeItem& mi,
                float* tmp) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int gs = mi.group_end - mi.group_begin;
  const int qr = mi.q_end - mi.q_begin;
  const int rph = qr * gs;
  const int rows = (mi.kv_head_end - mi.kv_head_begin) * rph;
  const int dv = p.head_dim_v;
  for (int r = 0; r < rows; ++r) {
    float mx = neg_inf;
    for (int c = 0; c < mi.num_partials; ++c) {
      mx = std::max(mx, sch.partial_lse[static_cast<int64_t>(mi.partial_begin + c) * sch.max_rows + r]);
    }
    for (int x = 0; x < dv; ++x) tmp[x] = 0.f;
    float lse = neg_inf;
    if (mx != neg_inf) {
      float wsum = 0.f;
      for (int c = 0; c < mi.num_partials; ++c) {
        const int64_t slot = static_cast<int64_t>(mi.partial_begin + c) * sch.max_rows + r;
        const float lc = sch.partial_lse[slot];
        if (lc == neg_inf) continue;
        const float w = std::exp(lc - mx);
        wsum += w;
        const float* o = sch.partial_out + slot * dv;
        for (int x = 0; x < dv; ++x) tmp[x] += w * o[x];
      }
      const float inv = 1.f / wsum;
      for (int x = 0; x < dv; ++x) tmp[x] *= inv;
      lse = mx + std::log(wsum);
    }
    const int h = mi.kv_head_begin + r / rph;
    const int qi = (r % rph) / gs;
    const int qhead = h * group + mi.group_begin + r % gs;
    detail::write_output_row(p, p.qo_indptr[mi.request] + mi.q_begin + qi, qhead, tmp, lse);
  }
}

}  // namespace

void run_cpu_paged_attention(const CpuAttentionParams& params, const CpuSchedule& sch) {
  const int nt = std::max(1, sch.num_threads);
  (void)cpu_simd_target_name();  // resolves the dispatch target once, before the threads start
#pragma omp parallel num_threads(nt)
  {
    float* scratch = sch.scratch + static_cast<int64_t>(omp_get_thread_num()) * sch.scratch_floats;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < sch.num_items; ++i) {
      HWY_DYNAMIC_DISPATCH(ProcessItem)(params, sch, sch.items[i], scratch);
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < sch.num_merges; ++i) merge_item(params, sch, sch.merges[i], scratch);
  }
}

const char* cpu_simd_target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

double cpu_stream_read_sum(const float* data, int64_t n, int num_threads) {
  const int nt = std::max(1, num_threads);
  (void)cpu_simd_target_name();
  double total = 0.0;
#pragma omp parallel num_threads(nt) reduction(+ : total)
  {
    const int64_t t = omp_get_thread_num();
    const int64_t chunk = (n + nt - 1) / nt;
    const int64_t begin = std::min(n, t * chunk);
    const int64_t end = std::min(n, begin + chunk);
    total += HWY_DYNAMIC_DISPATCH(StreamSum)(data + begin, end - begin);
  }
  return total;
}

}  // namespace pagoda::kernels::cpu
#endif  // HWY_ONCE
