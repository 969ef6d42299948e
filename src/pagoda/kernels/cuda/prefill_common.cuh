#pragma once
/// Pieces the two prefill kernels (prefill_kernel: mma.sync; prefill_sm90_kernel: wgmma) share:
/// a work item's rows and key range, the mask of one 16-row score tile, the online softmax update
/// of one 16-row tile, and the output of one row. Score and output tiles use the m16n8 fragment
/// layout both instructions produce: s[j][2h + e] is row lane/4 + 8h, column 8j + 2(lane%4) + e.

#include "pagoda/kernels/cuda/device_utils.cuh"
#include "pagoda/kernels/cuda/fast_div.h"

namespace pagoda::kernels::cuda::detail {

/// A prefill work item: packed rows [r0, r0 + tile_rows) of request b (packed row r is query
/// token r / G, head hkv * G + r % G) and the keys [lo, hi) its rows can see.
/// Split-KV items (DevicePlan::counts[3] > 0) see only their chunk's keys and write partial
/// states (partial >= 0: slot of query token t = partial + t · nchunks) for the merge kernel.
struct PrefillWork {
  int b = 0, r0 = 0, q_begin = 0, rows = 0, qoff = 0, lo = 0, hi = 0, ntiles = 0;
  int partial = -1, nchunks = 1;
  MaskInfo mask;
};

/// G: the group size num_qo_heads / num_kv_heads, as an int or a FastDiv (fast_div.h).
template <typename GDiv>
__device__ __forceinline__ PrefillWork prefill_work(const AttentionArgs& a, int item, int tile_rows,
                                                    int tile_keys, const GDiv& G) {
  const DevicePlan& plan = a.plan;
  PrefillWork w;
  w.b = plan.item_req[item];
  w.r0 = plan.item_a[item] * tile_rows;
  w.q_begin = plan.qo_indptr[w.b];
  const int qo_len = plan.qo_indptr[w.b + 1] - w.q_begin;
  w.rows = qo_len * divisor(G);
  const int kv_len = kv_len_of(plan, w.b, a.page_size);
  w.mask.qo_len = qo_len;
  w.mask.kv_len = kv_len;
  w.mask.bits = plan.custom_mask != nullptr ? plan.custom_mask + plan.mask_indptr[w.b] : nullptr;
  w.mask.causal = a.causal;
  w.mask.window = a.window_left;
  if (w.mask.bits != nullptr && plan.mask_qpos != nullptr) {
    w.mask.qpos = plan.mask_qpos + w.q_begin;
  }
  w.qoff = kv_len - qo_len;  // query token t sits at kv position qoff + t
  const int t_first = div_by(w.r0, G);
  const int t_last = div_by(min(w.r0 + tile_rows, w.rows) - 1, G);
  w.hi = kv_len;
  if (w.mask.bits == nullptr && w.mask.causal) w.hi = min(kv_len, w.qoff + t_last + 1);
  // Under a custom mask every row sits at qpos >= free_cols - 1 (it sees those columns).
  if (w.mask.window >= 0) {
    const int free_cols = plan.mask_free_cols != nullptr ? plan.mask_free_cols[w.b] : 0;
    w.lo = max(0, (w.mask.bits != nullptr ? free_cols - 1 : w.qoff + t_first) - w.mask.window);
  }
  const int chunk = plan.counts[3];
  if (chunk > 0) {
    const int c = plan.item_b[item];
    w.lo = max(w.lo, c * chunk);
    w.hi = min(w.hi, (c + 1) * chunk);
    w.partial = plan.item_partial[item];
    w.nchunks = (kv_len + chunk - 1) / chunk;
  }
  w.ntiles = w.hi > w.lo ? (w.hi - w.lo + tile_keys - 1) / tile_keys : 0;
  return w;
}
__device__ __forceinline__ PrefillWork prefill_work(const AttentionArgs& a, int item, int tile_rows,
                                                    int tile_keys) {
  return prefill_work(a, item, tile_rows, tile_keys, a.num_qo_heads / a.num_kv_heads);
}

/// Leading key tiles of [lo, hi) (tiles of tile_keys keys from lo) inside the columns every row
/// of request b's custom mask sees (DevicePlan::mask_free_cols, a tree verify's prefix): they
/// run as unmasked tiles. 0 without a custom mask.
__device__ __forceinline__ int mask_free_tiles(const DevicePlan& plan, const MaskInfo& mask, int b,
                                               int lo, int hi, int tile_keys) {
  return mask.bits != nullptr && plan.mask_free_cols != nullptr
             ? max(0, (min(hi, plan.mask_free_cols[b]) - lo) / tile_keys)
             : 0;
}

/// Sets hidden logits of one 16-row tile to -inf: keys >= hi, rows >= rows, and what `mk` hides.
/// `pr0` is the tile's first packed row.
/// kInterval: hide_row_keys (mask_rows.h) per row: one interval of keys, two compares with
/// constant offsets and a select per logit, and with a custom mask its bits from the kNT + 1
/// bytes of the row's mask that hold this lane's 2 kNT keys. The per-logit MaskInfo::visible, with its
/// branches and a byte load per logit, took 2,374 SASS instructions in the sm90 kernel, of which
/// a warp ran ~1,120 on each diagonal tile of a causal unit, against ~460 for all of a full tile
/// (ncu, H200, B16 S1024: 19.7 % of the stall samples).
/// kInterval = false keeps the per-logit test: the mma.sync kernel uses it, since with the
/// interval path its sm_90a instantiations (fp8 KV at D 128) spilled 76 bytes instead of 16
/// (ptxas; its sm_80 ones spilled less, not measured on a GPU).
template <bool kInterval, int kNT, typename GDiv>
__device__ __forceinline__ void mask_tile(float (&s)[kNT][4], int pr0, const GDiv& G, int kb0,
                                          int hi, int rows, const MaskInfo& mk, int lane) {
  if constexpr (kInterval) {
    const int c0 = kb0 + (lane % 4) * 2;  // key of s[0][2h]; s[j][2h + e] holds key c0 + 8j + e
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      hide_row_keys<kNT>(mk, pr0 + lane / 4 + h * 8, G, c0, hi, rows,
                         [&](int j, int e) { s[j][2 * h + e] = neg_inf(); });
    }
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int pr = pr0 + lane / 4 + h * 8;
      const int tok = div_by(pr, G);
      // MaskInfo::visible with the row's window start read once (a custom mask's is a load).
      const int lo = pr < rows && mk.window >= 0 ? mk.window_start(tok) : kb0;
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int kj = kb0 + j * 8 + (lane % 4) * 2 + e;
          if (kj >= hi || pr >= rows || kj < lo || !mk.unwindowed(tok, kj)) {
            s[j][2 * h + e] = neg_inf();
          }
        }
      }
    }
  }
}

