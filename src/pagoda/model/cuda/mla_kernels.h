#pragma once
/// Raw launcher of DeepSeek MLA's extra dense kernel of the GPU model path
/// (ModelOps::rope_interleaved; see model_ops.h). Same conventions as dense_kernels.h: plain
/// types (nvcc-compiled header), untyped activation pointers in `dtype`, f32 math without fast
/// math and one rounding per output, enqueued on `stream`, no synchronisation or allocation
/// (capturable), cudaSuccess when there is nothing to do. Scalar (not vectorised) kernel.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "pagoda/model/cuda/dense_kernels.h"

namespace pagoda::model::cuda_kernels {

/// Interleaved-pair RoPE in place (DeepSeek's layout): for t < rows, g < groups, i < dim / 2,
/// the pair (a, b) = (v[2i], v[2i+1]) of the vector v at x + t * row_stride + g * group_stride
/// (elements) becomes (round(a c - b s), round(b c + a s)) with angle = f32(positions[t]) *
/// inv_freq[i] (one f32 product), c = cosf(angle) * factor, s = sinf(angle) * factor (sincosf,
/// then one f32 product each) and f32 products / sums (the host op's order, no contraction).
/// An odd last element is left as it is, as is everything outside the groups. The groups must
/// not overlap; positions [rows] int32 and inv_freq [dim / 2] f32 are device memory.
cudaError_t rope_interleaved(ActDType dtype, void* x, int64_t rows, int64_t row_stride,
                             int64_t groups, int64_t group_stride, int64_t dim,
                             const int32_t* positions, const float* inv_freq, float factor,
                             cudaStream_t stream);

}  // namespace pagoda::model::cuda_kernels
