#include "pagoda/kernels/cuda/dsa_indexer.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <numeric>

#include "pagoda/kernels/cuda/device_utils.cuh"
#include "pagoda/kernels/cuda/index_key.cuh"

namespace pagoda::kernels::cuda {
namespace {

namespace cg = cooperative_groups;
using detail::mma16816;

constexpr int kTile = 128;         // positions per scores tile
constexpr int kStages = 4;         // tiles in flight per block (cp.async)
constexpr int kScoreWarps = 8;     // scores block: 256 threads
constexpr int kHeadsPerWarp = 32;  // a warp's index heads: 4 n-tiles of 8
constexpr int kTopkThreads = 512;  // top-k block
constexpr int kMaxCluster = 8;     // top-k blocks per row (a thread-block cluster, sm_90)

__device__ __forceinline__ uint32_t f16_pair(__half lo, __half hi) {
  return static_cast<uint32_t>(__half_as_ushort(lo)) |
         (static_cast<uint32_t>(__half_as_ushort(hi)) << 16);
}

/// The four e4m3 codes of `x` as two f16 pairs (bytes 0, 1 -> lo; 2, 3 -> hi), exactly. A NaN
/// code may come out NaN on sm_89+ (the hardware conversion): the caller zeroes bytes that are
/// not key codes.
__device__ __forceinline__ void e4m3x4_to_f16(uint32_t x, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const __half2_raw a =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(x & 0xffffu), __NV_E4M3);
  const __half2_raw b =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(x >> 16), __NV_E4M3);
  lo = static_cast<uint32_t>(a.x) | (static_cast<uint32_t>(a.y) << 16);
  hi = static_cast<uint32_t>(b.x) | (static_cast<uint32_t>(b.y) << 16);
#else
  lo = detail::widen2<__half>(__byte_perm(x, 0u, 0x1404));
  hi = detail::widen2<__half>(__byte_perm(x, 0u, 0x3424));
#endif
}

/// 4-byte cp.async (the 16-byte one where a run's bytes allow it: cp_async16).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(detail::smem_addr(smem)),
               "l"(gmem));
}

/// Whether row t sees position p (p < visible is the caller's).
__device__ __forceinline__ bool tree_sees(const DsaIndexArgs& a, int t, int p) {
  if (a.tree_size == 0) return true;
  const int j = p - a.tree_begin[t];
  return j < 0 || a.tree_bits[static_cast<int64_t>(t) * a.tree_size + j] != 0;
}

/// The scores kernel's launch constants (host-computed, uniform over the launch).
struct ScoreLaunch {
  int run = 1;           ///< positions per run of consecutive slots (gcd(page_size, 64))
  int chunk = 4;         ///< bytes per cp.async (16 where every run is 16-byte aligned)
  int stage_bytes = 0;   ///< kTile * row_bytes
  int groups = 1;        ///< warps that share a 16-position m-tile (their heads): 1, 2 or 4
  int stage_region = 0;  ///< max(the stages, the prologue's query codes), 16-byte multiple
};

/// The pool slot of row t's position p (through the step's page table).
__device__ __forceinline__ int slot_of_position(const DsaIndexArgs& a, int t, int p) {
  const int page = p / a.page_size;
  return a.pages[a.page_begin[t] + page] * a.page_size + (p - page * a.page_size);
}

/// The first slot of row t's run at position p (-1: past the row's visible positions).
__device__ __forceinline__ int run_slot(const DsaIndexArgs& a, int t, int p) {
  return p < a.visible[t] ? slot_of_position(a, t, p) : -1;
}

