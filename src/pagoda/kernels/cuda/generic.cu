/// Generic paged attention: any head dims up to 1024 (MLA absorbed 576/512), any float dtypes
/// (f32/f16/bf16 q and out; f32/f16/bf16/fp8 e4m3/e5m2 KV), every mask. One warp per
/// (query row, q head); lane owns dims lane, lane + 32, ... Correct first, not fast.

#include "pagoda/kernels/cuda/device_utils.cuh"
#include "pagoda/kernels/cuda/launch_raw.h"
#include "pagoda/kernels/cuda/pdl.cuh"

namespace pagoda::kernels::cuda {
namespace detail {
namespace {

constexpr int kMaxPerLane = 32;  // D <= 1024
constexpr int kWarpsPerBlock = 4;

__global__ void __launch_bounds__(128) generic_kernel(AttentionArgs a, LogitTransform xf) {
  const DevicePlan& plan = a.plan;
  const int warp_id = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int bs = plan.counts[0];
  const int nnz = plan.qo_indptr[bs];
  const int token = warp_id / a.num_qo_heads;
  const int head = warp_id % a.num_qo_heads;
  if (token >= nnz) return;
  int lo_b = 0, hi_b = bs;  // last b with qo_indptr[b] <= token
  while (hi_b - lo_b > 1) {
    const int mid = (lo_b + hi_b) / 2;
    if (plan.qo_indptr[mid] <= token) lo_b = mid; else hi_b = mid;
  }
  const int b = lo_b;
  const int qi = token - plan.qo_indptr[b];
  MaskInfo mask;
  mask.qo_len = plan.qo_indptr[b + 1] - plan.qo_indptr[b];
  mask.kv_len = kv_len_of(plan, b, a.page_size);
  mask.bits = plan.custom_mask != nullptr ? plan.custom_mask + plan.mask_indptr[b] : nullptr;
  mask.causal = a.causal;
  mask.window = a.window_left;
  if (mask.bits != nullptr && plan.mask_qpos != nullptr) {
    mask.qpos = plan.mask_qpos + plan.qo_indptr[b];
  }
  const int32_t* pages = plan.kv_indices + plan.kv_indptr[b];
  const int hkv = head / (a.num_qo_heads / a.num_kv_heads);
  const int dq = a.head_dim_qk, dv = a.head_dim_v;

  float q[kMaxPerLane], acc[kMaxPerLane];
  const int64_t qbase = token * a.q_stride_n + head * a.q_stride_h;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + 32 * i;
    q[i] = d < dq ? load_any(a.q, qbase + d, a.q_dtype) : 0.f;
    acc[i] = 0.f;
  }
  float m = neg_inf(), l = 0.f;
  int hi = mask.kv_len;
  if (mask.bits == nullptr && mask.causal) hi = min(hi, mask.kv_len - mask.qo_len + qi + 1);
  const int lo = mask.window >= 0 ? max(0, mask.window_start(qi)) : 0;
  for (int kj = lo; kj < hi; ++kj) {
    if (!mask.visible(qi, kj)) continue;
    const int page = pages[kj / a.page_size];
    const int off = kj % a.page_size;
    const int64_t kb = page * a.k.page_stride + off * a.k.token_stride + hkv * a.k.head_stride;
    const int64_t vb = page * a.v.page_stride + off * a.v.token_stride + hkv * a.v.head_stride;
    float d = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int dd = lane + 32 * i;
      if (dd < dq) d = fmaf(q[i], load_any(a.k.data, kb + dd, a.kv_dtype), d);
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) d += __shfl_xor_sync(0xffffffffu, d, o);
    const float s = xf(d);
    const float mx = fmaxf(m, s);
    const float scale = exp2_diff(m, mx);
    const float p = exp2_diff(s, mx);
    m = mx;
    l = l * scale + p;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int dd = lane + 32 * i;
      if (dd < dv) acc[i] = acc[i] * scale + p * load_any(a.v.data, vb + dd, a.kv_dtype);
    }
  }
  float lse;
  const float f = finalize_state(m, l, a.sinks, head, a.v_scale, lse);
  const int64_t obase = token * a.o_stride_n + head * a.o_stride_h;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < dv) store_any(a.out, obase + d, a.out_dtype, acc[i] * f);
  }
  if (lane == 0 && a.lse != nullptr) a.lse[token * a.lse_stride_n + head * a.lse_stride_h] = lse;
}

