// Batched GPU sampling (sampling_kernels.h). Built without fast math.
//
// One 1024-thread block per row. Passes over the row (all reads of the f32 logits):
//  1. max and argmax (lowest index on ties). Greedy rows stop here. On the split-row path this
//     pass is argmax_split_kernel (many blocks per row, one partial each) and the row's block only
//     merges the partials; (max, argmax) is the maximum of the total order (x descending, index
//     ascending), so any merge order gives the same pair, bit for bit.
//  2. (top-k or top-p active) a histogram over "d-bins": d = (max - x) / T in [0, 32), 32 bins per
//     unit, with the count and the fixed-point mass W of each bin (shared-memory atomics; the
//     spread over d keeps contention low, and the tail d >= 32 has W == 0 and is not binned).
//     Because x -> bin is monotone, each bin is a contiguous range of the total order
//     (x descending, index ascending).
//  3. top-k: the d-bin where the cumulative count reaches k, then a 3-level radix select
//     (11 + 11 + 10 bits) on the order-preserving key of x restricted to that bin gives the exact
//     k-th key v and how many of its ties r are kept (lowest indices first).
//  4. top-p: the same with the cumulative fixed-point mass against P = ceil(top_p * S_k), S_k the
//     exact top-k mass.
//  5. the kept set (the shorter of the two cuts, then min-p) is summed per thread over a
//     contiguous chunk of indices (with a tie-rank pre-pass when only some ties are kept), a
//     block scan gives each chunk's offset, and the chunk holding floor(total * u) re-scans itself.
// Every sum is an exact u64 sum of fixed-point masses, so the result does not depend on thread
// scheduling.
#include <cstdint>

#include "pagoda/kernels/cuda/pdl.cuh"
#include "pagoda/model/cuda/philox.h"
#include "pagoda/model/cuda/sampling_kernels.h"

