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
  const int lo = mask.window >= 0 ? max(0, mask.kv_len - mask.qo_len + qi - mask.window) : 0;
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

/// One merge row: the (O, lse) partials of one query token's split chunks, sinks folded in.
/// The weights w_p = 2^(lse_p - max) / total are computed once per row into shared memory, then
/// every thread accumulates 4 output columns over the partials with 16 loads in flight (before,
/// each column was a loop over the partials recomputing the weights, one load at a time). A
/// partial of weight 0 (an empty chunk) contributes nothing, whatever its O holds.
__device__ void merge_row(const AttentionArgs& a, int r, float* w_s) {
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
  constexpr int kCols = 4;  // output columns per thread per pass
  for (int d0 = threadIdx.x; d0 < D; d0 += kCols * blockDim.x) {
    float acc[kCols] = {0.f, 0.f, 0.f, 0.f};
    if (!empty) {
#pragma unroll 4
      for (int p = 0; p < np; ++p) {
        const size_t base = size_t(p0 + p) * a.num_qo_heads + head;
        const float w = cached ? w_s[p] : exp2_diff(a.partial_lse[base], mm) / total;
        const float* src = a.partial_o + base * D;
#pragma unroll
        for (int k = 0; k < kCols; ++k) {
          const int d = d0 + k * blockDim.x;
          const float x = d < D ? src[d] : 0.f;
          acc[k] += w > 0.f ? w * x : 0.f;
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kCols; ++k) {
      const int d = d0 + k * blockDim.x;
      if (d < D) {
        store_any(a.out, row * a.o_stride_n + head * a.o_stride_h + d, a.out_dtype, acc[k]);
      }
    }
  }
  if (threadIdx.x == 0 && a.lse != nullptr) {
    a.lse[row * a.lse_stride_n + head * a.lse_stride_h] = empty ? neg_inf() : mm + log2f(total);
  }
}

__global__ void __launch_bounds__(128) merge_kernel(AttentionArgs a) {
  pdl_wait();  // reads the partials the attention kernel wrote (pdl.cuh)
  pdl_launch_dependents();
  const DevicePlan& plan = a.plan;
  __shared__ float w_s[kMergeMaxParts];
  for (int r = blockIdx.x; r < plan.counts[2]; r += gridDim.x) merge_row(a, r, w_s);
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
  return launch_pdl(detail::merge_kernel, dim3(args.grid_merge, args.num_qo_heads), dim3(128), 0,
                    stream, args);
}

cudaError_t append_kv(const AppendArgs& args, cudaStream_t stream) {
  if (args.n == 0) return cudaSuccess;
  const int threads = args.num_heads * args.head_dim >= 256 ? 256 : 128;
  detail::append_kv_kernel<<<args.n, threads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace pagoda::kernels::cuda::raw
