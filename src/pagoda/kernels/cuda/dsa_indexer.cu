#include "pagoda/kernels/cuda/dsa_indexer.h"

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

using detail::mma16816;
using detail::widen2;

constexpr int kTile = 64;          // positions per scores tile
constexpr int kStages = 3;         // tiles in flight per block (cp.async)
constexpr int kTopkThreads = 512;  // one top-k block per row

__device__ __forceinline__ uint32_t bf16_pair(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(lo)) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(hi)) << 16);
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
  int run = 1;             ///< positions per run of consecutive slots (gcd(page_size, 64))
  int chunk = 4;           ///< bytes per cp.async (16 where every run is 16-byte aligned)
  int stage_bytes = 0;     ///< kTile * row_bytes
  int qscratch_bytes = 0;  ///< the prologue's quantised queries (aliases the stages)
};

/// The first slot of row t's run at position p (-1: past the row's visible positions).
__device__ __forceinline__ int run_slot(const DsaIndexArgs& a, int t, int p) {
  return p < a.visible[t] ? a.slots[a.slot_begin[t] + p] : -1;
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

// Block (x: a strided set of 64-position tiles, y: row t), one warp per 16 index heads.
// Prologue: each warp rounds its heads' queries to the key grid (kv::quantize_index_key's rule:
// e4m3 codes, a power-of-two scale per head) and keeps the codes as bf16 A fragments (exact);
// the scale folds into the head's weight. Then tiles in a kStages-deep cp.async pipeline: the
// raw index rows [64, row_bytes] land in shared memory (16-byte copies per run of consecutive
// slots), each warp computes D = codes_q · codes_kᵀ (16 heads x 8 positions per m16n8k16 mma;
// the key codes widened to bf16 from the staged bytes, exact; a product of two e4m3 codes is
// exact in f32), ReLU, its weights and a sum over its heads; the warps' partial sums are added
// in warp order, times the key's scale. The k dimension is permuted (thread quad c owns words
// [c·KS, (c+1)·KS) of a row, the same for A and B), which keeps the B reads off shared bank
// conflicts for 128-dim keys (rows of 33 words).
template <int KS>
__global__ void __launch_bounds__(256) dsa_scores_kernel(DsaIndexArgs a, ScoreLaunch L) {
  constexpr int DP = KS * 16;
  extern __shared__ __align__(16) unsigned char smem[];
  const int stage_region = max(kStages * L.stage_bytes, L.qscratch_bytes);
  float* part_s = reinterpret_cast<float*>(smem + stage_region);  // [8][kTile]
  int* slot_s = reinterpret_cast<int*>(part_s + 8 * kTile);       // [2][kTile]
  const int t = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4, nwarps = blockDim.x / 32;

  // ---- prologue: the row's queries on the key grid, as A fragments ----
  uint32_t A[KS][4];
  float w0 = 0.f, w1 = 0.f;
  {
    auto* qc = reinterpret_cast<__nv_bfloat16*>(smem);  // [16 nwarps][DP] codes (aliases stages)
    const float* q = a.q + static_cast<int64_t>(t) * a.heads * a.dim;
    for (int i = 0; i < 16; ++i) {
      const int h = 16 * warp + i;
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
        qc[(16 * warp + i) * DP + d] = __float2bfloat16_rn(v);  // exact: an e4m3 value
      }
      const float wh = h < a.heads ? a.w[static_cast<int64_t>(t) * a.heads + h] * scale : 0.f;
      if (i == g) w0 = wh;
      if (i == g + 8) w1 = wh;
    }
    __syncwarp();
    const __nv_bfloat16* r0 = qc + (16 * warp + g) * DP;
    const __nv_bfloat16* r1 = r0 + 8 * DP;
#pragma unroll
    for (int s = 0; s < KS; ++s) {
      const int d0 = 4 * (c * KS + s);
      A[s][0] = bf16_pair(r0[d0], r0[d0 + 1]);
      A[s][1] = bf16_pair(r1[d0], r1[d0 + 1]);
      A[s][2] = bf16_pair(r0[d0 + 2], r0[d0 + 3]);
      A[s][3] = bf16_pair(r1[d0 + 2], r1[d0 + 3]);
    }
  }
  __syncthreads();  // the stages reuse the query scratch

  // ---- the tile pipeline ----
  const int tiles = (a.max_visible + kTile - 1) / kTile;
  const int mine = tiles > static_cast<int>(blockIdx.x)
                       ? (tiles - static_cast<int>(blockIdx.x) + gridDim.x - 1) / gridDim.x
                       : 0;
  const int nruns = kTile / L.run, visible = a.visible[t];
  auto tile_p0 = [&](int i) { return (static_cast<int>(blockIdx.x) + i * gridDim.x) * kTile; };
  auto slot_of = [&](int i, int r) {
    return i < mine ? run_slot(a, t, tile_p0(i) + r * L.run) : -1;
  };
  auto stage = [&](int i) { return smem + (i % kStages) * L.stage_bytes; };
  int next_slot = -1;  // the slot of this thread's run in tile i + 3 (tid < nruns)
  {
    __shared__ int first_s[2][kTile];  // the first two tiles' run slots
    for (int r = threadIdx.x; r < nruns; r += blockDim.x) {
      first_s[0][r] = slot_of(0, r);
      first_s[1][r] = slot_of(1, r);
      slot_s[r] = slot_of(2, r);  // slot_s[0]: tile 2, read at iteration 0
    }
    if (static_cast<int>(threadIdx.x) < nruns) next_slot = slot_of(3, threadIdx.x);
    __syncthreads();
    issue_tile(a, L, first_s[0], stage(0));
    issue_tile(a, L, first_s[1], stage(1));
  }
  float* out = a.scores + static_cast<int64_t>(t) * a.max_visible;
  for (int i = 0; i < mine; ++i) {
    detail::cp_async_wait<1>();  // tile i's group (tile i + 1's may still fly)
    __syncthreads();             // tile i staged; slot_s[i % 2] (tile i + 2) written
    issue_tile(a, L, slot_s + (i % 2) * kTile, stage(i + 2));
    if (static_cast<int>(threadIdx.x) < nruns) {
      slot_s[((i + 1) % 2) * kTile + threadIdx.x] = next_slot;  // tile i + 3, read at i + 1
      next_slot = slot_of(i + 4, threadIdx.x);
    }
    const int p0 = tile_p0(i);
    const unsigned char* st = stage(i);
    if (p0 < visible) {
#pragma unroll 2
      for (int j = 0; j < kTile / 8; ++j) {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        const auto* krow =
            reinterpret_cast<const uint32_t*>(st + (8 * j + g) * a.row_bytes) + c * KS;
#pragma unroll
        for (int s = 0; s < KS; ++s) {
          const uint32_t x = krow[s];
          mma16816<__nv_bfloat16>(acc, A[s], widen2<__nv_bfloat16>(__byte_perm(x, 0u, 0x1404)),
                                  widen2<__nv_bfloat16>(__byte_perm(x, 0u, 0x3424)));
        }
        // D rows: heads h0 (d0, d1) and h0 + 8 (d2, d3); columns: positions 8j + 2c, + 1.
        float v0 = w0 * fmaxf(acc[0], 0.f) + w1 * fmaxf(acc[2], 0.f);
        float v1 = w0 * fmaxf(acc[1], 0.f) + w1 * fmaxf(acc[3], 0.f);
#pragma unroll
        for (int m = 4; m < 32; m <<= 1) {
          v0 += __shfl_xor_sync(0xffffffffu, v0, m);
          v1 += __shfl_xor_sync(0xffffffffu, v1, m);
        }
        if (g == 0) {
          part_s[warp * kTile + 8 * j + 2 * c] = v0;
          part_s[warp * kTile + 8 * j + 2 * c + 1] = v1;
        }
      }
    }
    __syncthreads();  // the partial sums
    for (int e = threadIdx.x; e < kTile; e += blockDim.x) {
      const int p = p0 + e;
      if (p >= a.max_visible) continue;
      if (p >= visible || !tree_sees(a, t, p)) {
        out[p] = detail::neg_inf();
        continue;
      }
      float sum = 0.f;
      for (int k = 0; k < nwarps; ++k) sum += part_s[k * kTile + e];
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

// Block t: row t's min(k, seen) best positions (see the header), sorted, then -1 / -inf.
__global__ void __launch_bounds__(kTopkThreads) dsa_topk_kernel(DsaIndexArgs a) {
  __shared__ uint32_t hist[2048];
  __shared__ unsigned long long cand[kDsaMaxTopk];
  __shared__ uint32_t s_bucket, s_remaining, s_count, s_warp_eq[kTopkThreads / 32];
  const int t = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int keep = min(a.k, a.seen[t]), n = a.visible[t];
  const float* row = a.scores + static_cast<int64_t>(t) * a.max_visible;
  int32_t* out = a.topk + static_cast<int64_t>(t) * a.k;
  float* out_s = a.topk_scores + static_cast<int64_t>(t) * a.k;
  if (keep > 0) {
    // Radix select: digits [31:21], [20:10], [9:0] of the order key; `remaining` counts how
    // many of the elements matching `prefix` on `mask` still belong to the top `keep`.
    uint32_t prefix = 0, mask = 0, remaining = static_cast<uint32_t>(keep);
    constexpr int kShift[3] = {21, 10, 0}, kBits[3] = {11, 11, 10};
#pragma unroll
    for (int d = 0; d < 3; ++d) {
      const int shift = kShift[d], nb = 1 << kBits[d];
      for (int i = tid; i < nb; i += kTopkThreads) hist[i] = 0;
      __syncthreads();
      for (int p = tid; p < n; p += kTopkThreads) {
        const uint32_t u = order_key(row[p]);
        if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & (nb - 1)], 1u);
      }
      __syncthreads();
      if (warp == 0) {  // lane l owns buckets nb-1-l·per down to nb-(l+1)·per (descending)
        const int per = nb / 32;
        uint32_t sum = 0;
        for (int j = 0; j < per; ++j) sum += hist[nb - 1 - lane * per - j];
        uint32_t incl = sum;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
          const uint32_t v = __shfl_up_sync(0xffffffffu, incl, off);
          if (lane >= off) incl += v;
        }
        uint32_t acc = incl - sum;
        if (acc < remaining && remaining <= incl) {
          for (int j = 0; j < per; ++j) {
            const int b = nb - 1 - lane * per - j;
            if (acc + hist[b] >= remaining) {
              s_bucket = static_cast<uint32_t>(b);
              s_remaining = remaining - acc;
              break;
            }
            acc += hist[b];
          }
        }
      }
      __syncthreads();
      prefix |= s_bucket << shift;
      mask |= static_cast<uint32_t>(nb - 1) << shift;
      remaining = s_remaining;
    }
    // prefix = T, the keep-th best key; take every key above T and the `remaining` earliest
    // positions equal to T (hist[T's last digit] of them exist).
    const uint32_t need_eq = remaining, eq_total = hist[prefix & 1023u];
    const uint32_t n_gt = static_cast<uint32_t>(keep) - need_eq;
    if (tid == 0) s_count = 0;
    __syncthreads();
    if (eq_total == need_eq) {
      for (int p = tid; p < n; p += kTopkThreads) {
        const uint32_t u = order_key(row[p]);
        if (u >= prefix) cand[atomicAdd(&s_count, 1u)] = sort_key(u, p);
      }
    } else {  // a tie across the cut: the equal keys in position order, warp by warp
      const int seg = (n + kTopkThreads - 1) / kTopkThreads * 32;  // a warp's positions
      const int begin = warp * seg, end = min(n, begin + seg);
      uint32_t mine = 0;
      for (int p0 = begin; p0 < end; p0 += 32) {
        const int p = p0 + lane;
        const uint32_t u = p < end ? order_key(row[p]) : 0u;
        if (p < end && u > prefix) cand[atomicAdd(&s_count, 1u)] = sort_key(u, p);
        mine += __popc(__ballot_sync(0xffffffffu, p < end && u == prefix));
      }
      if (lane == 0) s_warp_eq[warp] = mine;
      __syncthreads();
      uint32_t base = 0;
      for (int k = 0; k < warp; ++k) base += s_warp_eq[k];
      for (int p0 = begin; p0 < end && base < need_eq; p0 += 32) {
        const int p = p0 + lane;
        const uint32_t u = p < end ? order_key(row[p]) : 0u;
        const bool eq = p < end && u == prefix;
        const uint32_t ballot = __ballot_sync(0xffffffffu, eq);
        const uint32_t rank = base + __popc(ballot & ((1u << lane) - 1u));
        if (eq && rank < need_eq) cand[n_gt + rank] = sort_key(u, p);
        base += __popc(ballot);
      }
    }
    __syncthreads();
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
        a.slot_out[a.slot_out_begin[t] + i] = a.slots[a.slot_begin[t] + pos];
    }
  }
  for (int i = keep + tid; i < a.k; i += kTopkThreads) {
    out[i] = -1;
    out_s[i] = detail::neg_inf();
  }
}