namespace pagoda::model::cuda_kernels {

namespace {

using u64 = unsigned long long;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kDBins = 1024;
constexpr float kDScale = 32.f;  // d-bins per unit of d
constexpr float kDRange = 32.f;  // kDBins / kDScale
constexpr int kRBins = 2048;     // radix bins (11-bit digits)
constexpr float kFixScale = 0x1p45f;

struct Cross {
  int pos;              ///< first ordered position where the cumulative value reaches the target
  uint32_t above_cnt;   ///< count before pos
  u64 above_mass;       ///< mass before pos
  uint32_t total_cnt;
  u64 total_mass;
};

struct Shared {
  u64 dmass[kDBins];
  u64 rmass[kRBins];
  u64 wm[kWarps];
  uint32_t dcnt[kDBins];
  uint32_t rcnt[kRBins];
  uint32_t wc[kWarps];
  float wv[kWarps];
  int wi[kWarps];
  Cross cross;
};

/// NaN -> -inf, -0 -> +0 (so equal logits always have equal keys).
__device__ __forceinline__ float load_logit(const float* __restrict__ row, int i) {
  const float x = row[i];
  return x != x ? -INFINITY : __fadd_rn(x, 0.f);
}

/// Order-preserving map float -> uint32 (larger float, larger key).
__device__ __forceinline__ uint32_t order_key(float x) {
  const uint32_t b = __float_as_uint(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/// Row constants: s(x) = (x - max) * (1 / T) <= 0.
struct RowCtx {
  const float* __restrict__ x;
  int vocab;
  float max;
  float inv_t;
  __device__ __forceinline__ float scaled(float v) const {
    return __fmul_rn(__fsub_rn(v, max), inv_t);
  }
};

__device__ __forceinline__ u64 fixed_mass(float w) {
  return __float2ull_rn(__fmul_rn(w, kFixScale));
}

/// d-bin of s (kDBins for the tail d >= kDRange, whose fixed-point mass is 0).
__device__ __forceinline__ int dbin_of(float s) {
  const float d = -s;
  return d < kDRange ? static_cast<int>(__fmul_rn(d, kDScale)) : kDBins;
}

struct Scan {
  uint32_t c;  ///< inclusive prefix of the counts
  u64 m;       ///< inclusive prefix of the masses
  uint32_t total_c;
  u64 total_m;
};

/// Inclusive block scan of (c, m) in thread order (exact integer sums).
__device__ Scan block_scan(uint32_t c, u64 m, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const uint32_t oc = __shfl_up_sync(0xffffffffu, c, off);
    const u64 om = __shfl_up_sync(0xffffffffu, m, off);
    if (lane >= off) {
      c += oc;
      m += om;
    }
  }
  if (lane == 31) {
    sh.wc[warp] = c;
    sh.wm[warp] = m;
  }
  __syncthreads();
  if (warp == 0) {
    uint32_t wc = sh.wc[lane];
    u64 wm = sh.wm[lane];
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const uint32_t oc = __shfl_up_sync(0xffffffffu, wc, off);
      const u64 om = __shfl_up_sync(0xffffffffu, wm, off);
      if (lane >= off) {
        wc += oc;
        wm += om;
      }
    }
    sh.wc[lane] = wc;
    sh.wm[lane] = wm;
  }
  __syncthreads();
  if (warp > 0) {
    c += sh.wc[warp - 1];
    m += sh.wm[warp - 1];
  }
  const Scan s{c, m, sh.wc[kWarps - 1], sh.wm[kWarps - 1]};
  __syncthreads();
  return s;
}

/// Walks kBins bins in order (ascending index, or descending when `descending`) and returns the
/// first position whose inclusive cumulative count (or mass, `by_mass`) reaches target >= 1, or
/// pos == kBins when the total stays below it.
template <int kBins>
__device__ Cross find_crossing(const uint32_t* cnt, const u64* mass, bool descending, u64 target,
                               bool by_mass, Shared& sh) {
  constexpr int kPer = kBins / kThreads;
  static_assert(kPer >= 1 && kBins % kThreads == 0);
  uint32_t c[kPer];
  u64 m[kPer];
  uint32_t tc = 0;
  u64 tm = 0;
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    const int pos = threadIdx.x * kPer + q;
    const int bin = descending ? kBins - 1 - pos : pos;
    c[q] = cnt[bin];
    m[q] = mass[bin];
    tc += c[q];
    tm += m[q];
  }
  const Scan s = block_scan(tc, tm, sh);
  const u64 incl = by_mass ? s.m : s.c;
  const u64 excl = by_mass ? s.m - tm : s.c - tc;
  if (excl < target && target <= incl) {  // exactly one thread
    u64 acc = excl;
    uint32_t above_c = s.c - tc;
    u64 above_m = s.m - tm;
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      const u64 val = by_mass ? m[q] : c[q];
      if (acc + val >= target) {
        sh.cross = Cross{static_cast<int>(threadIdx.x) * kPer + q, above_c, above_m, s.total_c,
                         s.total_m};
        break;
      }
      acc += val;
      above_c += c[q];
      above_m += m[q];
    }
  } else if (threadIdx.x == kThreads - 1 && incl < target) {
    sh.cross = Cross{kBins, s.total_c, s.total_m, s.total_c, s.total_m};
  }
  __syncthreads();
  const Cross r = sh.cross;
  return r;  // sh.cross is next written after a block_scan (two barriers), so this read is safe
}

/// The exact cut inside d-bin `bin`: the key v of the element where the cumulative count (or
/// mass) over the bin, in descending key order, reaches `target` (>= 1, <= the bin's total).
struct Refined {
  uint32_t key;         ///< v
  uint32_t n;           ///< elements with key v (in the bin: all of them)
  u64 w;                ///< fixed-point mass of one of them
  uint32_t above_cnt;   ///< elements of the bin with key > v
  u64 above_mass;       ///< their mass
  u64 rem;              ///< target minus the count (or mass) above v: 1 <= rem <= n (or n * w)
};

