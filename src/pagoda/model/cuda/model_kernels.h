#pragma once
/// Raw launchers of the dense model kernels of the CUDA model path (f32; see cuda_model.h).
/// Plain types only: this header is compiled by nvcc, which cannot include pagoda's core headers
/// (fmt in C++20 mode). Each launcher enqueues on `stream` and returns the launch error
/// (cudaSuccess when nothing was launched); none synchronizes, so all can be captured into a
/// CUDA graph. Arrays are row-major device memory and must not alias unless stated.
/// Compiled without --use_fast_math: the results track the host ops of ops.h to a few ulp.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pagoda::model::cuda_kernels {

/// out[t, :] = table[ids[t], :] for t in [0, rows). ids are trusted (checked on the host).
cudaError_t embed_rows(const float* table, const int32_t* ids, float* out, int64_t rows,
                       int64_t dim, cudaStream_t stream);

/// out[t, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * weight with r = row_index[t] (or t when
/// row_index is null), for t in [0, rows). Sum of squares in f64 like the host op. out may alias
/// x only when row_index is null.
cudaError_t rms_norm(const float* x, const int32_t* row_index, const float* weight, float* out,
                     int64_t rows, int64_t dim, float eps, cudaStream_t stream);

/// Splits the fused projection qkv [rows, (hq + 2 hkv) * d] into contiguous q [rows, hq, d],
/// k [rows, hkv, d], v [rows, hkv, d] and applies the NeoX rotary embedding to q and k:
/// angle = f32(positions[t]) * inv_freq[i] (f32), cos/sin correctly rounded from f64.
cudaError_t split_qkv_rope(const float* qkv, const int32_t* positions, const float* inv_freq,
                           float* q, float* k, float* v, int64_t rows, int hq, int hkv,
                           int head_dim, cudaStream_t stream);

/// out[t, i] = silu(gate_up[t, i]) * gate_up[t, inter + i].
cudaError_t silu_mul(const float* gate_up, float* out, int64_t rows, int64_t inter,
                     cudaStream_t stream);

/// x = cap * tanh(x / cap) elementwise (cap > 0).
cudaError_t soft_cap(float* x, int64_t n, float cap, cudaStream_t stream);

}  // namespace pagoda::model::cuda_kernels
