#include "pagoda/kernels/cuda/dsa_indexer.h"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cub/device/device_segmented_sort.cuh>

namespace pagoda::kernels::cuda {
namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ float e4m3_to_float(unsigned char b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3)));
}

// Block (x: 128 positions, y: row t): q[t] and w[t] in shared memory, one position per thread.
// Unseen positions (past the row's visible count, or draft nodes off its path) score -inf.
__global__ void dsa_scores_kernel(DsaIndexArgs a) {
  extern __shared__ float sq[];  // [heads * dim] q, then [heads] w
  const int t = blockIdx.y;
  const int hd = a.heads * a.dim;
  float* sw = sq + hd;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) sq[i] = a.q[static_cast<int64_t>(t) * hd + i];
  for (int i = threadIdx.x; i < a.heads; i += blockDim.x)
    sw[i] = a.w[static_cast<int64_t>(t) * a.heads + i];
  __syncthreads();
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= a.max_visible) return;
  const int64_t at = static_cast<int64_t>(t) * a.max_visible + p;
  a.vals[at] = p;
  bool sees = p < a.visible[t];
  if (sees && a.tree_size > 0) {
    const int j = p - a.tree_begin[t];
    if (j >= 0) sees = a.tree_bits[static_cast<int64_t>(t) * a.tree_size + j] != 0;
  }
  if (!sees) {
    a.keys[at] = -INFINITY;
    return;
  }
  const unsigned char* row =
      a.index_rows + static_cast<int64_t>(a.slots[a.slot_begin[t] + p]) * a.row_bytes;
  float scale;
  memcpy(&scale, row + a.dim, sizeof(float));
  float s = 0.f;
  for (int h = 0; h < a.heads; ++h) {
    const float* qh = sq + h * a.dim;
    float dot = 0.f;
    for (int j = 0; j < a.dim; ++j) dot = fmaf(qh[j], e4m3_to_float(row[j]) * scale, dot);
    s = fmaf(sw[h], fmaxf(dot, 0.f), s);
  }
  a.keys[at] = __float_as_uint(s) == 0x80000000u ? 0.f : s;  // -0 -> +0: one zero for the sort
}

// Row t: its first min(k, seen) sorted entries, then -1 / -inf.
__global__ void dsa_gather_kernel(DsaIndexArgs a) {
  const int t = blockIdx.x;
  const int keep = min(a.k, a.seen[t]);
  for (int i = threadIdx.x; i < a.k; i += blockDim.x) {
    const int64_t o = static_cast<int64_t>(t) * a.k + i;
    if (i < keep) {
      const int64_t src = static_cast<int64_t>(t) * a.max_visible + i;
      a.topk[o] = a.vals_out[src];
      a.topk_scores[o] = a.keys_out[src];
    } else {
      a.topk[o] = -1;
      a.topk_scores[o] = -INFINITY;
    }
  }
}

}  // namespace

namespace raw {

size_t dsa_index_temp_bytes(int rows, int max_visible) {
  size_t bytes = 0;
  (void)cub::DeviceSegmentedSort::StableSortPairsDescending(
      nullptr, bytes, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), rows * max_visible,
      rows, static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(nullptr));
  return bytes;
}

cudaError_t dsa_index_topk(const DsaIndexArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  if (a.max_visible > 0) {
    const size_t smem = sizeof(float) * (static_cast<size_t>(a.heads) * a.dim + a.heads);
    if (smem > 48 * 1024) {
      const cudaError_t e = cudaFuncSetAttribute(
          dsa_scores_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      if (e != cudaSuccess) return e;
    }
    const dim3 grid(static_cast<unsigned>((a.max_visible + kThreads - 1) / kThreads),
                    static_cast<unsigned>(a.rows));
    dsa_scores_kernel<<<grid, kThreads, smem, stream>>>(a);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    size_t temp_bytes = a.temp_bytes;
    e = cub::DeviceSegmentedSort::StableSortPairsDescending(
        a.temp, temp_bytes, a.keys, a.keys_out, a.vals, a.vals_out, a.rows * a.max_visible, a.rows,
        a.offsets, a.offsets + 1, stream);
    if (e != cudaSuccess) return e;
  }
  dsa_gather_kernel<<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace raw
}  // namespace pagoda::kernels::cuda