__device__ Refined refine(const RowCtx& ctx, int bin, u64 target, bool by_mass, Shared& sh) {
  uint32_t prefix = 0, above_cnt = 0;
  u64 above_mass = 0;
  uint32_t digit = 0;
#pragma unroll 1
  for (int level = 0; level < 3; ++level) {
    const int bits = level == 2 ? 10 : 11;          // digits of 11, 11, 10 bits
    const int shift = level == 0 ? 21 : (level == 1 ? 10 : 0);
    const int high = shift + bits;  // bits above this digit are fixed by prefix
    __syncthreads();  // previous readers of rcnt/rmass are done
    for (int b = threadIdx.x; b < kRBins; b += kThreads) {
      sh.rcnt[b] = 0;
      sh.rmass[b] = 0;
    }
    __syncthreads();
    const uint32_t mask = (1u << bits) - 1u;
    for (int i = threadIdx.x; i < ctx.vocab; i += kThreads) {
      const float x = load_logit(ctx.x, i);
      const float s = ctx.scaled(x);
      if (dbin_of(s) != bin) continue;
      const uint32_t key = order_key(x);
      if (level > 0 && (key >> high) != (prefix >> high)) continue;
      const uint32_t dg = (key >> shift) & mask;
      atomicAdd(&sh.rcnt[dg], 1u);
      atomicAdd(&sh.rmass[dg], fixed_mass(expf(s)));
    }
    __syncthreads();
    const Cross c = find_crossing<kRBins>(sh.rcnt, sh.rmass, /*descending=*/true, target,
                                          by_mass, sh);
    digit = static_cast<uint32_t>(kRBins - 1 - c.pos);
    prefix |= digit << shift;
    target -= by_mass ? c.above_mass : c.above_cnt;
    above_cnt += c.above_cnt;
    above_mass += c.above_mass;
  }
  const uint32_t n = sh.rcnt[digit];
  const u64 mass = sh.rmass[digit];
  return Refined{prefix, n, n > 0 ? mass / n : 0, above_cnt, above_mass, target};
}

/// A prefix of the total order: keys > key, plus the first r (by index) of the n keys == key.
struct Cut {
  bool all;
  uint32_t key;
  uint32_t r;
  uint32_t n;
};

__device__ __forceinline__ Cut shorter(const Cut& a, const Cut& b) {
  if (a.all) return b;
  if (b.all) return a;
  if (a.key != b.key) return a.key > b.key ? a : b;
  return a.r <= b.r ? a : b;
}

/// One block's (max, argmax) over its slice: 8 bytes in the workspace.
struct Partial {
  float v;
  int i;
};
static_assert(sizeof(Partial) == 8);

/// Merges (ov, oi) into (bv, bi): larger value, then lower index; index -1 is "nothing yet".
__device__ __forceinline__ void arg_merge(float& bv, int& bi, float ov, int oi) {
  if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
    bv = ov;
    bi = oi;
  }
}

constexpr int kSplitThreads = 256;
constexpr int kSplitPer = kSampleSplitSlice / kSplitThreads;  // logits per thread
static_assert(kSplitPer * kSplitThreads == kSampleSplitSlice);
constexpr int kMaxParts = (kMaxSampleVocab + kSampleSplitSlice - 1) / kSampleSplitSlice;
static_assert(kMaxParts <= kThreads);

int split_parts(int vocab) { return (vocab + kSampleSplitSlice - 1) / kSampleSplitSlice; }

