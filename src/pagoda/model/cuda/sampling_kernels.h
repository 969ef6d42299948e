#pragma once
/// Batched token sampling on the GPU (greedy, temperature, top-k, top-p, min-p), capturable in a
/// CUDA graph: the per-row parameters live in device memory, so a captured graph picks up new
/// values on every replay; only the sampled ids need to be copied back.
///
/// Plain types only (nvcc cannot include pagoda's core headers). The launcher enqueues on
/// `stream`, never synchronizes or allocates, and returns the launch error.
///
/// Semantics per row (those of the CPU Sampler, sampler.h, in distribution):
///  * temperature == 0, top_k == 1, or a non-finite row maximum: argmax, lowest index on ties.
///  * otherwise p = softmax(logits / temperature); keep the top_k most likely tokens (top_k <= 0
///    or >= vocab: all; ties at the cut broken by lower index, like the CPU's stable order), then
///    the smallest prefix (descending p, ties by index) whose mass reaches top_p of the top-k
///    mass (top_p >= 1: all), then drop tokens with p < min_p * p_max (min_p <= 0: none);
///    renormalise and draw by inverse CDF over the kept tokens in index order with the 64-bit
///    Philox4x32-10 draw of (seed, step) (philox.h): deterministic per (seed, step, logits),
///    independent of the row's position in the batch and of the other rows.
/// Numerics: w = expf((x - max) / T) in f32 (as x - max times the f32 reciprocal of T) is turned
/// into fixed point W = rn(w * 2^45) (u64); all masses (top-p, the inverse CDF) are exact integer
/// sums of W, so the result is bit-for-bit deterministic. Consequences: tokens with
/// p < 2^-46 p_max (W == 0) are never sampled, and while top-k or top-p is active tokens with
/// p < e^-32 p_max (1.3e-14) are dropped (they carry no fixed-point mass). NaN logits count as
/// -inf. vocab <= 262144 (so that the fixed-point sums fit in 64 bits).
/// Cost: one 1024-thread block per row; 1 pass over the row for greedy, 2 for plain temperature,
/// 3 to 10 (all of top-k + top-p) otherwise; ~37 KiB static shared memory; no global workspace.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace pagoda::model::cuda_kernels {

/// Device-resident sampling parameters of one row (32 bytes; host code fills an array of them).
/// Values are validated on the host (SamplingParams::validate); out-of-range values never
/// fault (temperature < 0 or NaN samples greedily, top_p <= 0 keeps the top token, min_p >= 1
/// keeps only tokens equal to the maximum, or the argmax).
struct SamplingRowParams {
  float temperature;  ///< 0 = greedy
  int32_t top_k;      ///< <= 0 = no top-k filter; 1 = greedy
  float top_p;        ///< (0, 1]; 1 = no nucleus filter
  float min_p;        ///< [0, 1); 0 = no min-p filter
  uint64_t seed;      ///< the request's seed (Philox key)
  int64_t step;       ///< the draw index within the request (Philox counter), e.g. the output position
};
static_assert(sizeof(SamplingRowParams) == 32, "SamplingRowParams is a 32-byte POD");

/// Largest vocabulary sample_tokens accepts.
inline constexpr int kMaxSampleVocab = 262144;

/// Bytes of global workspace sample_tokens needs for (rows, vocab): currently 0 (everything lives
/// in shared memory); callers should still allocate what this returns and pass it, so a future
/// multi-block version can use it.
size_t sample_tokens_workspace_bytes(int rows, int vocab);

/// out_ids[r] = the token sampled from logits[r * row_stride, + vocab) (f32, device) with
/// params[r] (device), for r in [0, rows). row_stride is in elements (0 = every row reads the same
/// logits). Returns cudaErrorInvalidValue for vocab outside [1, kMaxSampleVocab] or a workspace
/// smaller than sample_tokens_workspace_bytes; cudaSuccess without a launch when rows == 0.
cudaError_t sample_tokens(const float* logits, int64_t row_stride, const SamplingRowParams* params,
                          int rows, int vocab, int32_t* out_ids, void* workspace,
                          size_t workspace_bytes, cudaStream_t stream);

}  // namespace pagoda::model::cuda_kernels
