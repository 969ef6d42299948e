#pragma once
/// Tensor-core split-KV paged MLA decode, absorbed form (Dqk = 576 = kv_lora_rank 512 + rope 64,
/// Dv = 512, one latent "kv head" shared by every q head), mma.sync m16n8k16, f32 accumulation.
///
/// One block = one work item (request, kv chunk [a, b)) x G groups of 16 q heads (G = 1 for
/// Hq <= 16, else 2: the MMA m rows; rows past Hq are zero and never written). 4 warps per group,
/// 64-key tiles. The latent tile [64 keys][576] is copied ONCE into shared memory (all warps
/// share the copy: 64 / (4G) keys each) by a multi-stage cp.async ring (page id looked up per
/// key, so any page size costs the same) and serves as K (all 576 columns) and V (its first 512)
/// for every group. Warp w of a group scores keys 16w .. 16w + 15 of each tile; per tile:
///   S_w = Q_g K_w^T (16 heads x 16 keys, 36 k-steps, Q and K through ldmatrix),
///   row maxima exchanged through shared memory (the group's warps then hold the same max m),
///   P = exp2(S - m) written to shared memory (bf16, 16 x 64 per group),
///   O_w += P V[:, 128w .. 128w + 127] (each warp owns 128 of the 512 output columns: 16 x 128
///   f32 accumulators per warp, no final cross-warp O merge; only the row sums l are summed).
/// fp8 e4m3 latent: the raw bytes are copied (half the traffic) and each warp widens the rows it
/// copied into a bf16 tile (exact, device_utils.cuh's widen16); k_scale is folded into the
/// logit transform and v_scale into the final factor. Keys past the chunk are zero-filled, so
/// NaN in unused slots never reaches the accumulators. Split chunks write (O / l, lse) partials
/// for the merge kernel; whole requests write the output (sinks, v_scale, LSE applied here).
///
/// Grid: work items x ceil(Hq / (16 G)) blocks in x (mla_block_coords: the head blocks of one item
/// adjacent); G = 2 exactly when mla_decode_heads_per_block(Hq) = 32.
/// Contract (checked by the host, mla_decode_usable): q/out bf16; latent bf16 or e4m3; Hkv = 1;
/// V is K's storage (same pointer and strides); rows 16-byte aligned; one query row per request.
/// Shared memory (G = 1 / 2): bf16 168,448 / 189,440 B, fp8 205,312 / 226,304 B (needs an
/// sm_90-class opt-in limit).

#include <type_traits>

#include "pagoda/kernels/cuda/decode_tc_kernel.cuh"
#include "pagoda/kernels/cuda/device_utils.cuh"