/// Partials whose merge weights the merge kernel keeps in shared memory (rows with more
/// partials take the same arithmetic with the weights recomputed per partial).
constexpr int kMergeMaxParts = 1024;
/// Threads of a merge block (one block per (merge row, q head) at a time): C threads per pass
/// over the row's 4-column groups (C = min(groups, threads)) times S subsets of its partials, S
/// about one per 8 partials, at least 128 threads (S = 4 at D 128: the block size before) and
/// at most kMergeThreads. MLA's D 512 at 64 partials a row takes 512 threads (128 groups x 4
/// subsets); at 2 partials, 128 (one subset). Sizing by D alone (512 at D 512) cost ~15 us at
/// B64 h_q 16 L4096, 1,024 rows of 2 partials: one 512-thread block fits an SM at 80
/// registers, so the short merges ran in waves (H200, 2026-12-04,
/// bench/results/sm90_fastdiv_h200_129e22f/). `parts`: the mean partials per row the host
/// planned (AttentionArgs::merge_parts; 0 = unknown, sized for many).
constexpr int kMergeThreads = 512;
constexpr int kMergeSmallThreads = 128;
inline int merge_threads(int head_dim_v, int parts) {
  const int groups = (head_dim_v + 3) / 4;
  const int c = groups < kMergeThreads ? groups : kMergeThreads;
  int s = parts > 0 ? (parts + 7) / 8 : kMergeThreads;
  if (s > kMergeThreads / c) s = kMergeThreads / c;
  const int t = (c * s + 31) / 32 * 32;
  return t < kMergeSmallThreads ? kMergeSmallThreads : (t > kMergeThreads ? kMergeThreads : t);
}

/// The weighted sum over one merge row's partials p = sub, sub + S, ... of W columns (4: one
/// float4) starting at column g * W, into acc, four partials at a time: their loads are issued
/// (predicated) before any is used, so they are in flight together. kCached: the weights are
/// in w_s.
struct PartialSum {
  const AttentionArgs& a;
  const float* w_s;
  int p0, np, head, D, g, sub, S;
  float mm, total;
  template <int W, bool kCached>
  __device__ __forceinline__ void run(float (&acc)[4]) const {
    constexpr int kBatch = 4;  // partials whose loads are issued before any is used
    for (int p = sub; p < np; p += kBatch * S) {
      float w[kBatch], x[kBatch][4];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int q = p + u * S;
        const bool ok = q < np;
        const size_t base = size_t(p0 + (ok ? q : 0)) * a.num_qo_heads + head;
        const float* src = a.partial_o + base * D + size_t(g) * W;
        if constexpr (W == 4) {
          const float4 v =
              ok ? *reinterpret_cast<const float4*>(src) : make_float4(0.f, 0.f, 0.f, 0.f);
          x[u][0] = v.x, x[u][1] = v.y, x[u][2] = v.z, x[u][3] = v.w;
        } else {
          x[u][0] = ok ? src[0] : 0.f;
          x[u][1] = x[u][2] = x[u][3] = 0.f;
        }
        if constexpr (kCached) {
          w[u] = ok ? w_s[q] : 0.f;
        } else {
          w[u] = ok ? exp2_diff(a.partial_lse[base], mm) / total : 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
#pragma unroll
        for (int k = 0; k < W; ++k) acc[k] += w[u] > 0.f ? w[u] * x[u][k] : 0.f;
      }
    }
  }
};

