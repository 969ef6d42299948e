#pragma once
/// Hopper (sm_90a) paged MLA decode for few q heads (h_q <= 16: DeepSeek's 128 heads under
/// tensor parallelism 8 and up), absorbed form (Dqk 576, Dv 512, one latent head), transposed so
/// that the keys, not the heads, fill the wgmma's 64 rows:
///   S^T [64 keys][16 heads] = K Q^T      wgmma m64n16k16 x 36 (K tile and Q from shared memory)
///   O^T [512][16 heads]    += V^T P^T    wgmma m64n16k16 x 4 per 64 output columns, V^T
///                                        MN-major (transpose bit), P^T K-major (P [16][64]).
/// The 64-row kernel (mla_decode_sm90_kernel.cuh) runs h_q 16 with 48 of its 64 rows empty:
/// each 64-key tile costs it 8.9 MFLOP of wgmma where the heads need 2.2. Arithmetic on the
/// H200 times (bench/results/mla_h200.md, 31227eb; not a profile): with bf16 latents at h_q 16
/// a tile took it ~3.0 us (B64 L4096 0.092 ms, merge included, over ~31 tiles per SM), longer
/// than the ~2.4 us the same GEMMs took per tile at h_q 128 (B128 L4096 0.297 ms over ~124), so
/// HBM (78 % of copy bandwidth), not its consumers, bounds bf16 there. An e4m3 tile is half the
/// bytes (~1.5 us of HBM at that rate), which those consumers could not keep up with: fp8
/// latents are this kernel's case. Here a tile costs 2.2 MFLOP and one consumer warpgroup, which
/// also gives its stage back sooner (two-stage ring) at bf16.
///
/// One block = one work item (request, kv chunk, load_decode_item) x 16 q heads (rows past Hq
/// zero, never written); 256 threads:
///  * warpgroup 0, producer: the 64-row kernel's (mla_sm90_bf16_producer, or for an e4m3 latent
///    mla_sm90_fp8_producer, which widens each tile in place): the same tiles [9][64 keys][128 B]
///    in the same two stages, published on `full`.
///  * warpgroup 1, consumer (warp w holds keys 16w .. 16w + 15 of S^T and output columns
///    64 mb + 16w .. of O^T; thread (w, lane) the heads 8j + 2 (lane % 4) + e): per tile,
///    S^T; per head, the column maximum over the tile's keys (shuffles, then the 4 warps through
///    shared memory); lazy rescaling (m, O and l move when a head's max grows by more than
///    kLazyRescale, as the 64-row kernel's TMA path); P = exp2(S - m) stored as bf16 into P
///    [16 heads][64 keys] (128B-swizzled, K-major for the B operand); O^T += V^T P^T; then the
///    stage is freed. Each thread sums l over its own keys; the sums meet at the end.
/// Split chunks write (O / l, lse) partials for the merge kernel; whole requests write the output
/// (sinks, v_scale and LSE applied here).
///
/// Shared memory (bytes, 1024-aligned): Q [9][16][128 B] 18,432, two stages 147,456, P 2,048,
/// row maxima and sums 512, mbarriers 48: 168,496 + alignment.
/// Contract: that of mla_decode_sm90_kernel (q/out bf16, latent bf16 or e4m3, Hkv 1, V is K's
/// storage, rows 16-byte aligned, one query row per request), and Hq <= 16 per block of heads.

#include "pagoda/kernels/cuda/mla_decode_sm90_kernel.cuh"

namespace pagoda::kernels::cuda::detail {

struct MlaSm90SmallConfig {
  static constexpr int kHeads = kMlaSm90SmallHeads;  // q heads per block (wgmma N)
  static constexpr int kThreads = 256;
  static constexpr int kWarps = 4;                       // of the consumer warpgroup
  static constexpr uint32_t kQAtomBytes = kHeads * 128;  // one 16-row atom column of Q
  static constexpr uint32_t kQBytes = MlaSm90Config::kAtoms * kQAtomBytes;
  static constexpr uint32_t kPBytes = kHeads * MlaSm90Config::kKeys * 2;
  static constexpr uint32_t kRedBytes = 2 * kWarps * kHeads * 4;         // [max, sum][warp][head]
  static constexpr uint32_t kBarBytes = 3 * MlaSm90Config::kStages * 8;  // full, empty, landed
  static constexpr size_t kSmemBytes = 1024 + kQBytes +
                                       MlaSm90Config::kStages * MlaSm90Config::kTileBytes +
                                       kPBytes + kRedBytes + kBarBytes;
  static_assert(kHeads == 16, "wgmma N and the thread -> head map below");
  static_assert(kQBytes % 1024 == 0, "the stages start on the swizzle pattern's period");
  static_assert(kSmemBytes <= 232448, "over the sm_90 shared-memory limit per block");
};

/// kTma / kFp8: as mla_decode_sm90_kernel's.
template <bool kTma, bool kFp8>
__global__ void __launch_bounds__(256, 1)
    mla_decode_sm90_small_kernel(AttentionArgs a, LogitTransform xf,
                                 const __grid_constant__ MlaSm90Map map) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  pdl_wait();  // reads the latent rows the previous kernel stored (pdl.cuh)
  pdl_launch_dependents();
  using T = __nv_bfloat16;
  using C = MlaSm90Config;
  using S = MlaSm90SmallConfig;
  constexpr int kS = C::kStages;
  constexpr uint32_t kAtomBytes = C::kKeys * 128;  // one 64-key atom column of a tile
  constexpr int kMb = C::kDv / 64;                 // 64-column blocks of O^T (8)

