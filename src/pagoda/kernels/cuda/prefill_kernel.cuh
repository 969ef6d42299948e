#pragma once
/// Tensor-core paged flash attention (FA2 style, mma.sync m16n8k16, f32 accumulation).
///
/// One block = one work item (request, tile of prefill_rows_per_tile(D) packed rows) x one kv
/// head. Packed row r of a request is query token r / G and q head hkv * G + r % G
/// (G = Hq / Hkv), so every K/V tile loaded serves all G heads of the group (GQA head fusion).
/// 4 warps; each warp owns kMT m16 row tiles (32 rows for D <= 128, 16 for D = 256), so every
/// K/V fragment read from shared memory (ldmatrix / ldmatrix.trans) feeds kMT mma's. K/V tiles
/// are double-buffered in XOR-swizzled shared memory (cp.async for 16-bit KV; fp8 is converted
/// to the query type while staging). Page offsets of tile i+2 are fetched into registers during
/// tile i, so any page size (1 included) gathers per key row. Causal / window bounds skip whole
/// tiles per block and per warp; masks (bottom-right causal, window, packed custom bits, kv tail)
/// are evaluated only on tiles that need them for that warp; a custom mask's all-ones leading
/// columns (DevicePlan::mask_free_cols, a tree verify's prefix) need no per-logit bit tests.
/// Softmax in base 2 with the sm_scale * log2(e) factor folded into the exponent's FFMA; P stays
/// in registers as the A operand of P.V.

#include <type_traits>

#include "pagoda/kernels/cuda/device_utils.cuh"
#include "pagoda/kernels/cuda/pdl.cuh"
#include "pagoda/kernels/cuda/prefill_common.cuh"

