#pragma once
/// Weight-streaming GEMM for few activation rows (decode): y[m, n] = x[m, k] · w[n, k]ᵀ.
///
/// The decode-step projections are memory-bound (m <= 16 rows against megabytes of weights); this
/// kernel reads every weight byte exactly once with 16-byte non-coherent loads that bypass L1, keeps
/// several such loads in flight per thread, re-reads the tiny activation rows from L1/L2, and
/// reduces the split-k partial sums inside each block (warp butterfly + shared memory), so one
/// launch does the whole product with no workspace and no second kernel.
///
/// Plain types only (nvcc compiles this header; see dense_kernels.h for ActDType). The launcher
/// enqueues on `stream`, returns the launch error, never synchronizes or allocates, and can be
/// captured into a CUDA graph. Results are deterministic: every sum has a fixed order that
/// depends only on (m, n, k) and the device's multiprocessor count (which picks the block
/// shape), not on timing.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "pagoda/model/cuda/dense_kernels.h"

namespace pagoda::model::cuda_kernels {

/// Most activation rows small_m_gemm accepts (m is padded to 1, 2, 4, 8 or 16 inside; rows past
/// m cost some FMA issue but no memory traffic). The kernel is bandwidth-bound up to m = 8 and
/// starts to be FMA-issue-bound around m = 16 (its bf16 → f32 products are CUDA-core FMAs).
inline constexpr int64_t kSmallMGemmMaxRows = 16;

/// True when small_m_gemm handles this problem: dtype kBF16 or kF16, 1 <= m <= kSmallMGemmMaxRows,
/// n >= 1, k >= 8 and k % 8 == 0 (16-byte weight/activation rows). Pure host check, no CUDA call.
bool small_m_gemm_supported(ActDType dtype, int64_t m, int64_t n, int64_t k);

/// y[i, j] = sum_{l < k} a[i, l] * f32(w[j, l]) for i < m, j < n, with f32 products and f32
/// accumulation (fixed-order: per-thread sequential chunks, warp butterfly, then warps in order),
/// and one rounding of the result to `dtype` (or none when f32_out).
///
///   w   [n, k] `dtype`, row-major (Hugging Face [out, in] layout, k contiguous); read once.
///   x   swiglu == false: [m, k] `dtype`, a[i, l] = f32(x[i, l]).
///       swiglu == true:  [m, 2k] `dtype` (the gate_up projection: gate in columns [0, k), up in
///       [k, 2k)), a[i, l] = silu(g) * u with g = f32(x[i, l]), u = f32(x[i, k + l]),
///       silu(g) = g / (1 + exp(-g)) in f32 computed with the fast intrinsics __expf / __fdividef
///       (relative error ~1e-6 against the precise silu_mul; a is NOT rounded to `dtype`, unlike
///       silu_mul + a plain GEMM). Fused SwiGLU saves the silu_mul launch and its round trip; it
///       recomputes silu once per 2-8 weight rows, which is free at m <= 2 and costs MUFU issue
///       for larger m (time both with bench/cuda/gemv_bench at m = 4..8 before choosing).
///   y   [m, n], `dtype` when f32_out is false, f32 when f32_out is true (e.g. LM-head logits).
///
/// Requirements: small_m_gemm_supported(dtype, m, n, k); x, w, y 16-byte aligned device
/// pointers (y only needs 4-byte alignment for f32 / 2-byte for `dtype`); y must not alias x or w.
/// Returns cudaErrorInvalidValue (launching nothing) when a requirement fails, else the launch
/// error. Weights are loaded with ld.global.nc: w must not be written by the device while the
/// kernel runs. Launched with programmatic dependent launch (kernels/cuda/pdl.cuh): the first
/// weight loads are issued before the kernel waits for its predecessor on the stream, so w must
/// not be the output of an earlier kernel of the stream either (weights are written at load time).
cudaError_t small_m_gemm(ActDType dtype, const void* x, const void* w, void* y, bool f32_out,
                         bool swiglu, int64_t m, int64_t n, int64_t k, cudaStream_t stream);

}  // namespace pagoda::model::cuda_kernels