/// Row maxima of one 16-row tile (a quad of lanes shares a row), times `scale`, into mx; returns
/// whether a row's maximum exceeds its running max m by more than kLazyRescale (this lane's
/// rows only). Warp-collective.
template <int kNT>
__device__ __forceinline__ bool tile_row_max(const float (&s)[kNT][4], float scale,
                                             const float (&m)[2], float (&mx)[2]) {
  bool grow = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float x = neg_inf();
#pragma unroll
    for (int j = 0; j < kNT; ++j) x = fmaxf(x, fmaxf(s[j][2 * h], s[j][2 * h + 1]));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
    mx[h] = x * scale;
    grow |= mx[h] > m[h] + kLazyRescale;
  }
  return grow;
}

/// s becomes p = 2^(s * scale - m) and l gains the row sums of p (m = -inf: every p is 0).
template <int kNT>
__device__ __forceinline__ void tile_exp_rows(float (&s)[kNT][4], const float (&m)[2],
                                              float (&l)[2], float scale) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float msafe = m[h] == neg_inf() ? 0.f : m[h];  // all hidden: exp2 -> 0
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      s[j][2 * h] = exp2f(fmaf(s[j][2 * h], scale, -msafe));
      s[j][2 * h + 1] = exp2f(fmaf(s[j][2 * h + 1], scale, -msafe));
      sum += s[j][2 * h] + s[j][2 * h + 1];
    }
    l[h] += sum;
  }
}

/// Moves the running max m to max(m, mx) and scales l by the factors alpha = 2^(m_old - m_new)
/// (m = -inf: the factor of a row that saw nothing yet is 0, l is 0 anyway).
__device__ __forceinline__ void move_row_max(float (&m)[2], float (&l)[2], const float (&mx)[2],
                                             float (&alpha)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float mnew = fmaxf(m[h], mx[h]);
    alpha[h] = exp2f(m[h] - (mnew == neg_inf() ? 0.f : mnew));
    m[h] = mnew;
    l[h] *= alpha[h];
  }
}

/// O rows times the factors move_row_max left in `alpha` (h = 0: rows lane / 4, h = 1: + 8).
template <int kDT>
__device__ __forceinline__ void rescale_rows(float (&o)[kDT][4], const float (&alpha)[2]) {
#pragma unroll
  for (int d = 0; d < kDT; ++d) {
    o[d][0] *= alpha[0];
    o[d][1] *= alpha[0];
    o[d][2] *= alpha[1];
    o[d][3] *= alpha[1];
  }
}