/// Pass 1 of the split-row path: block (part, row) reduces logits [part * slice, + slice) of the
/// row to parts[row * gridDim.x + part]. Every thread issues its kSplitPer loads before comparing
/// (coalesced: load j of a warp is 32 consecutive logits).
__global__ void __launch_bounds__(kSplitThreads)
    argmax_split_kernel(const float* __restrict__ logits, int64_t row_stride, int vocab,
                        Partial* __restrict__ parts) {
  kernels::cuda::pdl_wait();  // reads the logits the previous kernel wrote (pdl.cuh)
  kernels::cuda::pdl_launch_dependents();
  __shared__ float wv[kSplitThreads / 32];
  __shared__ int wi[kSplitThreads / 32];
  const int row = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float* x = logits + static_cast<int64_t>(row) * row_stride;
  const int begin = static_cast<int>(blockIdx.x) * kSampleSplitSlice + tid;
  float v[kSplitPer];
#pragma unroll
  for (int j = 0; j < kSplitPer; ++j) {
    const int i = begin + j * kSplitThreads;
    v[j] = i < vocab ? load_logit(x, i) : -INFINITY;
  }
  float bv = -INFINITY;
  int bi = -1;
#pragma unroll
  for (int j = 0; j < kSplitPer; ++j) {  // ascending indices: keep the first maximum
    const int i = begin + j * kSplitThreads;
    if (i < vocab && (bi < 0 || v[j] > bv)) {
      bv = v[j];
      bi = i;
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
    arg_merge(bv, bi, ov, oi);
  }
  if (lane == 0) {
    wv[warp] = bv;
    wi[warp] = bi;
  }
  __syncthreads();
  if (tid == 0) {
    float mv = -INFINITY;
    int mi = -1;
    for (int w = 0; w < kSplitThreads / 32; ++w) arg_merge(mv, mi, wv[w], wi[w]);
    parts[static_cast<int64_t>(row) * gridDim.x + blockIdx.x] = Partial{mv, mi};
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    sample_kernel(const float* __restrict__ logits, int64_t row_stride,
                  const SamplingRowParams* __restrict__ params, int vocab,
                  const Partial* __restrict__ parts, int nparts, int32_t* __restrict__ out_ids) {
  kernels::cuda::pdl_wait();  // reads the logits the previous kernel wrote (pdl.cuh)
  kernels::cuda::pdl_launch_dependents();
  __shared__ Shared sh;
  const int row = blockIdx.x;
  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const float* x = logits + static_cast<int64_t>(row) * row_stride;
  const SamplingRowParams p = params[row];

  // Pass 1: max and argmax (lowest index on ties), or the merge of the split-row partials.
  float bv = -INFINITY;
  int bi = -1;
  if (parts != nullptr) {
    if (tid < nparts) {
      const Partial pt = parts[static_cast<int64_t>(row) * nparts + tid];
      bv = pt.v;
      bi = pt.i;
    }
  } else {
    for (int i = tid; i < vocab; i += kThreads) {
      const float v = load_logit(x, i);
      if (bi < 0 || v > bv) {
        bv = v;
        bi = i;
      }
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
    arg_merge(bv, bi, ov, oi);
  }
  if (lane == 0) {
    sh.wv[warp] = bv;
    sh.wi[warp] = bi;
  }
  __syncthreads();
  float max_v = -INFINITY;
  int arg = -1;
  for (int w = 0; w < kWarps; ++w) arg_merge(max_v, arg, sh.wv[w], sh.wi[w]);
  const float inv_t = 1.f / p.temperature;
  const bool greedy = !(p.temperature > 0.f) || p.top_k == 1 || !isfinite(max_v) ||
                      !isfinite(inv_t);
  if (greedy) {
    if (tid == 0) out_ids[row] = arg;
    return;
  }
  const RowCtx ctx{x, vocab, max_v, inv_t};
  const bool use_k = p.top_k > 1 && p.top_k < vocab;
  const bool use_p = p.top_p < 1.f;
  const bool use_min = p.min_p > 0.f;

  Cut cut{true, 0, 0, 0};
  if (use_k || use_p) {
    // Pass 2: d-bin histogram.
    for (int b = tid; b < kDBins; b += kThreads) {
      sh.dcnt[b] = 0;
      sh.dmass[b] = 0;
    }
    __syncthreads();
    for (int i = tid; i < vocab; i += kThreads) {
      const float s = ctx.scaled(load_logit(x, i));
      const int b = dbin_of(s);
      if (b < kDBins) {
        atomicAdd(&sh.dcnt[b], 1u);
        atomicAdd(&sh.dmass[b], fixed_mass(expf(s)));
      }
    }
    __syncthreads();
    u64 s_k = 0;  // exact fixed-point mass of the top-k set
    Cut cut_k{true, 0, 0, 0};
    if (use_k) {
      const u64 k = static_cast<u64>(p.top_k);
      const Cross c = find_crossing<kDBins>(sh.dcnt, sh.dmass, false, k, false, sh);
      if (c.pos == kDBins) {
        s_k = c.total_mass;  // fewer than k tokens carry mass: keep them all
      } else {
        const Refined f = refine(ctx, c.pos, k - c.above_cnt, false, sh);
        cut_k = Cut{false, f.key, static_cast<uint32_t>(f.rem), f.n};
        s_k = c.above_mass + f.above_mass + f.rem * f.w;
      }
    } else {
      s_k = find_crossing<kDBins>(sh.dcnt, sh.dmass, false, 1, true, sh).total_mass;
    }
    Cut cut_p{true, 0, 0, 0};
    if (use_p && s_k > 0) {
      const double pd = ceil(static_cast<double>(p.top_p) * static_cast<double>(s_k));
      u64 target = pd >= static_cast<double>(s_k) ? s_k : static_cast<u64>(pd > 1.0 ? pd : 1.0);
      if (target > s_k) target = s_k;
      const Cross c = find_crossing<kDBins>(sh.dcnt, sh.dmass, false, target, true, sh);
      if (c.pos < kDBins) {
        const Refined f = refine(ctx, c.pos, target - c.above_mass, true, sh);
        u64 r = f.w > 0 ? (f.rem + f.w - 1) / f.w : f.n;
        if (r > f.n) r = f.n;
        if (r < 1) r = 1;
        cut_p = Cut{false, f.key, static_cast<uint32_t>(r), f.n};
      }
    }
    cut = shorter(cut_k, cut_p);
  }

  // Pass 3: sample by inverse CDF over the kept tokens, each thread a contiguous chunk.
  const int chunk = (vocab + kThreads - 1) / kThreads;
  const int begin = tid * chunk < vocab ? tid * chunk : vocab;
  const int end = begin + chunk < vocab ? begin + chunk : vocab;
  uint32_t rank0 = 0;
  if (!cut.all && cut.r < cut.n) {  // only some ties of the cut key are kept: rank them
    uint32_t ties = 0;
    for (int i = begin; i < end; ++i) ties += order_key(load_logit(x, i)) == cut.key;
    rank0 = block_scan(ties, 0, sh).c - ties;
  }
  const float min_p = p.min_p;
  auto kept_mass = [&](int i, uint32_t& rank) -> u64 {
    const float v = load_logit(x, i);
    const float w = expf(ctx.scaled(v));
    if (!cut.all) {
      const uint32_t key = order_key(v);
      if (key < cut.key) return 0;
      if (key == cut.key && rank++ >= cut.r) return 0;
    }
    if (use_min && !(w >= min_p)) return 0;
    return fixed_mass(w);
  };
  u64 own = 0;
  {
    uint32_t rank = rank0;
    for (int i = begin; i < end; ++i) own += kept_mass(i, rank);
  }
  const Scan s = block_scan(0, own, sh);
  const u64 total = s.total_m;
  if (total == 0) {  // cannot happen for valid parameters (the argmax is always kept)
    if (tid == 0) out_ids[row] = arg;
    return;
  }
  const u64 target = __umul64hi(total, philox_draw64(p.seed, p.step));  // in [0, total)
  const u64 excl = s.m - own;
  if (excl <= target && target < s.m) {  // exactly one thread
    uint32_t rank = rank0;
    u64 cum = excl;
    int pick = end - 1;
    for (int i = begin; i < end; ++i) {
      cum += kept_mass(i, rank);
      if (cum > target) {
        pick = i;
        break;
      }
    }
    out_ids[row] = pick;
  }
}

}  // namespace

namespace {

bool auto_split(int rows, int vocab) {
  return rows >= 1 && rows <= kSampleSplitMaxRows && vocab > kSampleSplitSlice &&
         vocab <= kMaxSampleVocab;
}

}  // namespace

size_t sample_tokens_split_workspace_bytes(int rows, int vocab) {
  if (rows < 1 || vocab < 1) return 0;
  return static_cast<size_t>(rows) * static_cast<size_t>(split_parts(vocab)) * sizeof(Partial);
}

size_t sample_tokens_workspace_bytes(int rows, int vocab) {
  // Sized for kSampleSplitMaxRows whatever rows is: a caller that grows its buffer on demand then
  // allocates once, and graphs captured earlier never hold a freed workspace.
  return auto_split(rows, vocab) ? sample_tokens_split_workspace_bytes(kSampleSplitMaxRows, vocab)
                                 : 0;
}

cudaError_t sample_tokens_with(SamplePath path, const float* logits, int64_t row_stride,
                               const SamplingRowParams* params, int rows, int vocab,
                               int32_t* out_ids, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream) {
  if (vocab < 1 || vocab > kMaxSampleVocab || rows < 0) return cudaErrorInvalidValue;
  if (path == SamplePath::kAuto) {
    if (workspace_bytes < sample_tokens_workspace_bytes(rows, vocab)) return cudaErrorInvalidValue;
    path = auto_split(rows, vocab) ? SamplePath::kSplitRow : SamplePath::kSingleBlock;
  } else if (path == SamplePath::kSplitRow) {
    if (workspace_bytes < sample_tokens_split_workspace_bytes(rows, vocab) || rows > 65535)
      return cudaErrorInvalidValue;
  } else if (path != SamplePath::kSingleBlock) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  Partial* parts = nullptr;
  int nparts = 0;
  if (path == SamplePath::kSplitRow) {
    if (workspace == nullptr || (reinterpret_cast<uintptr_t>(workspace) & 7u) != 0)
      return cudaErrorInvalidValue;
    parts = static_cast<Partial*>(workspace);
    nparts = split_parts(vocab);
    const dim3 grid(static_cast<unsigned>(nparts), static_cast<unsigned>(rows));
    const cudaError_t e = kernels::cuda::launch_pdl(argmax_split_kernel, grid, dim3(kSplitThreads),
                                                    0, stream, logits, row_stride, vocab, parts);
    if (e != cudaSuccess) return e;
  }
  return kernels::cuda::launch_pdl(sample_kernel, static_cast<unsigned>(rows), dim3(kThreads), 0,
                                   stream, logits, row_stride, params, vocab, parts, nparts,
                                   out_ids);
}

cudaError_t sample_tokens(const float* logits, int64_t row_stride, const SamplingRowParams* params,
                          int rows, int vocab, int32_t* out_ids, void* workspace,
                          size_t workspace_bytes, cudaStream_t stream) {
  return sample_tokens_with(SamplePath::kAuto, logits, row_stride, params, rows, vocab, out_ids,
                            workspace, workspace_bytes, stream);
}

namespace {

__global__ void adjust_logits_kernel(float* logits, int64_t vocab, const LogitAdjustEntry* adj,
                                     int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const LogitAdjustEntry a = adj[i];
  float& l = logits[static_cast<int64_t>(a.row) * vocab + a.token];
  const float l1 = __fadd_rn(l, a.bias);
  // _rn intrinsics: no FMA contraction, so the result is the host's (apply_logit_adjust) bit for bit.
  l = __fsub_rn(l1 > 0.f ? __fdiv_rn(l1, a.rep) : __fmul_rn(l1, a.rep), a.sub);
}

constexpr int kMaskThreads = 256;
constexpr int64_t kMaskChunk = 8192;  // logits of one row per block (32 per thread)

/// Block (i, c): mask row i (skipped when i >= *count), logits [c * kMaskChunk, +kMaskChunk).
/// The 32 threads of a warp read one mask word (a broadcast) and write only masked logits.
__global__ void mask_logits_kernel(float* logits, int64_t vocab, const int32_t* rows,
                                   const uint32_t* mask, const int32_t* count) {
  const int64_t i = blockIdx.x;
  if (i >= *count) return;
  const int64_t words = (vocab + 31) / 32;
  float* l = logits + static_cast<int64_t>(rows[i]) * vocab;
  const uint32_t* m = mask + i * words;
  const int64_t end = min(vocab, (static_cast<int64_t>(blockIdx.y) + 1) * kMaskChunk);
  for (int64_t t = blockIdx.y * kMaskChunk + threadIdx.x; t < end; t += blockDim.x)
    if (((m[t >> 5] >> (t & 31)) & 1u) == 0) l[t] = -INFINITY;
}

}  // namespace

cudaError_t mask_logits(float* logits, int64_t vocab, const int32_t* rows, const uint32_t* mask,
                        const int32_t* count, int64_t max_rows, cudaStream_t stream) {
  if (max_rows <= 0 || vocab <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(max_rows),
                  static_cast<unsigned>((vocab + kMaskChunk - 1) / kMaskChunk));
  mask_logits_kernel<<<grid, kMaskThreads, 0, stream>>>(logits, vocab, rows, mask, count);
  return cudaGetLastError();
}

cudaError_t adjust_logits(float* logits, int64_t vocab, const LogitAdjustEntry* adj, int64_t n,
                          cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  adjust_logits_kernel<<<blocks, kThreads, 0, stream>>>(logits, vocab, adj, n);
  return cudaGetLastError();
}

}  // namespace pagoda::model::cuda_kernels
