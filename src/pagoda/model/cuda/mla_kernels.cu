// The MLA expanded form's state merge (mla_kernels.h). Built without fast math.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "pagoda/model/cuda/act_convert.cuh"
#include "pagoda/model/cuda/mla_kernels.h"

namespace pagoda::model::cuda_kernels {

namespace {

constexpr int kThreads = 128;

/// Block s = one (row, head) state; its threads stride over dv.
template <typename T>
__global__ void merge_attention_kernel(const T* __restrict__ part_o,
                                       const float* __restrict__ part_lse, float* acc_o,
                                       float* acc_lse, T* out, int64_t states, int64_t dv,
                                       bool first) {
  for (int64_t s = blockIdx.x; s < states; s += gridDim.x) {
    const float b = part_lse[s];
    float wa = 0.f, wb = 1.f, m = b;
    if (!first) {
      const float a = acc_lse[s];
      m = fmaxf(a, b);
      if (m == -INFINITY) {  // neither state saw a key
        wa = wb = 0.f;
      } else {
        const float ea = exp2f(__fsub_rn(a, m)), eb = exp2f(__fsub_rn(b, m));
        const float sum = __fadd_rn(ea, eb);
        wa = __fdiv_rn(ea, sum);
        wb = __fdiv_rn(eb, sum);
        m = __fadd_rn(m, log2f(sum));
      }
    } else if (b == -INFINITY) {
      wb = 0.f;  // an empty window's output is 0 already; keep it exactly
    }
    float* acc = acc_o + s * dv;
    const T* part = part_o + s * dv;
    for (int64_t i = threadIdx.x; i < dv; i += blockDim.x) {
      const float v = first ? __fmul_rn(wb, f32(part[i]))
                            : __fadd_rn(__fmul_rn(wa, acc[i]), __fmul_rn(wb, f32(part[i])));
      acc[i] = v;
      if (out != nullptr) out[s * dv + i] = round_to<T>(v);
    }
    __syncthreads();  // every thread read acc_lse[s] before it changes
    if (threadIdx.x == 0) acc_lse[s] = m;
  }
}

template <typename T>
cudaError_t launch(const void* part_o, const float* part_lse, float* acc_o, float* acc_lse,
                   void* out, int64_t states, int64_t dv, bool first, cudaStream_t stream) {
  const int64_t grid = states < (int64_t{1} << 20) ? states : (int64_t{1} << 20);
  merge_attention_kernel<T><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
      static_cast<const T*>(part_o), part_lse, acc_o, acc_lse, static_cast<T*>(out), states, dv,
      first);
  return cudaGetLastError();
}

}  // namespace

cudaError_t merge_attention(ActDType dtype, const void* part_o, const float* part_lse, float* acc_o,
                            float* acc_lse, void* out, int64_t rows, int64_t heads, int64_t dv,
                            bool first, cudaStream_t stream) {
  const int64_t states = rows * heads;
  if (states <= 0 || dv <= 0) return cudaSuccess;
  switch (dtype) {
    case ActDType::kF32:
      return launch<float>(part_o, part_lse, acc_o, acc_lse, out, states, dv, first, stream);
    case ActDType::kF16:
      return launch<__half>(part_o, part_lse, acc_o, acc_lse, out, states, dv, first, stream);
    case ActDType::kBF16:
      return launch<__nv_bfloat16>(part_o, part_lse, acc_o, acc_lse, out, states, dv, first,
                                   stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace pagoda::model::cuda_kernels
