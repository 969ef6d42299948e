// Dense f32 kernels of the CUDA model path (model_kernels.h). Built without fast math.
#include "pagoda/model/cuda/model_kernels.h"

namespace pagoda::model::cuda_kernels {

namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65535 * 32 ? blocks : 65535 * 32);
}

__global__ void embed_kernel(const float* __restrict__ table, const int32_t* __restrict__ ids,
                             float* __restrict__ out, int64_t dim) {
  const int64_t t = blockIdx.x;
  const float* src = table + static_cast<int64_t>(ids[t]) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) out[t * dim + i] = src[i];
}

__global__ void rms_norm_kernel(const float* x, const int32_t* __restrict__ row_index,
                                const float* __restrict__ weight, float* out, int64_t dim,
                                float eps) {
  const int64_t t = blockIdx.x;
  const int64_t r = row_index != nullptr ? row_index[t] : t;
  const float* xr = x + r * dim;
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const double v = xr[i];
    ss += v * v;
  }
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  __shared__ double warp_sums[kThreads / 32];
  __shared__ float inv_s;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += warp_sums[w];
    inv_s = static_cast<float>(1.0 / sqrt(total / static_cast<double>(dim) + eps));
  }
  __syncthreads();
  const float inv = inv_s;
  float* o = out + t * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    o[i] = __fmul_rn(__fmul_rn(xr[i], inv), weight[i]);
}

__global__ void split_qkv_rope_kernel(const float* __restrict__ qkv,
                                      const int32_t* __restrict__ positions,
                                      const float* __restrict__ inv_freq, float* __restrict__ q,
                                      float* __restrict__ k, float* __restrict__ v, int hq,
                                      int hkv, int d) {
  const int64_t t = blockIdx.x;
  const int half = d / 2;
  const int heads = hq + 2 * hkv;
  const float* row = qkv + t * static_cast<int64_t>(heads) * d;
  const float pos = static_cast<float>(positions[t]);
  for (int idx = threadIdx.x; idx < heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    const float a = row[h * d + i];
    const float b = row[h * d + i + half];
    if (h >= hq + hkv) {  // v: plain copy
      float* dst = v + (t * hkv + (h - hq - hkv)) * d;
      dst[i] = a;
      dst[i + half] = b;
      continue;
    }
    float* dst = h < hq ? q + (t * hq + h) * d : k + (t * hkv + (h - hq)) * d;
    const float angle = __fmul_rn(pos, inv_freq[i]);
    const float c = static_cast<float>(cos(static_cast<double>(angle)));
    const float s = static_cast<float>(sin(static_cast<double>(angle)));
    dst[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    dst[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
  }
}

__global__ void silu_mul_kernel(const float* __restrict__ gate_up, float* __restrict__ out,
                                int64_t rows, int64_t inter) {
  const int64_t n = rows * inter;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = j / inter, i = j % inter;
    const float g = gate_up[t * 2 * inter + i];
    const float u = gate_up[t * 2 * inter + inter + i];
    out[j] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.f, expf(-g))), u);
  }
}

__global__ void soft_cap_kernel(float* x, int64_t n, float cap) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[j] = __fmul_rn(cap, tanhf(__fdiv_rn(x[j], cap)));
}

}  // namespace

cudaError_t embed_rows(const float* table, const int32_t* ids, float* out, int64_t rows,
                       int64_t dim, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  embed_kernel<<<static_cast<unsigned>(rows), 128, 0, stream>>>(table, ids, out, dim);
  return cudaGetLastError();
}

cudaError_t rms_norm(const float* x, const int32_t* row_index, const float* weight, float* out,
                     int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  rms_norm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, row_index, weight,
                                                                        out, dim, eps);
  return cudaGetLastError();
}

cudaError_t split_qkv_rope(const float* qkv, const int32_t* positions, const float* inv_freq,
                           float* q, float* k, float* v, int64_t rows, int hq, int hkv,
                           int head_dim, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  split_qkv_rope_kernel<<<static_cast<unsigned>(rows), 128, 0, stream>>>(
      qkv, positions, inv_freq, q, k, v, hq, hkv, head_dim);
  return cudaGetLastError();
}

cudaError_t silu_mul(const float* gate_up, float* out, int64_t rows, int64_t inter,
                     cudaStream_t stream) {
  if (rows <= 0 || inter <= 0) return cudaSuccess;
  silu_mul_kernel<<<grid_for(rows * inter), kThreads, 0, stream>>>(gate_up, out, rows, inter);
  return cudaGetLastError();
}

cudaError_t soft_cap(float* x, int64_t n, float cap, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  soft_cap_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, n, cap);
  return cudaGetLastError();
}

}  // namespace pagoda::model::cuda_kernels
