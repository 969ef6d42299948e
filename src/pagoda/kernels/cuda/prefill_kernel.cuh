#pragma once
/// Tensor-core paged flash attention (FA2 style, mma.sync m16n8k16, f32 accumulation).
///
/// One block = one work item (request, tile of 64 packed rows) x one kv head. Packed row r of a
/// request is query token r / G and q head hkv * G + r % G (G = Hq / Hkv), so every K/V tile
/// loaded serves all G heads of the group (GQA head fusion). 4 warps x 16 rows. K/V tiles are
/// double-buffered in XOR-swizzled shared memory (cp.async for 16-bit KV; fp8 is converted to
/// the query type while staging). Page offsets of tile i+2 are fetched into registers during
/// tile i. Masks (bottom-right causal, window, packed custom bits, kv tail) are evaluated only
/// on tiles that need them.

#include <type_traits>

#include "pagoda/kernels/cuda/device_utils.cuh"

namespace pagoda::kernels::cuda::detail {

template <typename T, typename KV, int D>
struct PrefillConfig {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = kPrefillRowsPerTile;  // 64
  static constexpr int kKeys = D <= 128 ? 64 : 32;
  static constexpr int kChunks = D / 8;                 // 16-byte chunks per row
  static constexpr size_t kQBytes = size_t(kRows) * D * sizeof(T);
  static constexpr size_t kKvBytes = size_t(kKeys) * D * sizeof(T);
  static constexpr size_t kSmemBytes = kQBytes + 4 * kKvBytes + 2 * kKeys * 2 * sizeof(int64_t);
};

/// Offset of 16-byte chunk `c` of row `r` in a swizzled [rows][D] tile (in elements).
template <int D>
__device__ __forceinline__ int swz(int r, int c) {
  return (r * (D / 8) + (c ^ (r & 7))) * 8;
}

template <typename T, typename KV, int D>
__global__ void __launch_bounds__(128) prefill_kernel(AttentionArgs a, LogitTransform xf) {
  using Cfg = PrefillConfig<T, KV, D>;
  constexpr int kKeys = Cfg::kKeys;
  constexpr int kNT = kKeys / 8;  // score n-tiles per warp
  constexpr int kDT = D / 8;      // output n-tiles per warp
  extern __shared__ __align__(16) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);
  T* kbuf = qs + Cfg::kRows * D;          // [2][kKeys][D]
  T* vbuf = kbuf + 2 * kKeys * D;         // [2][kKeys][D]
  int64_t* koff = reinterpret_cast<int64_t*>(vbuf + 2 * kKeys * D);  // [2][kKeys]
  int64_t* voff = koff + 2 * kKeys;                                   // [2][kKeys]

  const DevicePlan& plan = a.plan;
  const int item = blockIdx.x;
  if (item >= plan.counts[1]) return;
  const int b = plan.item_req[item];
  const int r0 = plan.item_a[item] * Cfg::kRows;
  const int hkv = blockIdx.y;
  const int G = a.num_qo_heads / a.num_kv_heads;
  const int q_begin = plan.qo_indptr[b];
  const int qo_len = plan.qo_indptr[b + 1] - q_begin;
  const int rows = qo_len * G;
  const int kv_len = kv_len_of(plan, b, a.page_size);
  const int32_t* pages = plan.kv_indices + plan.kv_indptr[b];
  MaskInfo mask;
  mask.qo_len = qo_len;
  mask.kv_len = kv_len;
  mask.bits = plan.custom_mask != nullptr ? plan.custom_mask + plan.mask_indptr[b] : nullptr;
  mask.causal = a.causal;
  mask.window = a.window_left;

  const int t_first = r0 / G;
  const int t_last = (min(r0 + Cfg::kRows, rows) - 1) / G;
  int lo = 0, hi = kv_len;
  if (mask.bits == nullptr && mask.causal) hi = min(kv_len, kv_len - qo_len + t_last + 1);
  if (mask.window >= 0) lo = max(0, kv_len - qo_len + t_first - mask.window);
  const int ntiles = hi > lo ? (hi - lo + kKeys - 1) / kKeys : 0;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int ps = a.page_size;

