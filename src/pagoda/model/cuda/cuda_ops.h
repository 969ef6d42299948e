#pragma once
/// CudaOps: ModelOps on one GPU (model_ops.h). Weights and activations are f32, f16 or bf16 on
/// the device; GEMMs run through cuBLAS (cublasGemmEx): f16/bf16 inputs with f32 accumulation on
/// the tensor cores (f16/bf16 output, or f32 for the logits), and f32 with
/// CUBLAS_COMPUTE_32F_PEDANTIC (no TF32) as the exact mode. The small fused kernels are
/// dense_kernels.h (Gemma's and DeepSeek MLA's extra ops: family_kernels.h); sampling is
/// sampling_kernels.h (Philox keyed by (seed, step)); the Mamba2 mixer's bias add and gated
/// norm are family_kernels.h. Every call enqueues on the platform's
/// stream; capture() records a CUDA graph of a body.
///
/// Requirements: a CUDA platform (its native_stream()); one thread; not copyable.

#include <memory>

#include "pagoda/core/dtype.h"
#include "pagoda/model/model_ops.h"
#include "pagoda/platform/platform.h"

namespace pagoda::model {

/// CUDA model ops in `dtype` (kF32, kF16 or kBF16). Throws Error(kUnsupported) for another dtype
/// or a platform without a CUDA stream, kInternal naming a failed cuBLAS call.
std::unique_ptr<ModelOps> make_cuda_ops(platform::Platform& platform, DType dtype);

}  // namespace pagoda::model