namespace pagoda::kernels::cuda::detail {

template <typename KV, int G>
struct MlaDecodeConfig {
  static constexpr int kDqk = 576, kDv = 512;
  static constexpr int kGroups = G;                               // 16-head groups per block
  static constexpr int kGroupWarps = 4;
  static constexpr int kWarps = kGroupWarps * G;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = 16;                                // q heads per group (MMA m)
  static constexpr int kHeads = kRows * G;                        // q heads per block
  static constexpr int kKeys = 64;                                // keys per tile
  static constexpr int kWarpKeys = kKeys / kGroupWarps;           // keys scored per warp
  static constexpr int kCopyKeys = kKeys / kWarps;                // keys copied per warp
  static constexpr int kWarpCols = kDv / kGroupWarps;             // output columns per warp
  static constexpr bool kConvert = !std::is_same_v<KV, __nv_bfloat16>;
  static constexpr int kRowBytes = kDqk * int(sizeof(KV));
  static constexpr int kRowChunks = kRowBytes / 16;               // 16-byte chunks per latent row
  static constexpr int kChunkElems = 16 / int(sizeof(KV));
  static constexpr int kCopies = kCopyKeys * kRowChunks / 32;     // cp.async per lane per tile
  static constexpr size_t kTileBytes = size_t(kKeys) * kRowBytes;
  static constexpr int kStages = kConvert ? 3 : 2;
  static constexpr size_t kQBytes = size_t(kHeads) * kDqk * 2;
  static constexpr size_t kPBytes = size_t(kHeads) * kKeys * 2;   // [G][16][64]
  static constexpr size_t kRedBytes = size_t(2) * kWarps * kRows * sizeof(float);
  static constexpr size_t kConvBytes = kConvert ? size_t(kKeys) * kDqk * 2 : 0;
  static constexpr size_t kSmemBytes =
      kQBytes + kPBytes + kRedBytes + kConvBytes + kStages * kTileBytes;
  static_assert(G == 1 || G == 2);
  static_assert(kWarpKeys == 16 && kWarpCols % 16 == 0 && kCopyKeys <= 16);
  static_assert(kCopyKeys * kRowChunks % 32 == 0 && kRowBytes % 16 == 0);
};

template <typename KV, int G>
__global__ void __launch_bounds__(128 * G, 1)
    mla_decode_kernel(AttentionArgs a, LogitTransform xf) {
  pdl_wait();  // reads the latent rows the previous kernel stored (pdl.cuh)
  pdl_launch_dependents();
  using T = __nv_bfloat16;
  using C = MlaDecodeConfig<KV, G>;
  constexpr int D = C::kDqk;
  constexpr int kS = C::kStages;
  extern __shared__ __align__(16) unsigned char smem[];

  const DevicePlan& plan = a.plan;
  int item = 0, hb = 0;
  // G = 1 runs exactly when Hq <= 16 (mla_decode_heads_per_block): one head block.
  mla_block_coords(G == 1 ? 1 : (a.num_qo_heads + C::kHeads - 1) / C::kHeads, item, hb);
  DecodeItem work;
  if (!load_decode_item(a, item, work)) return;
  const int b = work.b, kv_lo = work.kv_lo, n = work.n, partial = work.partial;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int grp = warp / C::kGroupWarps, wl = warp % C::kGroupWarps;  // group, warp in group
  const int quad = lane % 4;
  const int block_head0 = hb * C::kHeads;
  const int nb = min(C::kHeads, a.num_qo_heads - block_head0);   // q heads of this block
  const int head0 = block_head0 + grp * C::kRows;                 // this group's first head
  const int ng = max(0, min(C::kRows, a.num_qo_heads - head0));   // heads of this group
  const int row = plan.qo_indptr[b];
  const int32_t* pages = plan.kv_indices + plan.kv_indptr[b];

  T* qs = reinterpret_cast<T*>(smem);                             // [kHeads][576]
  T* ps = reinterpret_cast<T*>(smem + C::kQBytes) + grp * C::kRows * C::kKeys;  // group's P
  float* red_max = reinterpret_cast<float*>(smem + C::kQBytes + C::kPBytes);  // [kWarps][16]
  float* red_l = red_max + C::kWarps * C::kRows;                              // [kWarps][16]
  T* conv = reinterpret_cast<T*>(smem + C::kQBytes + C::kPBytes + C::kRedBytes);
  unsigned char* stages = smem + C::kQBytes + C::kPBytes + C::kRedBytes + C::kConvBytes;
  const T* qgrp = qs + grp * C::kRows * D;                        // rows 16g.. (multiple of 8)

  // ---- Q [kHeads][576] into shared memory (swizzled; rows past Hq are zero) ----
  const T* qg = static_cast<const T*>(a.q) + int64_t(row) * a.q_stride_n +
                int64_t(block_head0) * a.q_stride_h;
  for (int idx = tid; idx < C::kHeads * (D / 8); idx += C::kThreads) {
    const int r = idx / (D / 8), c = idx % (D / 8);
    uint4 v{0u, 0u, 0u, 0u};
    if (r < nb) v = *reinterpret_cast<const uint4*>(qg + int64_t(r) * a.q_stride_h + c * 8);
    *reinterpret_cast<uint4*>(qs + dtc_swz<D>(r, c)) = v;
  }

  const int ntiles = (n + C::kKeys - 1) / C::kKeys;
  const int ps_size = a.page_size;
  const KV* kg = static_cast<const KV*>(a.k.data);

  // Page id of this lane's key (lane % kCopyKeys of the warp's copied keys) in tile t; -1 = none.
  auto fetch_page = [&](int t) -> int {
    const int key = t * C::kKeys + warp * C::kCopyKeys + lane % C::kCopyKeys;
    return (t < ntiles && key < n) ? __ldg(pages + (kv_lo + key) / ps_size) : -1;
  };
  // Copies the warp's kCopyKeys latent rows of tile t; lanes < kCopyKeys resolve one row offset
  // each, shuffled to the lanes that copy its chunks (32 consecutive chunks per instruction).
  auto issue = [&](int t, int page) {
    int64_t off = -1;
    if (page >= 0) {
      const int key = t * C::kKeys + warp * C::kCopyKeys + lane % C::kCopyKeys;
      off = int64_t(page) * a.k.page_stride + int64_t((kv_lo + key) % ps_size) * a.k.token_stride;
    }
    unsigned char* dst = stages + (t % kS) * C::kTileBytes;
#pragma unroll
    for (int j = 0; j < C::kCopies; ++j) {
      const int idx = lane + 32 * j;
      const int r = idx / C::kRowChunks, c = idx % C::kRowChunks;
      const int64_t o = __shfl_sync(0xffffffffu, off, r);
      const int rr = warp * C::kCopyKeys + r;
      const int db = C::kConvert ? rr * C::kRowBytes + c * 16 : dtc_swz<D>(rr, c) * 2;
      cp_async16(dst + db, o < 0 ? kg : kg + o + c * C::kChunkElems, o >= 0);
    }
  };

  float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f};
  float o[C::kWarpCols / 8][4];
#pragma unroll
  for (int i = 0; i < C::kWarpCols / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;

#pragma unroll
  for (int s = 0; s < kS - 1; ++s) {
    if (s < ntiles) issue(s, fetch_page(s));
    cp_async_commit();
  }
  int pg = fetch_page(kS - 1);

  for (int t = 0; t < ntiles; ++t) {
    cp_async_wait<kS - 2>();  // this thread's copies of tile t have landed
    __syncthreads();          // ... everyone's; and every warp is done with tile t - 1
    const int nx = t + kS - 1;
    if (nx < ntiles) issue(nx, pg);  // into the stage tile t - 1 used
    cp_async_commit();
    pg = fetch_page(nx + 1);

    const T* kt;
    if constexpr (C::kConvert) {
      // Widen the rows this warp copied into the bf16 tile. G = 1: they are the rows it scores
      // (a warp barrier suffices); G = 2: other warps score them (block barrier).
      const auto* raw = stages + (t % kS) * C::kTileBytes;
#pragma unroll
      for (int j = 0; j < C::kCopies; ++j) {
        const int idx = lane + 32 * j;
        const int r = warp * C::kCopyKeys + idx / C::kRowChunks, c = idx % C::kRowChunks;
        const int sw = (c >> 2) & 1;  // lanes with c % 8 >= 4 store the high half first
        uint4 lo, hi;
        widen16<T>(*reinterpret_cast<const uint4*>(raw + r * C::kRowBytes + c * 16), lo, hi);
        *reinterpret_cast<uint4*>(conv + dtc_swz<D>(r, 2 * c + sw)) = sw ? hi : lo;
        *reinterpret_cast<uint4*>(conv + dtc_swz<D>(r, 2 * c + 1 - sw)) = sw ? lo : hi;
      }
      if constexpr (G == 1) {
        __syncwarp();
      } else {
        __syncthreads();
      }
      kt = conv;
    } else {
      kt = reinterpret_cast<const T*>(stages + (t % kS) * C::kTileBytes);
    }

    // S = Q_g K_w^T: the group's 16 heads x the warp's 16 keys; even and odd k-steps accumulate
    // separately (four independent MMA chains instead of two 36-long ones), summed afterwards.
    float s[2][4], s2[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = s2[j][e] = 0.f;
    }
    const int krow = wl * C::kWarpKeys + (lane / 16) * 8 + lane % 8;
#pragma unroll 3
    for (int kk = 0; kk < D / 16; kk += 2) {
      uint32_t qf[4], kb[4], qf2[4], kb2[4];
      ldmatrix_x4(qf, qgrp + dtc_swz<D>(lane % 16, kk * 2 + lane / 16));
      ldmatrix_x4(kb, kt + dtc_swz<D>(krow, kk * 2 + (lane / 8) % 2));
      ldmatrix_x4(qf2, qgrp + dtc_swz<D>(lane % 16, kk * 2 + 2 + lane / 16));
      ldmatrix_x4(kb2, kt + dtc_swz<D>(krow, kk * 2 + 2 + (lane / 8) % 2));
      mma16816<T>(s[0], qf, kb[0], kb[1]);
      mma16816<T>(s[1], qf, kb[2], kb[3]);
      mma16816<T>(s2[0], qf2, kb2[0], kb2[1]);
      mma16816<T>(s2[1], qf2, kb2[2], kb2[3]);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] += s2[j][e];
    }
    transform_logits16(s, t * C::kKeys + wl * C::kWarpKeys, n, quad, xf);
    // Row maxima over the whole 64-key tile (rows = heads; a row lives in one quad per warp).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      if (quad == 0) red_max[warp * C::kRows + lane / 4 + 8 * h] = mx;
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = lane / 4 + 8 * h;
      float mx = m[h];
#pragma unroll
      for (int w = 0; w < C::kGroupWarps; ++w) {
        mx = fmaxf(mx, red_max[(grp * C::kGroupWarps + w) * C::kRows + r]);
      }
      const float scale = exp2_diff(m[h], mx);
      m[h] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        s[j][2 * h] = exp2_diff(s[j][2 * h], mx);
        s[j][2 * h + 1] = exp2_diff(s[j][2 * h + 1], mx);
        sum += s[j][2 * h] + s[j][2 * h + 1];
        *reinterpret_cast<uint32_t*>(ps + dtc_swz<C::kKeys>(r, wl * 2 + j) + 2 * quad) =
            pack2<T>(s[j][2 * h], s[j][2 * h + 1]);
      }
      l[h] = l[h] * scale + sum;  // this lane's keys only; summed over lanes and warps at the end
#pragma unroll
      for (int d = 0; d < C::kWarpCols / 8; ++d) {
        o[d][2 * h] *= scale;
        o[d][2 * h + 1] *= scale;
      }
    }
    __syncthreads();  // P complete; every row of the tile (fp8: widened) visible

    // O_w += P V[:, the warp's 128 columns].