namespace pagoda::kernels::cuda::detail {

template <typename T, typename KV, int D>
struct PrefillConfig {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMT = D <= 128 ? 2 : 1;          // m16 row tiles per warp
  static constexpr int kWarpRows = 16 * kMT;
  static constexpr int kRows = kWarps * kWarpRows;      // 128 (D <= 128) or 64 (D = 256)
  static constexpr int kKeys = D <= 128 ? 64 : 32;        // keys per staged K/V tile
  static constexpr int kSub = kKeys;                      // keys per softmax step
  static constexpr int kChunks = D / 8;                 // 16-byte chunks per row
  static constexpr size_t kQBytes = size_t(kRows) * D * sizeof(T);
  static constexpr size_t kKvBytes = size_t(kKeys) * D * sizeof(T);
  static constexpr size_t kSmemBytes = kQBytes + 4 * kKvBytes + 2 * kKeys * 2 * sizeof(int64_t);
  static_assert(kRows == prefill_rows_per_tile(D, false), "planner and kernel disagree on tile rows");
};

/// Offset of 16-byte chunk `c` of row `r` in a swizzled [rows][D] tile (in elements).
template <int D>
__device__ __forceinline__ int swz(int r, int c) {
  return (r * (D / 8) + (c ^ (r & 7))) * 8;
}

/// ldmatrix x4 (optionally transposed) from a 32-bit shared-memory address.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
/// Hides `x` from the optimiser so addresses derived from it are recomputed (two integer ops
/// per ldmatrix) instead of hoisted out of the key loop into registers the accumulators need.
__device__ __forceinline__ uint32_t opaque(uint32_t x) {
  asm volatile("" : "+r"(x));
  return x;
}

template <typename T, typename KV, int D>
__global__ void __launch_bounds__(128, 2) prefill_kernel(AttentionArgs a, LogitTransform xf) {
  pdl_wait();  // reads the K/V the previous kernel stored (pdl.cuh)
  pdl_launch_dependents();
  using Cfg = PrefillConfig<T, KV, D>;
  constexpr int kKeys = Cfg::kKeys;
  constexpr int kSub = Cfg::kSub;
  constexpr int kNT = kSub / 8;   // score n-tiles per warp and softmax step
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
  const PrefillWork work = prefill_work(a, item, Cfg::kRows, kKeys);
  const int b = work.b, r0 = work.r0, q_begin = work.q_begin, rows = work.rows;
  const int lo = work.lo, hi = work.hi, ntiles = work.ntiles;
  const MaskInfo& mask = work.mask;
  const int hkv = blockIdx.y;
  const int G = a.num_qo_heads / a.num_kv_heads;
  const int32_t* pages = plan.kv_indices + plan.kv_indptr[b];

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
#pragma unroll 2
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

  // ---- this warp's rows: kMT m16 tiles starting at packed row wr0 ----
  constexpr int kMT = Cfg::kMT;
  const int wr0 = r0 + warp * Cfg::kWarpRows;
  const bool warp_active = wr0 < rows;
  const int wt_first = wr0 / G;
  const int wt_last = (min(wr0 + Cfg::kWarpRows, rows) - 1) / G;
  const int qoff = work.qoff;  // query token t sits at kv position qoff + t
  // Keys this warp can see at all (tiles outside are skipped by the warp, not by the block).
  int whi = hi, wlo = lo;
  if (mask.bits == nullptr && mask.causal) whi = min(hi, qoff + wt_last + 1);
  if (mask.window >= 0 && mask.bits == nullptr) wlo = max(lo, qoff + wt_first - mask.window);
  // Base-2 logits: s * scale (no cap) or post * tanh(s * pre) (cap, applied in place first).
  const bool capped = xf.cap > 0.f;
  const float scale = capped ? 1.f : xf.scale_log2;

  float m[kMT][2], l[kMT][2];
  float o[kMT][kDT][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    m[mt][0] = m[mt][1] = neg_inf();
    l[mt][0] = l[mt][1] = 0.f;
#pragma unroll
    for (int i = 0; i < kDT; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
  }

  if (ntiles > 0) {
    store_offsets(0, 0, fetch_page(0));
    const int p1 = fetch_page(1);
    __syncthreads();
    issue(0);
    cp_async_commit();
    store_offsets(1, 1, p1);
  }

  // Custom mask: the first nfree tiles lie inside the columns every row sees (host-computed
  // DevicePlan::mask_free_cols, a tree verify's prefix), so they run as unmasked tiles (causal
  // does not apply under a custom mask; the window, kv tail and rows still do). The two phases
  // are separate loop copies (phase unrolled), so the mask-free test costs no register in the
  // per-tile code (the D = 128 instantiations sit at 255 registers).
  const int nfree = mask_free_tiles(plan, mask, b, lo, hi, kKeys);
  int i = 0;
#pragma unroll
  for (int phase = 0; phase < 2; ++phase) {
  MaskInfo mk = mask;
  if (phase == 0) {
    mk.bits = nullptr;
    mk.causal = false;
  }
  for (; i < (phase == 0 ? nfree : ntiles); ++i) {
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

#pragma unroll 1
    for (int sub = 0; sub < kKeys / kSub; ++sub) {
    const int kb0 = lo + i * kKeys + sub * kSub;
    if (warp_active && kb0 < whi && kb0 + kSub > wlo) {
      // S = Q K^T for this warp's kMT x 16 rows x kKeys keys.
      float s[kMT][kNT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int j = 0; j < kNT; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
      // Swizzled fragment addresses: every ldmatrix row of this lane has row % 8 == lane % 8,
      // so chunk c of it sits at (c ^ (lane % 8)) and 16-element steps are XORs of the chunk.
      constexpr uint32_t kRowB = D * sizeof(T);
      const uint32_t y_q = opaque((lane / 16) ^ (lane % 8));        // Q and V lanes
      const uint32_t y_k = ((lane / 8) % 2) ^ (lane % 8);           // K lanes
      const uint32_t q_lane = smem_addr(qs) + (warp * Cfg::kWarpRows + lane % 16) * kRowB;
      const uint32_t k_lane = smem_addr(kbuf) + (buf * kKeys + sub * kSub) * kRowB +
                              ((lane / 16) * 8 + lane % 8) * kRowB;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t qa[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          ldsm_x4(qa[mt], q_lane + mt * 16 * kRowB + (((kk * 2) ^ y_q) << 4));
        }
#pragma unroll
        for (int j2 = 0; j2 < kNT / 2; ++j2) {
          uint32_t kb[4];
          ldsm_x4(kb, k_lane + j2 * 16 * kRowB + (((kk * 2) ^ y_k) << 4));
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma16816<T>(s[mt][2 * j2], qa[mt], kb[0], kb[1]);
            mma16816<T>(s[mt][2 * j2 + 1], qa[mt], kb[2], kb[3]);
          }
        }
      }

      // Mask only where some pair of this warp's rows x the tile's keys is hidden.
      // (A custom mask's window starts per row: its mask-free tiles are masked too.)
      const bool full = mk.bits == nullptr && kb0 + kSub <= hi &&
                        wr0 + Cfg::kWarpRows <= rows &&
                        (!mk.causal || kb0 + kSub - 1 <= qoff + wt_first) &&
                        (mk.window < 0 ||
                         (mask.bits == nullptr && kb0 >= qoff + wt_last - mk.window));
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        if (capped) {
#pragma unroll
          for (int j = 0; j < kNT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mt][j][e] = xf(s[mt][j][e]);
        }
        if (!full) mask_tile<false>(s[mt], wr0 + mt * 16, G, kb0, hi, rows, mk, lane);
      }
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) softmax_tile(s[mt], m[mt], l[mt], o[mt], scale);
      // O += P V, P taken from the S accumulators as the A operand (no shared-memory trip).
      const uint32_t v_lane = smem_addr(vbuf) + (buf * kKeys + sub * kSub) * kRowB +
                              (lane % 8 + ((lane / 8) % 2) * 8) * kRowB;
      const uint32_t y_v = opaque((lane / 16) ^ (lane % 8));
#pragma unroll
      for (int k2 = 0; k2 < kSub / 16; ++k2) {
        uint32_t pa[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) p_fragment<T>(pa[mt], s[mt], k2);
#pragma unroll
        for (int d2 = 0; d2 < kDT / 2; ++d2) {
          uint32_t vb[4];
          ldsm_x4_trans(vb, v_lane + k2 * 16 * kRowB + (((d2 * 2) ^ y_v) << 4));
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma16816<T>(o[mt][2 * d2], pa[mt], vb[0], vb[1]);
            mma16816<T>(o[mt][2 * d2 + 1], pa[mt], vb[2], vb[3]);
          }
        }
      }
    }
    }  // sub
    __syncthreads();  // everyone done with offsets[buf] and tile buffers
    store_offsets(i + 2, buf, pnext);
  }
  }  // phase
  cp_async_wait<0>();

  // ---- epilogue ----
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) store_tile<T>(a, work, hkv, wr0 + mt * 16, m[mt], l[mt], o[mt], lane);
}

}  // namespace pagoda::kernels::cuda::detail
