#pragma once
/// Raw launcher of the MLA expanded form's state merge (ModelOps::merge_attention; model_ops.h,
/// Decoder::mla_attention's key windows). Same conventions as dense_kernels.h: plain types
/// (nvcc-compiled header), f32 math without fast math, enqueued on `stream`, no synchronisation
/// or allocation (capturable), cudaSuccess when there is nothing to do.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "pagoda/model/cuda/dense_kernels.h"

namespace pagoda::model::cuda_kernels {

/// One thread block per (row, head) state of `rows * heads`: merges part (part_o [.., dv] in
/// `dtype`, part_lse f32, base 2) into acc (acc_o [.., dv] f32, acc_lse f32) as
/// ModelOps::merge_attention states it, and with `out` (`dtype`) also writes the merged values
/// rounded once.
cudaError_t merge_attention(ActDType dtype, const void* part_o, const float* part_lse, float* acc_o,
                            float* acc_lse, void* out, int64_t rows, int64_t heads, int64_t dv,
                            bool first, cudaStream_t stream);

}  // namespace pagoda::model::cuda_kernels
