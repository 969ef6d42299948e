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
/// Cost (two paths, same results bit for bit: the only difference is how the row maximum and
/// argmax are found, and that function is order-independent):
///  * single-block: one 1024-thread block per row; 1 pass over the row for greedy, 2 for plain
///    temperature, 3 to 10 (all of top-k + top-p) otherwise; ~37 KiB static shared memory; no
///    global workspace. Used for large batches (rows > kSampleSplitMaxRows) and small vocabularies.
///  * split-row (rows <= kSampleSplitMaxRows, vocab > kSampleSplitSlice): pass 1 reduces the
///    row's max/argmax over ceil(vocab / kSampleSplitSlice) blocks of 256 threads per row (grid
///    (parts, rows); each block writes one 8-byte partial to the workspace), pass 2 is the
///    single-block kernel reading the partials instead of the row: greedy rows finish at once,
///    sampling rows run the remaining passes of the single-block kernel. Two launches.

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

/// One logit changed before sampling (the layout of model::LogitAdjust, checked in cuda_ops.cpp):
/// logits[row * vocab + token] = l1 > 0 ? l1 / rep : l1 * rep, minus sub, with l1 = l + bias.
struct LogitAdjustEntry {
  int32_t row;
  int32_t token;
  float bias;
  float rep;
  float sub;
};
static_assert(sizeof(LogitAdjustEntry) == 20, "LogitAdjustEntry is a 20-byte POD");

/// Applies adj[n] (device) to logits [rows, vocab] (f32, device) in place, one thread per entry;
/// entries must name distinct (row, token) pairs in range. cudaSuccess without a launch for n <= 0.
cudaError_t adjust_logits(float* logits, int64_t vocab, const LogitAdjustEntry* adj, int64_t n,
                          cudaStream_t stream);

/// Structured output's token masks (model::ModelOps::mask_logits) on logits [.., vocab] (f32,
/// device) in place: for i < *count, row rows[i] keeps token t only where bit t % 32 of
/// mask[i * W + t / 32] is set (W = ceil(vocab / 32)); every other logit becomes -inf. rows,
/// mask and count are device memory; the launch covers max_rows rows (blocks of rows past
/// *count exit at once), so a captured graph replays it with any count <= max_rows. Bits past
/// vocab and rows past *count are never read. cudaSuccess without a launch for max_rows <= 0.
cudaError_t mask_logits(float* logits, int64_t vocab, const int32_t* rows, const uint32_t* mask,
                        const int32_t* count, int64_t max_rows, cudaStream_t stream);

/// Largest vocabulary sample_tokens accepts.
inline constexpr int kMaxSampleVocab = 262144;

/// Most rows for which sample_tokens takes the split-row path.
inline constexpr int kSampleSplitMaxRows = 64;
/// Logits per pass-1 block of the split-row path (the path needs vocab > this: 2+ blocks a row).
inline constexpr int kSampleSplitSlice = 4096;

/// Bytes of global workspace sample_tokens needs for (rows, vocab): a function of (rows, vocab)
/// only: 0 on the single-block path, and on the split-row path (rows in [1, kSampleSplitMaxRows],
/// vocab in (kSampleSplitSlice, kMaxSampleVocab]) kSampleSplitMaxRows * ceil(vocab /
/// kSampleSplitSlice) * 8, the same for every such rows (at most 64 * 64 * 8 = 32 KiB), so a
/// caller that grows its buffer on demand allocates it once, at the first small batch, and never
/// frees a workspace that an earlier captured graph still uses. Allocate it outside graph
/// capture. The workspace holds no state between calls (no zeroing needed); calls sharing it must
/// be ordered (one stream).
size_t sample_tokens_workspace_bytes(int rows, int vocab);

/// out_ids[r] = the token sampled from logits[r * row_stride, + vocab) (f32, device) with
/// params[r] (device), for r in [0, rows). row_stride is in elements (0 = every row reads the same
/// logits). Returns cudaErrorInvalidValue for vocab outside [1, kMaxSampleVocab], a workspace
/// smaller than sample_tokens_workspace_bytes, or (split-row path) a workspace not 8-byte aligned;
/// cudaSuccess without a launch when rows == 0.
cudaError_t sample_tokens(const float* logits, int64_t row_stride, const SamplingRowParams* params,
                          int rows, int vocab, int32_t* out_ids, void* workspace,
                          size_t workspace_bytes, cudaStream_t stream);

/// Which kernels sample_tokens_with uses (tests, benchmarks); the results are the same.
enum class SamplePath : int32_t {
  kAuto = 0,         ///< what sample_tokens does (split-row for small batches, see above)
  kSingleBlock = 1,  ///< one block per row, no workspace
  kSplitRow = 2,     ///< split-row at any rows (<= 65535) and vocab; workspace:
                     ///< sample_tokens_split_workspace_bytes
};

/// Workspace of the split-row path forced at (rows, vocab): rows * ceil(vocab / 4096) * 8.
size_t sample_tokens_split_workspace_bytes(int rows, int vocab);

/// sample_tokens on a chosen path (same contract; kSplitRow checks the workspace against
/// sample_tokens_split_workspace_bytes and returns cudaErrorInvalidValue for rows > 65535).
cudaError_t sample_tokens_with(SamplePath path, const float* logits, int64_t row_stride,
                               const SamplingRowParams* params, int rows, int vocab,
                               int32_t* out_ids, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream);

}  // namespace pagoda::model::cuda_kernels