// The scores kernel's dynamic shared memory stays under the 48 KB default at the limits (dim 128,
// 128 heads): the stages or the query codes, then the partial sums and run slots.
constexpr int kMaxStageBytes = kStages * kTile * (kDsaMaxDim + 4);
constexpr int kMaxQueryBytes = kDsaMaxHeads * kDsaMaxDim * 2;
static_assert(std::max(kMaxStageBytes, kMaxQueryBytes) + (8 + 2) * kTile * 4 <= 48 * 1024);

using ScoresKernel = void (*)(DsaIndexArgs, ScoreLaunch);
/// dsa_scores_kernel<KS> at index KS - 1 (dims up to 16 KS).
constexpr ScoresKernel kScoresKernels[] = {
    dsa_scores_kernel<1>, dsa_scores_kernel<2>, dsa_scores_kernel<3>, dsa_scores_kernel<4>,
    dsa_scores_kernel<5>, dsa_scores_kernel<6>, dsa_scores_kernel<7>, dsa_scores_kernel<8>};

/// Blocks of `kernel` that fit the current device at once (SMs x blocks per SM at threads and
/// smem): one wave. Every layer of a step asks the same, so the last answer is kept per thread.
cudaError_t wave_blocks(ScoresKernel kernel, int threads, int smem, int& blocks) {
  struct Last {
    int dev = -1;
    ScoresKernel kernel = nullptr;
    int threads = 0, smem = 0, blocks = 0;
  };
  thread_local Last last;
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev != last.dev || kernel != last.kernel || threads != last.threads || smem != last.smem) {
    int sms = 0, per_sm = 0;
    e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess)
      e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads,
                                                        static_cast<size_t>(smem));
    if (e != cudaSuccess) return e;
    last = Last{dev, kernel, threads, smem, sms * std::max(per_sm, 1)};
  }
  blocks = last.blocks;
  return cudaSuccess;
}

}  // namespace