/// Issues the copies of a tile's index rows (runs whose slot is >= 0) into `stage`, one group.
__device__ __forceinline__ void issue_tile(const DsaIndexArgs& a, const ScoreLaunch& L,
                                           const int* slot_s, unsigned char* stage) {
  const int run_bytes = L.run * static_cast<int>(a.row_bytes), per_run = run_bytes / L.chunk;
  const int total = (kTile / L.run) * per_run;
  for (int i = threadIdx.x; i < total; i += blockDim.x) {
    const int r = i / per_run, off = (i - r * per_run) * L.chunk;
    const int slot = slot_s[r];
    if (slot < 0) continue;
    const unsigned char* src = a.index_rows + static_cast<int64_t>(slot) * a.row_bytes + off;
    unsigned char* dst = stage + r * run_bytes + off;
    if (L.chunk == 16) {
      detail::cp_async16(dst, src, true);
    } else {
      cp_async4(dst, src);
    }
  }
  detail::cp_async_commit();
}

// Block (x: a strided set of 128-position tiles, y: row t), 8 warps. The MMA runs positions as M
// (the key codes are the A operand, 16 positions an m-tile) and index heads as N (the query
// codes, B): a warp owns 32 heads (B fragments in registers for the launch) and `groups` warps
// cover the heads of one m-tile, so each staged key is widened once per 32 heads.
// Prologue: the row's queries on the key grid (kv::quantize_index_key's rule: e4m3 codes, a
// power-of-two scale per head) as f16 codes (exact) in shared memory, the scale folded into the
// head's weight; each warp loads its B fragments. Then tiles in a kStages-deep cp.async
// pipeline: the raw index rows [128, row_bytes] land in shared memory (16-byte copies per run
// of consecutive slots); a warp computes D = codes_k · codes_qᵀ for its m-tiles (16 positions x
// 8 heads per m16n8k16, the key codes widened to f16, exact; a product of two e4m3 codes is
// exact in f32), ReLU, its heads' weights and their sum (the thread's 8 heads, then the quad);
// the groups' partial sums are added in group order, times the key's scale. The k dimension is
// permuted (thread quad c owns words [c·KS, (c+1)·KS) of a row, the same for A and B): one
// 4-byte read per row and k-step, off shared bank conflicts for 128-dim keys (rows of 33
// words).
template <int KS>
__global__ void __launch_bounds__(kScoreWarps * 32, 2)
    dsa_scores_kernel(DsaIndexArgs a, ScoreLaunch L) {
  constexpr int DP = KS * 16;
  extern __shared__ __align__(16) unsigned char smem[];
  float* w_s = reinterpret_cast<float*>(smem + L.stage_region);  // [kDsaMaxHeads]
  float* part_s = w_s + kDsaMaxHeads;                            // [4][kTile]
  int* slot_s = reinterpret_cast<int*>(part_s + 4 * kTile);      // [2][kTile]
  int* pro_s = slot_s + 2 * kTile;                               // [kStages][kTile]
  const int t = blockIdx.y, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;
  const int heads_pad = L.groups * kHeadsPerWarp, hg = warp % L.groups;
  const int mslot = warp / L.groups, mslots = kScoreWarps / L.groups;

  // ---- prologue: the row's queries on the key grid, as B fragments ----
  uint32_t B[4][KS][2];
  float wr[4][2];
  {
    auto* qc = reinterpret_cast<__half*>(smem);  // [heads_pad][DP] codes (aliases the stages)
    const float* q = a.q + static_cast<int64_t>(t) * a.heads * a.dim;
    for (int h = warp; h < heads_pad; h += kScoreWarps) {
      float amax = 0.f;
      if (h < a.heads)
        for (int d = lane; d < a.dim; d += 32) amax = fmaxf(amax, fabsf(q[h * a.dim + d]));
#pragma unroll
      for (int m = 16; m > 0; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
      const float scale = index_key_scale(amax);
      for (int d = lane; d < DP; d += 32) {
        float v = 0.f;
        if (h < a.heads && d < a.dim) {
          const __nv_fp8_storage_t code = index_key_code(q[h * a.dim + d], scale);
          v = __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));
        }
        qc[h * DP + d] = __float2half_rn(v);  // exact: an e4m3 value
      }
      if (lane == 0)
        w_s[h] = h < a.heads ? a.w[static_cast<int64_t>(t) * a.heads + h] * scale : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int h0 = hg * kHeadsPerWarp + nt * 8;
      const __half* row = qc + (h0 + g) * DP;
#pragma unroll
      for (int s = 0; s < KS; ++s) {
        const int d0 = 4 * (c * KS + s);
        B[nt][s][0] = f16_pair(row[d0], row[d0 + 1]);
        B[nt][s][1] = f16_pair(row[d0 + 2], row[d0 + 3]);
      }
      wr[nt][0] = w_s[h0 + 2 * c];
      wr[nt][1] = w_s[h0 + 2 * c + 1];
    }
  }
  // Words of a staged row past the codes (the scale, the next row) are zeroed, not widened.
  const int dim_words = a.dim / 4;

  // ---- the tile pipeline ----
  const int visible = a.visible[t], tiles = (visible + kTile - 1) / kTile;
  const int mine = tiles > static_cast<int>(blockIdx.x)
                       ? (tiles - static_cast<int>(blockIdx.x) + gridDim.x - 1) / gridDim.x
                       : 0;
  const int nruns = kTile / L.run;
  auto tile_p0 = [&](int i) { return (static_cast<int>(blockIdx.x) + i * gridDim.x) * kTile; };
  auto slot_of = [&](int i, int r) {
    return i < mine ? run_slot(a, t, tile_p0(i) + r * L.run) : -1;
  };
  auto stage = [&](int i) { return smem + (i % kStages) * L.stage_bytes; };
  for (int r = tid; r < nruns; r += blockDim.x)
    for (int j = 0; j < kStages; ++j) pro_s[j * kTile + r] = slot_of(j, r);
  __syncthreads();  // the run slots; every warp holds its B fragments (the stages reuse qc)
  for (int j = 0; j + 1 < kStages; ++j) issue_tile(a, L, pro_s + j * kTile, stage(j));
  for (int r = tid; r < nruns; r += blockDim.x)
    slot_s[((kStages - 1) & 1) * kTile + r] = pro_s[(kStages - 1) * kTile + r];
  // The slot of this thread's run in tile i + kStages + 1, loaded during tile i (tid < nruns).
  int pre = tid < nruns ? slot_of(kStages, tid) : -1;
  float* out = a.scores + static_cast<int64_t>(t) * a.max_visible;
  for (int i = 0; i < mine; ++i) {
    detail::cp_async_wait<kStages - 2>();  // tile i's group
    __syncthreads();  // tile i staged; the last tile's epilogue done; slot_s for tile i + 3
    issue_tile(a, L, slot_s + ((i + kStages - 1) & 1) * kTile, stage(i + kStages - 1));
    if (tid < nruns) {
      slot_s[((i + kStages) & 1) * kTile + tid] = pre;  // read at i + 1
      pre = slot_of(i + kStages + 1, tid);
    }
    const int p0 = tile_p0(i);
    const unsigned char* st = stage(i);
    for (int mt = mslot; mt < kTile / 16; mt += mslots) {
      float acc[4][4] = {};
      const auto* r0 = reinterpret_cast<const uint32_t*>(st + (16 * mt + g) * a.row_bytes);
      const auto* r1 = reinterpret_cast<const uint32_t*>(st + (16 * mt + g + 8) * a.row_bytes);
#pragma unroll
      for (int s = 0; s < KS; ++s) {
        const int word = c * KS + s;
        const bool in = word < dim_words;
        const uint32_t x0 = in ? r0[word] : 0u, x1 = in ? r1[word] : 0u;
        uint32_t A[4];
        e4m3x4_to_f16(x0, A[0], A[2]);  // row g: k 2c.. (bytes 0, 1), 2c + 8.. (2, 3)
        e4m3x4_to_f16(x1, A[1], A[3]);  // row g + 8
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) mma16816<__half>(acc[nt], A, B[nt][s][0], B[nt][s][1]);
      }
      // D: rows = positions g (d0, d1) and g + 8 (d2, d3); columns = heads 2c, 2c + 1.
      float lo = 0.f, hi = 0.f;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        lo += wr[nt][0] * fmaxf(acc[nt][0], 0.f) + wr[nt][1] * fmaxf(acc[nt][1], 0.f);
        hi += wr[nt][0] * fmaxf(acc[nt][2], 0.f) + wr[nt][1] * fmaxf(acc[nt][3], 0.f);
      }