/// One merge row: the (O, lse) partials of one query token's split chunks, sinks folded in.
/// The weights w_p = 2^(lse_p - max) / total are computed once per row into shared memory. The
/// threads then split the row's columns, four at a time (float4 loads) where D % 4 == 0, and,
/// where a row has fewer 4-column groups than the block has threads, its partials too: thread t
/// sums group t % C (C = min(groups, threads)) over partials t / C, t / C + S, ... (S = threads /
/// C) with four loads in flight, and the S sums of a group meet in shared memory. (Before,
/// each of 128 threads summed 4 scalar columns over every partial: at B1 h_q 128 L32768 MLA
/// decode, 64 partials of 512 columns per head, that merge ran at 6 % occupancy and took
/// 36.5 us beside the attention kernel's 29.4 us, ncu on the H200, 2026-12-04.) A partial of
/// weight 0 (an empty chunk) contributes nothing, whatever its O holds.
__device__ void merge_row(const AttentionArgs& a, int r, float* w_s, float4* red_s) {
  const DevicePlan& plan = a.plan;
  const int b = plan.merge_req[r];
  const int p0 = plan.merge_begin[r];
  const int np = plan.merge_count[r];
  const int head = blockIdx.y;
  const int row = plan.qo_indptr[b] + (plan.merge_tok != nullptr ? plan.merge_tok[r] : 0);
  const int D = a.head_dim_v;
  const bool cached = np <= kMergeMaxParts;
  auto lse_of = [&](int p) { return a.partial_lse[size_t(p0 + p) * a.num_qo_heads + head]; };
  __syncthreads();  // the previous row's weights are no longer read
  if (cached) {
    for (int p = threadIdx.x; p < np; p += blockDim.x) w_s[p] = lse_of(p);
    __syncthreads();
  }
  float mm = a.sinks != nullptr ? a.sinks[head] * kLog2e : neg_inf();
  float best = neg_inf();
  for (int p = 0; p < np; ++p) best = fmaxf(best, cached ? w_s[p] : lse_of(p));
  mm = fmaxf(mm, best);
  float total = 0.f;
  if (a.sinks != nullptr) total += exp2_diff(a.sinks[head] * kLog2e, mm);
  for (int p = 0; p < np; ++p) total += exp2_diff(cached ? w_s[p] : lse_of(p), mm);
  const bool empty = best == neg_inf();
  if (cached) {
    __syncthreads();  // every thread has read the lse values
    for (int p = threadIdx.x; p < np; p += blockDim.x) w_s[p] = exp2_diff(w_s[p], mm) / total;
    __syncthreads();
  }
  const bool vec = D % 4 == 0 && (reinterpret_cast<uintptr_t>(a.partial_o) & 15u) == 0;
  const int W = vec ? 4 : 1;                   // columns per group
  const int groups = D / W;                    // column groups of the row
  const int C = min(groups, int(blockDim.x));  // groups per pass
  const int S = int(blockDim.x) / C;           // partial subsets
  const int c = int(threadIdx.x) % C, sub = int(threadIdx.x) / C;
  const bool summing = sub < S;  // threads past C * S idle
  const size_t o_base = size_t(row) * a.o_stride_n + size_t(head) * a.o_stride_h;
  for (int g0 = 0; g0 < groups; g0 += C) {
    const int g = g0 + c;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    if (!empty && summing && g < groups) {
      const PartialSum ps{a, w_s, p0, np, head, D, g, sub, S, mm, total};
      if (vec) {
        cached ? ps.run<4, true>(acc) : ps.run<4, false>(acc);
      } else {
        cached ? ps.run<1, true>(acc) : ps.run<1, false>(acc);
      }
    }
    if (S > 1) {
      __syncthreads();  // the previous pass's sums are read
      if (summing) red_s[threadIdx.x] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      __syncthreads();
      if (sub == 0) {
        for (int k = 1; k < S; ++k) {
          const float4 v = red_s[k * C + c];
          acc[0] += v.x, acc[1] += v.y, acc[2] += v.z, acc[3] += v.w;
        }
      }
    }
    if (sub == 0 && g < groups) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (k < W) store_any(a.out, o_base + size_t(g) * W + k, a.out_dtype, acc[k]);
      }
    }
  }
  if (threadIdx.x == 0 && a.lse != nullptr) {
    a.lse[row * a.lse_stride_n + head * a.lse_stride_h] = empty ? neg_inf() : mm + log2f(total);
  }
}

