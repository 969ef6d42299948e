#pragma once
// Device conversions of the model path's activation types (dense_kernels.h ActDType: float,
// __half, __nv_bfloat16) to f32 and back (round to nearest even), for the scalar kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace pagoda::model::cuda_kernels {

__device__ __forceinline__ float f32(float x) {
  return x;
}
__device__ __forceinline__ float f32(__half x) {
  return __half2float(x);
}
__device__ __forceinline__ float f32(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T round_to(float x);
template <>
__device__ __forceinline__ float round_to<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half round_to<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 round_to<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

}  // namespace pagoda::model::cuda_kernels