#pragma unroll
      for (int m = 1; m < 4; m <<= 1) {
        lo += __shfl_xor_sync(0xffffffffu, lo, m);
        hi += __shfl_xor_sync(0xffffffffu, hi, m);
      }
      if (c == 0) {
        part_s[hg * kTile + 16 * mt + g] = lo;
        part_s[hg * kTile + 16 * mt + g + 8] = hi;
      }
    }
    __syncthreads();  // the partial sums
    for (int e = tid; e < kTile; e += blockDim.x) {
      const int p = p0 + e;
      if (p >= visible) continue;
      if (!tree_sees(a, t, p)) {
        out[p] = detail::neg_inf();
        continue;
      }
      float sum = 0.f;
      for (int k = 0; k < L.groups; ++k) sum += part_s[k * kTile + e];
      sum *= *reinterpret_cast<const float*>(st + e * a.row_bytes + a.dim);
      out[p] = sum == 0.f ? 0.f : sum;  // -0 -> +0
    }
  }
  detail::cp_async_wait<0>();  // no copy outlives the block
}

/// Order-preserving bits of a float (a larger key is a larger value; -inf below every finite).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float order_value(uint32_t u) {
  return __uint_as_float((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
}
/// Sort key: ascending = (score descending, position ascending).
__device__ __forceinline__ unsigned long long sort_key(uint32_t u, int p) {
  return (static_cast<unsigned long long>(~u) << 32) | static_cast<uint32_t>(p);
}

/// The blocks of one top-k row: a thread-block cluster on sm_90 (distributed shared memory),
/// one block elsewhere (the host launches clusters of 1 there).
struct RowBlocks {
  __device__ static unsigned rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return cg::this_cluster().block_rank();
#else
    return 0;
#endif
  }
  __device__ static unsigned size() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return cg::this_cluster().num_blocks();
#else
    return 1;
#endif
  }
  /// Every thread of every block of the row (and their shared-memory writes) past this point.
  __device__ static void sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cg::this_cluster().sync();
