#pragma once
/// Raw launchers of the dense kernels of the GPU model path that only some model families use
/// (Gemma: ModelOps::scale, rms_norm_groups, gelu_tanh_mul; DeepSeek MLA: rope_interleaved, and
/// rms_norm_groups for its LoRA norms; Mamba2 (Bamba): add_bias, gated_rms_norm; see
/// model_ops.h). Same conventions as dense_kernels.h:
/// plain types (nvcc-compiled header), untyped activation pointers in `dtype`, f32 math without
/// fast math and one rounding per output, enqueued on `stream`, no synchronisation or
/// allocation (capturable), cudaSuccess when there is nothing to do. Scalar (not vectorised)
/// kernels.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "pagoda/model/cuda/dense_kernels.h"

namespace pagoda::model::cuda_kernels {

/// x[i] = round(f32(x[i]) * s) for i in [0, n), in place.
cudaError_t scale_inplace(ActDType dtype, void* x, int64_t n, float s, cudaStream_t stream);

/// In-place RMSNorm of `groups` vectors of `dim` elements per row: the vector at
/// x + t * row_stride + g * dim (elements) becomes round(v * inv * f32(weight[i])) with
/// inv = 1 / sqrtf(sum(v²) / dim + eps) (f32 sum in a fixed order). One warp per vector.
cudaError_t rms_norm_groups(ActDType dtype, void* x, int64_t rows, int64_t row_stride,
                            int64_t groups, int64_t dim, const void* weight, float eps,
                            cudaStream_t stream);

/// GeGLU: out[t, i] = round(gelu_tanh(g) * u), g = f32(gate_up[t, i]), u = f32(gate_up[t, inter
/// + i]), gelu_tanh(g) = 0.5 g (1 + tanhf(sqrt(2/π) (g + 0.044715 g³))), f32.
cudaError_t gelu_tanh_mul(ActDType dtype, const void* gate_up, void* out, int64_t rows,
                          int64_t inter, cudaStream_t stream);

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

// ---- Mamba2 (hybrid models' mixer; the recurrence is the cuda linear-attention backend's) ----

/// x[t, i] = round(f32(x[t, i]) + bias[i]) for t < rows, i < n; x [rows, n] contiguous in
/// `dtype`, bias [n] f32.
cudaError_t add_bias_rows(ActDType dtype, void* x, const float* bias, int64_t rows, int64_t n,
                          cudaStream_t stream);

/// Gated RMSNorm, one warp per (row, group): v_i = y[t, i] · (z / (1 + expf(-z))) with
/// z = z_rows[t · z_stride + i], ss = Σ_group v² (f32, lane-strided then a warp tree),
/// out[t, i] = round(v_i · (1 / sqrtf(ss / group + eps) · weight[i])). y [rows, dim] f32, z f32
/// rows z_stride apart, weight [dim] f32, out [rows, dim] `dtype`; groups divides dim.
cudaError_t gated_rms_norm(ActDType dtype, const float* y, const float* z, int64_t z_stride,
                           const float* weight, void* out, int64_t rows, int64_t dim,
                           int64_t groups, float eps, cudaStream_t stream);

}  // namespace pagoda::model::cuda_kernels