#pragma unroll
    for (int k2 = 0; k2 < C::kKeys / 16; ++k2) {
      uint32_t pa[4];
      ldmatrix_x4(pa, ps + dtc_swz<C::kKeys>(lane % 16, k2 * 2 + lane / 16));
      const int vrow = k2 * 16 + lane % 8 + ((lane / 8) % 2) * 8;
#pragma unroll
      for (int j = 0; j < C::kWarpCols / 16; ++j) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, kt + dtc_swz<D>(vrow, wl * (C::kWarpCols / 8) + 2 * j + lane / 16));
        mma16816<T>(o[2 * j], pa, vb[0], vb[1]);
        mma16816<T>(o[2 * j + 1], pa, vb[2], vb[3]);
      }
    }
  }
  cp_async_wait<0>();

  // ---- row sums over lanes and the group's warps (m is the same in all of them) ----
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    if (quad == 0) red_l[warp * C::kRows + lane / 4 + 8 * h] = l[h];
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = lane / 4 + 8 * h;
    if (r >= ng) continue;
    float lsum = 0.f;
#pragma unroll
    for (int w = 0; w < C::kGroupWarps; ++w) lsum += red_l[(grp * C::kGroupWarps + w) * C::kRows + r];
    const int head = head0 + r;
    const int col0 = wl * C::kWarpCols + 2 * quad;
    if (partial < 0) {
      float lse;
      const float f = finalize_state(m[h], lsum, a.sinks, head, a.v_scale, lse);
      T* op = static_cast<T*>(a.out) + int64_t(row) * a.o_stride_n + int64_t(head) * a.o_stride_h;
#pragma unroll
      for (int d = 0; d < C::kWarpCols / 8; ++d) {
        *reinterpret_cast<uint32_t*>(op + col0 + 8 * d) =
            pack2<T>(o[d][2 * h] * f, o[d][2 * h + 1] * f);
      }
      if (wl == 0 && quad == 0 && a.lse != nullptr) {
        a.lse[int64_t(row) * a.lse_stride_n + int64_t(head) * a.lse_stride_h] = lse;
      }
    } else {
      const bool empty = m[h] == neg_inf() || lsum <= 0.f;
      const float f = empty ? 0.f : a.v_scale / lsum;
      const size_t base = size_t(partial) * a.num_qo_heads + head;
      float* po = a.partial_o + base * C::kDv + col0;
#pragma unroll
      for (int d = 0; d < C::kWarpCols / 8; ++d) {
        *reinterpret_cast<float2*>(po + 8 * d) = make_float2(o[d][2 * h] * f, o[d][2 * h + 1] * f);
      }
      if (wl == 0 && quad == 0) a.partial_lse[base] = empty ? neg_inf() : m[h] + log2f(lsum);
    }
  }
}

}  // namespace pagoda::kernels::cuda::detail