#else
    __syncthreads();
#endif
  }
  /// Block `r`'s copy of this block's shared variable `p`.
  template <typename T>
  __device__ static T* at(T* p, unsigned r) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return cg::this_cluster().map_shared_rank(p, r);
#else
    (void)r;
    return p;
#endif
  }
};

/// Appends `key` where `take` to the row's candidates (block 0's `cand`, counter `count`): one
/// atomic per warp; every lane of the warp calls it.
__device__ __forceinline__ void append_warp(bool take, unsigned long long key, uint32_t* count,
                                            unsigned long long* cand) {
  const uint32_t ballot = __ballot_sync(0xffffffffu, take);
  if (ballot == 0) return;
  const int lane = threadIdx.x % 32, leader = __ffs(ballot) - 1;
  uint32_t base = 0;
  if (lane == leader) base = atomicAdd(count, static_cast<uint32_t>(__popc(ballot)));
  base = __shfl_sync(0xffffffffu, base, leader);
  if (take) cand[base + __popc(ballot & ((1u << lane) - 1u))] = key;
}

// Row t = blockIdx.x / C: the C blocks of a cluster split the row's positions (contiguous
// ranges of a multiple of 32). Radix select over the three digits [31:21], [20:10], [9:0] of
// the order key: each block histograms its range, the row's totals are summed from every
// block's histogram (distributed shared memory), and every block walks the totals from the top
// to the bucket holding the keep-th best key. Then the keys above T = the keep-th best and the
// earliest ones equal to T are gathered into block 0 (the equal ones ranked by position:
// blocks in order, warps in order, lanes by ballot), which sorts them by (score descending,
// position ascending) and writes the row; -1 / -inf pad to k.
__global__ void __launch_bounds__(kTopkThreads) dsa_topk_kernel(DsaIndexArgs a) {
  extern __shared__ __align__(16) unsigned char topk_smem[];
  auto* cand = reinterpret_cast<unsigned long long*>(topk_smem);  // [kDsaMaxTopk]
  auto* hist = reinterpret_cast<uint32_t*>(cand + kDsaMaxTopk);   // [2048] this block's
  uint32_t* total = hist + 2048;                                  // [2048] the row's
  __shared__ uint32_t s_bucket, s_remaining, s_count, s_warp_eq[kTopkThreads / 32];
  const unsigned C = RowBlocks::size(), rank = RowBlocks::rank();
  const int t = static_cast<int>(blockIdx.x / C), tid = threadIdx.x, lane = tid % 32,
            warp = tid / 32;
  const int keep = min(a.k, a.seen[t]), n = a.visible[t];
  const int per = ((n + static_cast<int>(C) - 1) / static_cast<int>(C) + 31) / 32 * 32;
  const int begin = min(n, static_cast<int>(rank) * per), end = min(n, begin + per);
  const float* row = a.scores + static_cast<int64_t>(t) * a.max_visible;
  int32_t* out = a.topk + static_cast<int64_t>(t) * a.k;
  float* out_s = a.topk_scores + static_cast<int64_t>(t) * a.k;
  if (tid == 0) s_count = 0;
  if (keep > 0) {
    // `remaining` counts how many of the keys matching `prefix` on `mask` still belong to the
    // top `keep`.
    uint32_t prefix = 0, mask = 0, remaining = static_cast<uint32_t>(keep);
    constexpr int kShift[3] = {21, 10, 0}, kBits[3] = {11, 11, 10};
#pragma unroll
    for (int d = 0; d < 3; ++d) {
      const int shift = kShift[d], nb = 1 << kBits[d];
      for (int i = tid; i < nb; i += kTopkThreads) hist[i] = 0;
      __syncthreads();
      constexpr int kUnroll = 4;
      for (int p0 = begin + tid; p0 < end; p0 += kUnroll * kTopkThreads) {
        uint32_t u[kUnroll];
#pragma unroll
        for (int j = 0; j < kUnroll; ++j) {
          const int p = p0 + j * kTopkThreads;
          u[j] = p < end ? order_key(row[p]) : 0u;
        }
#pragma unroll
        for (int j = 0; j < kUnroll; ++j)
          if (p0 + j * kTopkThreads < end && (u[j] & mask) == prefix)
            atomicAdd(&hist[(u[j] >> shift) & (nb - 1)], 1u);
      }
      RowBlocks::sync();  // every block's histogram
      for (int i = tid; i < nb; i += kTopkThreads) {
        uint32_t sum = 0;
        for (unsigned r = 0; r < C; ++r) sum += RowBlocks::at(hist, r)[i];
        total[i] = sum;
      }
      RowBlocks::sync();  // the histograms read (the next digit zeroes them)
      if (warp == 0) {  // lane l owns buckets nb-1-l·per down to nb-(l+1)·per (descending)
        const int per_lane = nb / 32;
        uint32_t sum = 0;
        for (int j = 0; j < per_lane; ++j) sum += total[nb - 1 - lane * per_lane - j];
        uint32_t incl = sum;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
          const uint32_t v = __shfl_up_sync(0xffffffffu, incl, off);
          if (lane >= off) incl += v;
        }
        uint32_t acc = incl - sum;
        if (acc < remaining && remaining <= incl) {
          for (int j = 0; j < per_lane; ++j) {
            const int b = nb - 1 - lane * per_lane - j;
            if (acc + total[b] >= remaining) {
              s_bucket = static_cast<uint32_t>(b);
              s_remaining = remaining - acc;
              break;
            }
            acc += total[b];
          }
        }
      }
      __syncthreads();
      prefix |= s_bucket << shift;
      mask |= static_cast<uint32_t>(nb - 1) << shift;
      remaining = s_remaining;
    }
    // prefix = T, the keep-th best key; take every key above T and the `remaining` earliest
    // positions equal to T (total[T's last digit] of them exist; hist[...] in this block).
    const uint32_t need_eq = remaining, eq_total = total[prefix & 1023u];
    const uint32_t n_gt = static_cast<uint32_t>(keep) - need_eq;
    uint32_t* count0 = RowBlocks::at(&s_count, 0);
    unsigned long long* cand0 = RowBlocks::at(cand, 0);
    const bool all_eq = eq_total == need_eq;
    for (int base = begin + warp * 32; base < end; base += kTopkThreads) {
      const int p = base + lane;
      const uint32_t u = p < end ? order_key(row[p]) : 0u;
      append_warp(p < end && (all_eq ? u >= prefix : u > prefix), sort_key(u, p), count0, cand0);
    }
    if (!all_eq) {  // a tie across the cut: the equal keys in position order
      uint32_t base = 0;
      for (unsigned r = 0; r < rank; ++r) base += RowBlocks::at(hist, r)[prefix & 1023u];
      const int seg = (end - begin + kTopkThreads - 1) / kTopkThreads * 32;  // a warp's positions
      const int wb = min(end, begin + warp * seg), we = min(end, wb + seg);
      uint32_t mine = 0;
      for (int p0 = wb; p0 < we; p0 += 32) {
        const int p = p0 + lane;
        mine += __popc(__ballot_sync(0xffffffffu, p < we && order_key(row[p]) == prefix));
      }
      if (lane == 0) s_warp_eq[warp] = mine;
      __syncthreads();
      for (int k = 0; k < warp; ++k) base += s_warp_eq[k];
      for (int p0 = wb; p0 < we && base < need_eq; p0 += 32) {
        const int p = p0 + lane;
        const bool eq = p < we && order_key(row[p]) == prefix;
        const uint32_t ballot = __ballot_sync(0xffffffffu, eq);
        const uint32_t r = base + __popc(ballot & ((1u << lane) - 1u));
        if (eq && r < need_eq) cand0[n_gt + r] = sort_key(prefix, p);
        base += __popc(ballot);
      }
    }
    RowBlocks::sync();  // every candidate is in block 0
    if (rank == 0) {
      int m = 1;
      while (m < keep) m <<= 1;
      for (int i = keep + tid; i < m; i += kTopkThreads) cand[i] = ~0ull;
      __syncthreads();
      for (int size = 2; size <= m; size <<= 1)
        for (int stride = size / 2; stride > 0; stride >>= 1) {
          for (int i = tid; i < m / 2; i += kTopkThreads) {
            const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
            const unsigned long long x = cand[lo], y = cand[hi];
            if ((x > y) == ((lo & size) == 0)) {
              cand[lo] = y;
              cand[hi] = x;
            }
          }
          __syncthreads();
        }
      for (int i = tid; i < keep; i += kTopkThreads) {
        const unsigned long long v = cand[i];
        const auto pos = static_cast<int32_t>(v & 0xffffffffu);
        out[i] = pos;
        out_s[i] = order_value(~static_cast<uint32_t>(v >> 32));
        if (a.slot_out != nullptr)
          a.slot_out[a.slot_out_begin[t] + i] = slot_of_position(a, t, pos);
      }
    }
  }
  if (rank == 0)
    for (int i = keep + tid; i < a.k; i += kTopkThreads) {
      out[i] = -1;
      out_s[i] = detail::neg_inf();
    }
}

