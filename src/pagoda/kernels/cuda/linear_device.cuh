#pragma once
/// Device helpers shared by the Mamba2 kernels (linear_params.h): SiLU, the time step, the
/// conv width of a layer.

#include "pagoda/kernels/cuda/linear_params.h"

namespace pagoda::kernels::cuda::linear {

__device__ __forceinline__ float silu(float v) { return v / (1.f + expf(-v)); }

/// Δ = clamp(softplus(raw + bias), lo, hi), softplus as torch's (v itself above 20).
__device__ __forceinline__ float time_step(float raw, float bias, float lo, float hi) {
  const float v = raw + bias;
  const float sp = v > 20.f ? v : log1pf(expf(v));
  return fminf(fmaxf(sp, lo), hi);
}

__device__ __forceinline__ int conv_dim_of(const LinearRecurrenceArgs& a) {
  return a.num_heads * a.head_dim + 2 * a.num_groups * a.state_size;
}

/// The sequence that item k (< prefix[n]) of a prefix sum over n sequences belongs to: the s
/// with prefix[s] <= k < prefix[s + 1] (sequences with no items skipped). Binary search.
__device__ __forceinline__ int seq_of(const int32_t* prefix, int n, int k) {
  int lo = 0, hi = n;  // prefix[lo] <= k < prefix[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (prefix[mid] <= k)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

}  // namespace pagoda::kernels::cuda::linear