/// Online softmax of one 16-row tile (a quad of lanes shares a row), in base 2 with `scale`
/// folded into the exponent's FFMA; s becomes p = 2^(s * scale - m). Lazy rescaling: the
/// running max m only moves (and O, l are rescaled) when some row of the warp sees a logit above
/// m + kLazyRescale; the final normalisation uses the same m, so the result is unchanged.
/// Warp-collective.
template <int kNT, int kDT>
__device__ __forceinline__ void softmax_tile(float (&s)[kNT][4], float (&m)[2], float (&l)[2],
                                             float (&o)[kDT][4], float scale) {
  float mx[2];
  if (__any_sync(0xffffffffu, tile_row_max(s, scale, m, mx))) {
    float alpha[2];
    move_row_max(m, l, mx, alpha);
    rescale_rows(o, alpha);
  }
  tile_exp_rows(s, m, l, scale);
}

/// softmax_tile for an O that an in-flight wgmma still accumulates: O is not touched; when the
/// running max moves, the rows' factors go to `alpha` and the call returns true (warp-uniform),
/// and the caller multiplies O by them (rescale_rows) once the wgmma has landed.
template <int kNT>
__device__ __forceinline__ bool softmax_tile_deferred(float (&s)[kNT][4], float (&m)[2],
                                                      float (&l)[2], float scale,
                                                      float (&alpha)[2]) {
  float mx[2];
  const bool moved = __any_sync(0xffffffffu, tile_row_max(s, scale, m, mx));
  if (moved) move_row_max(m, l, mx, alpha);
  tile_exp_rows(s, m, l, scale);
  return moved;
}

/// P of keys [16 k2, 16 k2 + 16) of a 16-row tile as the A operand of an m16n8k16 / m64nNk16
/// MMA (the same register fragment for mma.sync and wgmma).
template <typename T, int kNT>
__device__ __forceinline__ void p_fragment(uint32_t (&pa)[4], const float (&s)[kNT][4], int k2) {
  pa[0] = pack2<T>(s[2 * k2][0], s[2 * k2][1]);
  pa[1] = pack2<T>(s[2 * k2][2], s[2 * k2][3]);
  pa[2] = pack2<T>(s[2 * k2 + 1][0], s[2 * k2 + 1][1]);
  pa[3] = pack2<T>(s[2 * k2 + 1][2], s[2 * k2 + 1][3]);
}

/// Writes the rows of one 16-row output tile (packed rows pr0 + lane/4 + 8h) with the sink
/// folded in and the LSE when asked. Warp-collective (the l sums are reduced over each quad).
/// G: the group size, as an int or a FastDiv (fast_div.h); the overload without it divides.
template <typename T, int kDT, typename GDiv>
__device__ __forceinline__ void store_tile(const AttentionArgs& a, const PrefillWork& w, int hkv,
                                           int pr0, const float (&m)[2], const float (&l)[2],
                                           const float (&o)[kDT][4], int lane, const GDiv& gdiv) {
  const int G = divisor(gdiv);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float lsum = l[h];
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
    const int pr = pr0 + lane / 4 + h * 8;
    if (pr >= w.rows) continue;
    const int head = hkv * G + mod_by(pr, gdiv);
    if (w.partial >= 0) {  // split-KV: (O / l, lse) without the sink, for the merge kernel
      const bool empty = m[h] == neg_inf() || lsum <= 0.f;
      const float f = empty ? 0.f : a.v_scale / lsum;
      const size_t base = size_t(w.partial + div_by(pr, gdiv) * w.nchunks) * a.num_qo_heads + head;
      float* po = a.partial_o + base * a.head_dim_v;
#pragma unroll
      for (int d = 0; d < kDT; ++d) {
        *reinterpret_cast<float2*>(po + d * 8 + (lane % 4) * 2) =
            make_float2(o[d][2 * h] * f, o[d][2 * h + 1] * f);
      }
      if (lane % 4 == 0) a.partial_lse[base] = empty ? neg_inf() : m[h] + log2f(lsum);
      continue;
    }
    const int tok = w.q_begin + div_by(pr, gdiv);
    float lse;
    const float f = finalize_state(m[h], lsum, a.sinks, head, a.v_scale, lse);
    T* op = static_cast<T*>(a.out) + tok * a.o_stride_n + head * a.o_stride_h;
#pragma unroll
    for (int d = 0; d < kDT; ++d) {
      const uint32_t v = pack2<T>(o[d][2 * h] * f, o[d][2 * h + 1] * f);
      *reinterpret_cast<uint32_t*>(op + d * 8 + (lane % 4) * 2) = v;
    }
    if (a.lse != nullptr && lane % 4 == 0) {
      a.lse[tok * a.lse_stride_n + head * a.lse_stride_h] = lse;
    }
  }
}
template <typename T, int kDT>
__device__ __forceinline__ void store_tile(const AttentionArgs& a, const PrefillWork& w, int hkv,
                                           int pr0, const float (&m)[2], const float (&l)[2],
                                           const float (&o)[kDT][4], int lane) {
  store_tile<T, kDT>(a, w, hkv, pr0, m, l, o, lane, a.num_qo_heads / a.num_kv_heads);
}

}  // namespace pagoda::kernels::cuda::detail