namespace raw {

cudaError_t dsa_index_topk(const DsaIndexArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  if (a.max_visible > 0) {
    const int ks = (a.dim + 15) / 16, heads_pad = (a.heads + 15) / 16 * 16;
    if (ks < 1 || ks > 8) return cudaErrorInvalidValue;
    ScoreLaunch L;
    L.run = std::gcd(a.page_size, kTile);
    const auto run_bytes = static_cast<int64_t>(L.run) * a.row_bytes;
    L.chunk = run_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(a.index_rows) % 16 == 0 ? 16 : 4;
    L.stage_bytes = static_cast<int>(kTile * a.row_bytes);
    L.qscratch_bytes = heads_pad * ks * 16 * 2;
    const int smem = std::max(kStages * L.stage_bytes, L.qscratch_bytes) +
                     static_cast<int>(sizeof(float)) * 8 * kTile +
                     static_cast<int>(sizeof(int)) * 2 * kTile;
    const ScoresKernel kernel = kScoresKernels[ks - 1];
    const int threads = 32 * (heads_pad / 16);
    int blocks = 0;
    const cudaError_t e = wave_blocks(kernel, threads, smem, blocks);
    if (e != cudaSuccess) return e;
    // One wave: the blocks of a row split its tiles.
    const int tiles = (a.max_visible + kTile - 1) / kTile;
    const int per_row = std::max(1, std::min(tiles, (blocks + a.rows - 1) / a.rows));
    kernel<<<dim3(static_cast<unsigned>(per_row), static_cast<unsigned>(a.rows)), threads, smem,
             stream>>>(a, L);
    if (cudaError_t le = cudaGetLastError(); le != cudaSuccess) return le;
  }
  dsa_topk_kernel<<<static_cast<unsigned>(a.rows), kTopkThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace raw
}  // namespace pagoda::kernels::cuda
