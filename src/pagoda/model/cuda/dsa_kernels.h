#pragma once
/// Raw launchers of the DSA lightning indexer's dense kernels (ModelOps::layer_norm_f32,
/// rope_neox_f32, store_index_keys; model_ops.h, model/dsa_indexer.h). Same conventions as
/// dense_kernels.h: plain types (nvcc-compiled header), f32 math without fast math, enqueued
/// on `stream`, no synchronisation or allocation (capturable), cudaSuccess when there is
/// nothing to do.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pagoda::model::cuda_kernels {

/// LayerNorm in place on x [rows, dim] (f32), one warp per row: mean = Σv / dim, var =
/// Σ(v − mean)² / dim (two passes, lane-strided sums then a warp tree), v = (v − mean) ·
/// (1 / sqrtf(var + eps)) · weight[i] + bias[i]; weight and bias [dim] f32.
cudaError_t layer_norm_f32(float* x, int64_t rows, int64_t dim, const float* weight,
                           const float* bias, float eps, cudaStream_t stream);

/// NeoX-pair RoPE in place on f32 x [rows, groups, dim], dims [0, rope) of each vector: for
/// i < rope / 2 the pair (a, b) = (v[i], v[i + rope/2]) becomes (a c − b s, b c + a s) with
/// angle = f32(positions[t]) · inv_freq[i], c = cosf(angle) · factor, s = sinf(angle) · factor
/// (f32 products and sums, no contraction). positions [rows], inv_freq [rope / 2] device.
cudaError_t rope_neox_f32(float* x, int64_t rows, int64_t groups, int64_t dim, int64_t rope,
                          const int32_t* positions, const float* inv_freq, float factor,
                          cudaStream_t stream);

/// DSA index keys, one warp per row of k [rows, dim] (f32): amax = max |k|, scale = 2^e with e
/// the least integer such that amax / 448 <= 2^e (frexpf: exact; 1 when amax is 0), codes
/// e4m3(k / scale) (RNE, saturating), written with the f32 scale after them at index_rows +
/// loc[t] · row_bytes: kv::quantize_index_key's row, bit for bit. loc [rows] device.
cudaError_t store_index_keys(const float* k, const int32_t* loc, int64_t rows, int64_t dim,
                             void* index_rows, int64_t row_bytes, cudaStream_t stream);

}  // namespace pagoda::model::cuda_kernels
