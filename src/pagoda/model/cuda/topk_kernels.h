#pragma once
/// Top-k log-probabilities of f32 logit rows on the GPU: the draft model's children of a
/// speculative tree step (topk > 1) without copying whole rows to the host.
///
/// Per row: the k largest logits (k in [1, kMaxTopK]), ids sorted by logit descending then id
/// ascending (a NaN logit never enters, like the host's spec::top_candidates), with
/// logprob = min(logit − logsumexp(row), 0), where the sum of exp(x − max) is f32 per thread and
/// combined in f32 (the host sums in double: values agree to ~1e-6 relative). Rows with fewer
/// than k finite logits fill the remaining entries with id −1, logprob −inf.
/// Plain types only (nvcc cannot include pagoda's core headers); enqueues on `stream`, never
/// allocates or synchronizes, returns the launch error (cudaErrorInvalidValue for bad sizes).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pagoda::model::cuda_kernels {

inline constexpr int kMaxTopK = 16;

/// logits [rows, vocab] f32 (row-major, contiguous); ids / logprobs [rows, k].
cudaError_t launch_topk_logprobs(const float* logits, int64_t rows, int64_t vocab, int k,
                                 int32_t* ids, float* logprobs, cudaStream_t stream);

}  // namespace pagoda::model::cuda_kernels