/// kMaxThreads bounds the block (launch bounds and the reduction's shared memory): 128, the
/// common short merge, keeps the occupancy it had before; 512 sets one block an SM as the
/// bound (without it ptxas aims at two and spills at sm_90a, 64 registers).
template <int kMaxThreads>
__global__ void __launch_bounds__(kMaxThreads, kMaxThreads == kMergeThreads ? 1 : 8)
    merge_kernel(AttentionArgs a) {
  pdl_wait();  // reads the partials the attention kernel wrote (pdl.cuh)
  pdl_launch_dependents();
  const DevicePlan& plan = a.plan;
  __shared__ float w_s[kMergeMaxParts];
  __shared__ float4 red_s[kMaxThreads];
  for (int r = blockIdx.x; r < plan.counts[2]; r += gridDim.x) merge_row(a, r, w_s, red_s);
}

__global__ void append_kv_kernel(AppendArgs a) {
  const int i = blockIdx.x;
  const int slot = a.loc[i];
  if (slot < 0) return;
  const int64_t page = slot / a.page_size, off = slot % a.page_size;
  const bool fp8 = a.cache_dtype == ElemType::kE4M3 || a.cache_dtype == ElemType::kE5M2;
  const float inv = fp8 ? 1.f / a.scale : 1.f;
  const int total = a.num_heads * a.head_dim;
  for (int e = threadIdx.x; e < total; e += blockDim.x) {
    const int h = e / a.head_dim, d = e % a.head_dim;
    const float x = load_any(a.src, i * a.src_stride_n + h * a.src_stride_h + d, a.src_dtype);
    store_any(a.cache, page * a.page_stride + off * a.token_stride + h * a.head_stride + d,
              a.cache_dtype, x * inv);
  }
}

}  // namespace
}  // namespace detail

}  // namespace pagoda::kernels::cuda

namespace pagoda::kernels::cuda::raw {

cudaError_t generic(const AttentionArgs& args, cudaStream_t stream) {
  const int64_t warps = int64_t(args.grid_rows) * args.num_qo_heads;
  if (warps == 0) return cudaSuccess;
  const int blocks = static_cast<int>((warps + detail::kWarpsPerBlock - 1) / detail::kWarpsPerBlock);
  detail::generic_kernel<<<blocks, 128, 0, stream>>>(
      args, detail::make_logit_transform(args.sm_scale, args.logit_cap, args.k_scale));
  return cudaGetLastError();
}

cudaError_t merge(const AttentionArgs& args, cudaStream_t stream) {
  if (args.grid_merge == 0) return cudaSuccess;
  // args.variants.merge_threads (tests and A/B runs): a block size of 32..512, a multiple of
  // 32, instead of the sized one. Every size computes the same sums.
  const int forced = args.variants.merge_threads;
  const int threads = forced >= 32 && forced <= detail::kMergeThreads && forced % 32 == 0
                          ? forced
                          : detail::merge_threads(args.head_dim_v, args.merge_parts);
  const dim3 grid(args.grid_merge, args.num_qo_heads);
  if (threads <= detail::kMergeSmallThreads) {
    return launch_pdl(detail::merge_kernel<detail::kMergeSmallThreads>, grid, dim3(threads), 0,
                      stream, args);
  }
  return launch_pdl(detail::merge_kernel<detail::kMergeThreads>, grid, dim3(threads), 0, stream,
                    args);
}

cudaError_t append_kv(const AppendArgs& args, cudaStream_t stream) {
  if (args.n == 0) return cudaSuccess;
  const int threads = args.num_heads * args.head_dim >= 256 ? 256 : 128;
  detail::append_kv_kernel<<<args.n, threads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace pagoda::kernels::cuda::raw