constexpr int kTopkSmem = kDsaMaxTopk * 8 + 2 * 2048 * 4;

using ScoresKernel = void (*)(DsaIndexArgs, ScoreLaunch);
/// dsa_scores_kernel<KS> at index KS - 1 (dims up to 16 KS).
constexpr ScoresKernel kScoresKernels[] = {
    dsa_scores_kernel<1>, dsa_scores_kernel<2>, dsa_scores_kernel<3>, dsa_scores_kernel<4>,
    dsa_scores_kernel<5>, dsa_scores_kernel<6>, dsa_scores_kernel<7>, dsa_scores_kernel<8>};

/// The current device's SM count and compute capability, and `kernel`'s blocks per SM at
/// (threads, smem) with its dynamic shared memory limit raised to smem: asked once per
/// (device, kernel, smem) and kept per thread (every layer of a step asks the same).
struct Occupancy {
  int sms = 0, major = 0, per_sm = 0;
};
template <typename Kernel>
cudaError_t occupancy(Kernel kernel, int threads, int smem, Occupancy& o) {
  struct Last {
    int dev = -1;
    const void* kernel = nullptr;
    int threads = 0, smem = 0;
    Occupancy o;
  };
  thread_local Last last[2];
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const auto* key = reinterpret_cast<const void*>(kernel);
  for (const Last& l : last)
    if (l.dev == dev && l.kernel == key && l.threads == threads && l.smem == smem) {
      o = l.o;
      return cudaSuccess;
    }
  Occupancy r;
  e = cudaDeviceGetAttribute(&r.sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&r.major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e == cudaSuccess)
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.per_sm, kernel, threads,
                                                      static_cast<size_t>(smem));
  if (e != cudaSuccess) return e;
  r.per_sm = std::max(r.per_sm, 1);
  last[1] = last[0];
  last[0] = Last{dev, key, threads, smem, r};
  o = r;
  return cudaSuccess;
}