  // ---- Q tile (zero rows beyond the request) ----
  for (int idx = tid; idx < Cfg::kRows * Cfg::kChunks; idx += Cfg::kThreads) {
    const int r = idx / Cfg::kChunks, c = idx % Cfg::kChunks;
    const int pr = r0 + r;
    const bool ok = pr < rows;
    const T* src = static_cast<const T*>(a.q);
    if (ok) {
      src += (q_begin + pr / G) * a.q_stride_n + (hkv * G + pr % G) * a.q_stride_h + c * 8;
    }
    cp_async16(qs + swz<D>(r, c), src, ok);
  }
  cp_async_commit();

  // ---- K/V staging ----
  auto fetch_page = [&](int tile) -> int {
    const int kj = lo + tile * kKeys + tid;
    return (tid < kKeys && tile < ntiles && kj < hi) ? __ldg(pages + kj / ps) : -1;
  };
  auto store_offsets = [&](int tile, int buf, int page) {
    if (tid < kKeys) {
      const int kj = lo + tile * kKeys + tid;
      const int64_t o = kj % ps;
      koff[buf * kKeys + tid] = page < 0 ? -1 : page * a.k.page_stride + o * a.k.token_stride;
      voff[buf * kKeys + tid] = page < 0 ? -1 : page * a.v.page_stride + o * a.v.token_stride;
    }
  };
  const KV* kg = static_cast<const KV*>(a.k.data) + hkv * a.k.head_stride;
  const KV* vg = static_cast<const KV*>(a.v.data) + hkv * a.v.head_stride;
  auto issue = [&](int buf) {
    T* kd = kbuf + buf * kKeys * D;
    T* vd = vbuf + buf * kKeys * D;
    for (int idx = tid; idx < kKeys * Cfg::kChunks; idx += Cfg::kThreads) {
      const int r = idx / Cfg::kChunks, c = idx % Cfg::kChunks;
      const int64_t ko = koff[buf * kKeys + r], vo = voff[buf * kKeys + r];
      if constexpr (std::is_same_v<KV, T>) {
        cp_async16(kd + swz<D>(r, c), ko < 0 ? kg : kg + ko + c * 8, ko >= 0);
        cp_async16(vd + swz<D>(r, c), vo < 0 ? vg : vg + vo + c * 8, vo >= 0);
      } else {
        float f[8];
        uint4 out{0u, 0u, 0u, 0u};
        uint32_t* o32 = reinterpret_cast<uint32_t*>(&out);
        if (ko >= 0) {
          Vec8<KV>::unpack(*reinterpret_cast<const typename Vec8<KV>::Raw*>(kg + ko + c * 8), f);
#pragma unroll
          for (int e = 0; e < 4; ++e) o32[e] = pack2<T>(f[2 * e], f[2 * e + 1]);
        }
        *reinterpret_cast<uint4*>(kd + swz<D>(r, c)) = out;
        out = uint4{0u, 0u, 0u, 0u};
        if (vo >= 0) {
          Vec8<KV>::unpack(*reinterpret_cast<const typename Vec8<KV>::Raw*>(vg + vo + c * 8), f);
#pragma unroll
          for (int e = 0; e < 4; ++e) o32[e] = pack2<T>(f[2 * e], f[2 * e + 1]);
        }
        *reinterpret_cast<uint4*>(vd + swz<D>(r, c)) = out;
      }
    }
  };

  // Row bookkeeping of this thread: rows lane/4 and lane/4 + 8 of the warp's 16.
  int row_pr[2], row_tok[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_pr[h] = r0 + warp * 16 + lane / 4 + h * 8;
    row_tok[h] = row_pr[h] / G;
  }
  float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f};
  float o[kDT][4];