  int item = 0, hb = 0;
  mla_block_coords((a.num_qo_heads + S::kHeads - 1) / S::kHeads, item, hb);
  DecodeItem work;
  if (!load_decode_item(a, item, work)) return;
  const int b = work.b, kv_lo = work.kv_lo, n = work.n, partial = work.partial;
  const int ntiles = (n + C::kKeys - 1) / C::kKeys;

  extern __shared__ unsigned char smem_raw[];
  const MlaSm90Smem<S> sm(smem_raw);
  const uint32_t q_addr = sm.q_addr, kv_addr = sm.kv_addr, p_addr = sm.p_addr;
  unsigned char* p_smem = sm.p;
  float *red_max = sm.red_max, *red_sum = sm.red_sum;  // [warp][head] each
  uint64_t *full = sm.full, *empty = sm.empty, *landed = sm.landed;

  const int tid = threadIdx.x;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0), t128 = tid % 128;  // wg: warp-uniform
  const int warp = t128 / 32, lane = tid % 32;
  if (tid == 0) mla_sm90_init_barriers<kFp8>(full, empty, landed, 128);  // one consumer
  __syncthreads();

  const int32_t* pages = a.plan.kv_indices + a.plan.kv_indptr[b];
  if (wg == 0) {
    mla_sm90_producer<kTma, kFp8>(a, map, pages, kv_lo, n, ntiles, kv_addr, full, empty, landed,
                                  t128);
    return;
  }

  // ================= consumer =================
  const int quad = lane % 4;
  const int block_head0 = hb * S::kHeads;
  const int nb = min(S::kHeads, a.num_qo_heads - block_head0);  // q heads of this block
  const int row = a.plan.qo_indptr[b];
  // This thread's heads (columns of S^T and O^T): u = 2j + e -> 8j + 2 quad + e.
  auto head_of = [&](int u) { return 8 * (u >> 1) + 2 * quad + (u & 1); };

  // Q [9][16 heads][128 B]; heads past Hq are zero.
  mla_sm90_load_q<S::kHeads, 128>(a, row, block_head0, nb, q_addr, t128);
  named_bar_sync(1, 128);

  float m[4], l[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) m[u] = neg_inf(), l[u] = 0.f;
  float o[kMb][8];
#pragma unroll
  for (int mb = 0; mb < kMb; ++mb) {
#pragma unroll
    for (int i = 0; i < 8; ++i) o[mb][i] = 0.f;
  }

  const uint64_t q_desc = sw128_desc(q_addr, 16, 1024);  // operand descriptors (desc_advance)
  const uint64_t p_desc = sw128_desc(p_addr, 16, 1024);
  for (int t = 0; t < ntiles; ++t) {
    const int s = t % kS;
    mbar_wait(&full[s], (t / kS) & 1);
    fence_proxy_async();  // the producer's landed copies, before this thread's wgmma reads
    const uint32_t k_addr = kv_addr + s * C::kTileBytes;
    // ---- S^T = K Q^T ----
    const uint64_t k_desc = sw128_desc(k_addr, 16, 1024);
    float sc[8];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::kDqk / 16; ++kk) {
      const uint32_t sub = (kk % 4) * 32;
      wgmma_ss<T, 16>(sc, desc_advance(k_desc, (kk / 4) * kAtomBytes + sub),
                      desc_advance(q_desc, (kk / 4) * S::kQAtomBytes + sub), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(sc);
    // sc[4j + 2h + e]: key 16 warp + 8h + lane / 4 of the tile, head 8j + 2 quad + e.
    const int key0 = t * C::kKeys + 16 * warp + lane / 4;
    float mx[4] = {neg_inf(), neg_inf(), neg_inf(), neg_inf()};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int u = 2 * (i >> 2) + (i & 1);
      sc[i] = key0 + 8 * ((i >> 1) & 1) < n ? xf(sc[i]) : neg_inf();
      mx[u] = fmaxf(mx[u], sc[i]);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      mx[u] = fmaxf(mx[u], __shfl_xor_sync(0xffffffffu, mx[u], 4));
      mx[u] = fmaxf(mx[u], __shfl_xor_sync(0xffffffffu, mx[u], 8));
      mx[u] = fmaxf(mx[u], __shfl_xor_sync(0xffffffffu, mx[u], 16));
      if (lane < 4) red_max[warp * S::kHeads + head_of(u)] = mx[u];
    }
    named_bar_sync(1, 128);
    // Every thread holding a head reads the same four maxima, so they keep the same m.
    float alpha[4] = {1.f, 1.f, 1.f, 1.f}, mnew[4];
    bool grow = false;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      mnew[u] = m[u];
#pragma unroll
      for (int w = 0; w < S::kWarps; ++w)
        mnew[u] = fmaxf(mnew[u], red_max[w * S::kHeads + head_of(u)]);
      grow |= mnew[u] > m[u] + kLazyRescale;
    }
    if (grow) {
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        alpha[u] = exp2_diff(m[u], mnew[u]);
        m[u] = mnew[u];
      }
    }
    float sum[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int u = 2 * (i >> 2) + (i & 1), h = (i >> 1) & 1;
      const float p = exp2_diff(sc[i], m[u]);
      sum[u] += p;
      // P [head][key], K-major: key 16 warp + 8h + lane / 4 is chunk 2 warp + h, element lane / 4.
      *reinterpret_cast<T*>(p_smem + sw128_offset(head_of(u), 2 * warp + h) + 2 * (lane / 4)) =
          __float2bfloat16(p);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) l[u] = l[u] * alpha[u] + sum[u];
    if (grow) {
#pragma unroll
      for (int mb = 0; mb < kMb; ++mb) {
#pragma unroll
        for (int i = 0; i < 8; ++i) o[mb][i] *= alpha[2 * (i >> 2) + (i & 1)];
      }
    }
    fence_proxy_async();     // P (generic stores) before the wgmmas read it
    named_bar_sync(2, 128);  // all of P is in place
                             // ---- O^T += V^T P^T ----