/// The largest power of two <= x (x >= 1).
int floor_pow2(int x) {
  int p = 1;
  while (2 * p <= x) p *= 2;
  return p;
}

}  // namespace

namespace raw {

cudaError_t dsa_index_topk(const DsaIndexArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  if (a.max_visible > 0) {
    const int ks = (a.dim + 15) / 16;
    if (ks < 1 || ks > 8) return cudaErrorInvalidValue;
    ScoreLaunch L;
    L.run = std::gcd(a.page_size, 64);
    const auto run_bytes = static_cast<int64_t>(L.run) * a.row_bytes;
    L.chunk = run_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(a.index_rows) % 16 == 0 ? 16 : 4;
    L.stage_bytes = static_cast<int>(kTile * a.row_bytes);
    L.groups = a.heads <= 32 ? 1 : a.heads <= 64 ? 2 : 4;
    const int query_bytes = L.groups * kHeadsPerWarp * ks * 16 * 2;
    L.stage_region = (std::max(kStages * L.stage_bytes, query_bytes) + 15) / 16 * 16;
    const int smem = L.stage_region + static_cast<int>(sizeof(float)) * (kDsaMaxHeads + 4 * kTile) +
                     static_cast<int>(sizeof(int)) * (2 + kStages) * kTile;
    const ScoresKernel kernel = kScoresKernels[ks - 1];
    Occupancy o;
    if (const cudaError_t e = occupancy(kernel, kScoreWarps * 32, smem, o); e != cudaSuccess)
      return e;
    // One wave: the blocks of a row split its tiles.
    const int tiles = (a.max_visible + kTile - 1) / kTile;
    const int per_row = std::max(1, std::min(tiles, (o.sms * o.per_sm + a.rows - 1) / a.rows));
    kernel<<<dim3(static_cast<unsigned>(per_row), static_cast<unsigned>(a.rows)), kScoreWarps * 32,
             smem, stream>>>(a, L);
    if (cudaError_t le = cudaGetLastError(); le != cudaSuccess) return le;
  }
  Occupancy o;
  if (const cudaError_t e = occupancy(dsa_topk_kernel, kTopkThreads, kTopkSmem, o);
      e != cudaSuccess)
    return e;
  // Blocks per row: a cluster on sm_90 (at most one wave; at least 64 positions a block, which
  // also puts the conformance runner's short rows on the cluster path), one block elsewhere.
  int cluster = 1;
  if (o.major >= 9)
    cluster = floor_pow2(
        std::max(1, std::min({kMaxCluster, o.sms / a.rows, std::max(1, a.max_visible / 64)})));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(a.rows * cluster));
  cfg.blockDim = dim3(kTopkThreads);
  cfg.dynamicSmemBytes = kTopkSmem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = cluster > 1 ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, dsa_topk_kernel, a);
}

}  // namespace raw
}  // namespace pagoda::kernels::cuda