#pragma unroll
  for (int i = 0; i < kDT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;

  if (ntiles > 0) {
    store_offsets(0, 0, fetch_page(0));
    const int p1 = fetch_page(1);
    __syncthreads();
    issue(0);
    cp_async_commit();
    store_offsets(1, 1, p1);
  }

  for (int i = 0; i < ntiles; ++i) {
    const int buf = i & 1;
    __syncthreads();  // offsets of tile i+1 visible; buffers of tile i-1 free
    const bool more = i + 1 < ntiles;
    if (more) issue(buf ^ 1);
    cp_async_commit();
    const int pnext = fetch_page(i + 2);
    if (more) {
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

    // S = Q K^T for this warp's 16 rows x kKeys keys.
    float s[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
    const T* kt = kbuf + buf * kKeys * D;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[4];
      ldmatrix_x4(qa, qs + swz<D>(warp * 16 + lane % 16, kk * 2 + lane / 16));
#pragma unroll
      for (int j2 = 0; j2 < kNT / 2; ++j2) {
        uint32_t kb[4];
        ldmatrix_x4(kb, kt + swz<D>(j2 * 16 + (lane / 16) * 8 + lane % 8, kk * 2 + (lane / 8) % 2));
        mma16816<T>(s[2 * j2], qa, kb[0], kb[1]);
        mma16816<T>(s[2 * j2 + 1], qa, kb[2], kb[3]);
      }
    }

    const int kb0 = lo + i * kKeys;
    const bool full = mask.bits == nullptr && kb0 + kKeys <= hi &&
                      (!mask.causal || kb0 + kKeys - 1 <= kv_len - qo_len + t_first) &&
                      (mask.window < 0 || kb0 >= kv_len - qo_len + t_last - mask.window);
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = xf(s[j][e]);
        if (!full) {
          const int h = e / 2;
          const int kj = kb0 + j * 8 + (lane % 4) * 2 + (e & 1);
          if (kj >= hi || row_pr[h] >= rows || !mask.visible(row_tok[h], kj)) x = neg_inf();
        }
        s[j][e] = x;
      }
    }
    // Online softmax per row (quad of 4 lanes shares a row).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = m[h];
#pragma unroll
      for (int j = 0; j < kNT; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * h], s[j][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float scale = exp2_diff(m[h], mx);
      m[h] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        s[j][2 * h] = exp2_diff(s[j][2 * h], mx);
        s[j][2 * h + 1] = exp2_diff(s[j][2 * h + 1], mx);
        sum += s[j][2 * h] + s[j][2 * h + 1];
      }
      l[h] = l[h] * scale + sum;
#pragma unroll
      for (int d = 0; d < kDT; ++d) {
        o[d][2 * h] *= scale;
        o[d][2 * h + 1] *= scale;
      }
    }
    // O += P V.
    const T* vt = vbuf + buf * kKeys * D;
#pragma unroll
    for (int k2 = 0; k2 < kKeys / 16; ++k2) {
      uint32_t pa[4];
      pa[0] = pack2<T>(s[2 * k2][0], s[2 * k2][1]);
      pa[1] = pack2<T>(s[2 * k2][2], s[2 * k2][3]);
      pa[2] = pack2<T>(s[2 * k2 + 1][0], s[2 * k2 + 1][1]);
      pa[3] = pack2<T>(s[2 * k2 + 1][2], s[2 * k2 + 1][3]);
#pragma unroll
      for (int d2 = 0; d2 < kDT / 2; ++d2) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, vt + swz<D>(k2 * 16 + lane % 8 + ((lane / 8) % 2) * 8,
                                          d2 * 2 + lane / 16));
        mma16816<T>(o[2 * d2], pa, vb[0], vb[1]);
        mma16816<T>(o[2 * d2 + 1], pa, vb[2], vb[3]);
      }
    }
    __syncthreads();  // everyone done with offsets[buf] and tile buffers
    store_offsets(i + 2, buf, pnext);
  }
  cp_async_wait<0>();

  // ---- epilogue ----
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float lsum = l[h];
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
    if (row_pr[h] >= rows) continue;
    const int head = hkv * G + row_pr[h] % G;
    const int tok = q_begin + row_tok[h];
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

}  // namespace pagoda::kernels::cuda::detail
