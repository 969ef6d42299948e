// DeepSeek MLA's dense kernel (mla_kernels.h). Built without fast math.
#include <cstdint>

#include "pagoda/model/cuda/act_convert.cuh"
#include "pagoda/model/cuda/mla_kernels.h"

namespace pagoda::model::cuda_kernels {

namespace {

constexpr int kRopeThreads = 256;

/// One thread per pair (t, g, i), grid-stride.
template <typename T>
__global__ void rope_interleaved_kernel(T* x, int64_t rows, int64_t row_stride, int64_t groups,
                                        int64_t group_stride, int64_t half,
                                        const int32_t* __restrict__ positions,
                                        const float* __restrict__ inv_freq, float factor) {
  const int64_t pairs = rows * groups * half;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < pairs;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = j % half, tg = j / half;
    const int64_t t = tg / groups, g = tg - t * groups;
    T* v = x + t * row_stride + g * group_stride + 2 * i;
    float s, c;
    sincosf(__fmul_rn(static_cast<float>(positions[t]), inv_freq[i]), &s, &c);
    c = __fmul_rn(c, factor);
    s = __fmul_rn(s, factor);
    const float a = f32(v[0]), b = f32(v[1]);
    v[0] = round_to<T>(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
    v[1] = round_to<T>(__fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
  }
}

template <typename T>
cudaError_t launch_rope_interleaved(void* x, int64_t rows, int64_t row_stride, int64_t groups,
                                    int64_t group_stride, int64_t half, const int32_t* positions,
                                    const float* inv_freq, float factor, cudaStream_t stream) {
  const int64_t pairs = rows * groups * half;
  int64_t blocks = (pairs + kRopeThreads - 1) / kRopeThreads;
  if (blocks > (int64_t{1} << 20)) blocks = int64_t{1} << 20;
  rope_interleaved_kernel<T><<<static_cast<unsigned>(blocks), kRopeThreads, 0, stream>>>(
      static_cast<T*>(x), rows, row_stride, groups, group_stride, half, positions, inv_freq,
      factor);
  return cudaGetLastError();
}

}  // namespace

cudaError_t rope_interleaved(ActDType dtype, void* x, int64_t rows, int64_t row_stride,
                             int64_t groups, int64_t group_stride, int64_t dim,
                             const int32_t* positions, const float* inv_freq, float factor,
                             cudaStream_t stream) {
  const int64_t half = dim / 2;
  if (rows <= 0 || groups <= 0 || half <= 0) return cudaSuccess;
  if (x == nullptr || positions == nullptr || inv_freq == nullptr) return cudaErrorInvalidValue;
  switch (dtype) {
    case ActDType::kF32:
      return launch_rope_interleaved<float>(x, rows, row_stride, groups, group_stride, half,
                                            positions, inv_freq, factor, stream);
    case ActDType::kF16:
      return launch_rope_interleaved<__half>(x, rows, row_stride, groups, group_stride, half,
                                             positions, inv_freq, factor, stream);
    case ActDType::kBF16:
      return launch_rope_interleaved<__nv_bfloat16>(x, rows, row_stride, groups, group_stride,
                                                    half, positions, inv_freq, factor, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace pagoda::model::cuda_kernels