#pragma unroll
    for (int mb = 0; mb < kMb; ++mb) fence_operands(o[mb]);
    wgmma_fence();
    const uint64_t v_desc = sw128_desc(k_addr, kAtomBytes, 1024);
#pragma unroll
    for (int mb = 0; mb < kMb; ++mb) {
#pragma unroll
      for (int k2 = 0; k2 < C::kKeys / 16; ++k2) {
        wgmma_ss_ta<T, 16>(o[mb], desc_advance(v_desc, mb * kAtomBytes + k2 * 16 * 128),
                           desc_advance(p_desc, k2 * 32));
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int mb = 0; mb < kMb; ++mb) fence_operands(o[mb]);
    mbar_arrive(&empty[s]);
  }

  // ---- l over the keys of every thread holding a head (m is the same in all of them) ----
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    l[u] += __shfl_xor_sync(0xffffffffu, l[u], 4);
    l[u] += __shfl_xor_sync(0xffffffffu, l[u], 8);
    l[u] += __shfl_xor_sync(0xffffffffu, l[u], 16);
    if (lane < 4) red_sum[warp * S::kHeads + head_of(u)] = l[u];
  }
  named_bar_sync(1, 128);
  // o[mb][4j + 2h + e]: output column 64 mb + 16 warp + 8h + lane / 4, head 8j + 2 quad + e.
  const int col0 = 16 * warp + lane / 4;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int r = head_of(u);
    if (r >= nb) continue;
    float lsum = 0.f;
#pragma unroll
    for (int w = 0; w < S::kWarps; ++w) lsum += red_sum[w * S::kHeads + r];
    const int head = block_head0 + r;
    const int i0 = 4 * (u >> 1) + (u & 1);  // o[mb][i0 + 2h]
    if (partial < 0) {
      float lse;
      const float f = finalize_state(m[u], lsum, a.sinks, head, a.v_scale, lse);
      T* op = static_cast<T*>(a.out) + int64_t(row) * a.o_stride_n + int64_t(head) * a.o_stride_h;
#pragma unroll
      for (int mb = 0; mb < kMb; ++mb) {
        op[64 * mb + col0] = __float2bfloat16(o[mb][i0] * f);
        op[64 * mb + col0 + 8] = __float2bfloat16(o[mb][i0 + 2] * f);
      }
      if (warp == 0 && lane < 4 && a.lse != nullptr) {
        a.lse[int64_t(row) * a.lse_stride_n + int64_t(head) * a.lse_stride_h] = lse;
      }
    } else {
      const bool none = m[u] == neg_inf() || lsum <= 0.f;
      const float f = none ? 0.f : a.v_scale / lsum;
      const size_t base = size_t(partial) * a.num_qo_heads + head;
      float* po = a.partial_o + base * C::kDv;
#pragma unroll
      for (int mb = 0; mb < kMb; ++mb) {
        po[64 * mb + col0] = o[mb][i0] * f;
        po[64 * mb + col0 + 8] = o[mb][i0 + 2] * f;
      }
      if (warp == 0 && lane < 4) a.partial_lse[base] = none ? neg_inf() : m[u] + log2f(lsum);
    }
  }
#else
  __trap();  // launched only where the sm_90a image exists (mla_decode_sm90_chosen)
#endif
}

}  // namespace pagoda::kernels::cuda::detail
