// The DSA lightning indexer's dense kernels (dsa_kernels.h). Built without fast math.
#include <cuda_fp8.h>

#include <cstdint>

#include "pagoda/kernels/cuda/index_key.cuh"
#include "pagoda/model/cuda/dsa_kernels.h"

namespace pagoda::model::cuda_kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

unsigned blocks(int64_t n, int per_block) {
  const int64_t b = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (int64_t{1} << 20) ? (int64_t{1} << 20) : b));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

__global__ void layer_norm_f32_kernel(float* x, int64_t rows, int64_t dim,
                                      const float* __restrict__ weight,
                                      const float* __restrict__ bias, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  const float inv_dim = 1.f / static_cast<float>(dim);
  for (int64_t t = blockIdx.x * static_cast<int64_t>(kWarps) + (threadIdx.x >> 5); t < rows;
       t += warps) {
    float* v = x + t * dim;
    float sum = 0.f;
    for (int64_t i = lane; i < dim; i += 32) sum = __fadd_rn(sum, v[i]);
    const float mean = __fmul_rn(warp_sum(sum), inv_dim);
    float ss = 0.f;
    for (int64_t i = lane; i < dim; i += 32) {
      const float c = __fsub_rn(v[i], mean);
      ss = __fmaf_rn(c, c, ss);
    }
    const float inv = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(__fmul_rn(warp_sum(ss), inv_dim), eps)));
    for (int64_t i = lane; i < dim; i += 32)
      v[i] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(v[i], mean), inv), weight[i]), bias[i]);
  }
}

/// One thread per pair (t, g, i), grid-stride.
__global__ void rope_neox_f32_kernel(float* x, int64_t rows, int64_t groups, int64_t dim,
                                     int64_t half, const int32_t* __restrict__ positions,
                                     const float* __restrict__ inv_freq, float factor) {
  const int64_t pairs = rows * groups * half;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < pairs;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = j % half, tg = j / half;
    const int64_t t = tg / groups;
    float* v = x + tg * dim;
    float s, c;
    sincosf(__fmul_rn(static_cast<float>(positions[t]), inv_freq[i]), &s, &c);
    c = __fmul_rn(c, factor);
    s = __fmul_rn(s, factor);
    const float a = v[i], b = v[i + half];
    v[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    v[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
  }
}

__global__ void store_index_keys_kernel(const float* __restrict__ k,
                                        const int32_t* __restrict__ loc, int64_t rows, int64_t dim,
                                        unsigned char* index_rows, int64_t row_bytes) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(kWarps) + (threadIdx.x >> 5); t < rows;
       t += warps) {
    const float* v = k + t * dim;
    float amax = 0.f;
    for (int64_t i = lane; i < dim; i += 32) amax = fmaxf(amax, fabsf(v[i]));
    amax = warp_max(amax);
    const float scale = kernels::cuda::index_key_scale(amax);
    unsigned char* row = index_rows + static_cast<int64_t>(loc[t]) * row_bytes;
    for (int64_t i = lane; i < dim; i += 32)
      row[i] = static_cast<unsigned char>(kernels::cuda::index_key_code(v[i], scale));
    if (lane == 0) memcpy(row + dim, &scale, sizeof(float));  // rows are byte-aligned only
  }
}

}  // namespace

cudaError_t layer_norm_f32(float* x, int64_t rows, int64_t dim, const float* weight,
                           const float* bias, float eps, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return cudaSuccess;
  layer_norm_f32_kernel<<<blocks(rows, kWarps), kThreads, 0, stream>>>(x, rows, dim, weight, bias,
                                                                       eps);
  return cudaGetLastError();
}

cudaError_t rope_neox_f32(float* x, int64_t rows, int64_t groups, int64_t dim, int64_t rope,
                          const int32_t* positions, const float* inv_freq, float factor,
                          cudaStream_t stream) {
  const int64_t half = rope / 2;
  if (rows <= 0 || groups <= 0 || half <= 0) return cudaSuccess;
  rope_neox_f32_kernel<<<blocks(rows * groups * half, kThreads), kThreads, 0, stream>>>(
      x, rows, groups, dim, half, positions, inv_freq, factor);
  return cudaGetLastError();
}

cudaError_t store_index_keys(const float* k, const int32_t* loc, int64_t rows, int64_t dim,
                             void* index_rows, int64_t row_bytes, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return cudaSuccess;
  store_index_keys_kernel<<<blocks(rows, kWarps), kThreads, 0, stream>>>(
      k, loc, rows, dim, static_cast<unsigned char*>(index_rows), row_bytes);
  return cudaGetLastError();
}

}  // namespace pagoda::model::cuda_kernels
