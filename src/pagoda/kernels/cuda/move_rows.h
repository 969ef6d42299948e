#pragma once
/// Row moves inside device buffers (speculative decoding's KV commit, KvPool::move_kv): for each
/// of `num_bases` buffers and each pair i, the row_bytes bytes at row src[i] are copied to row
/// dst[i]. Two launches for all buffers: a gather of every source row into `scratch`, then a
/// scatter, so sources and destinations may overlap (all reads happen before any write).
/// Enqueued on `stream`, no allocation, no host sync (CUDA-graph capturable). Never throws.
/// nvcc-safe (no core headers): launch.h's launch_move_rows wraps raw::move_rows into a Status.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pagoda::kernels::cuda {

struct MoveRowsArgs {
  const uint64_t* bases = nullptr;  ///< device array [num_bases] of buffer addresses
  int num_bases = 0;
  int64_t row_bytes = 0;            ///< bytes of one row (same in every buffer)
  const int32_t* src = nullptr;     ///< device [num_pairs] source rows
  const int32_t* dst = nullptr;     ///< device [num_pairs] destination rows
  int num_pairs = 0;
  unsigned char* scratch = nullptr; ///< device, num_bases * num_pairs * row_bytes bytes
};

/// A row gather (AttentionBackend::gather_kv): dst row i = src row rows[i] for i < n, rows of
/// row_bytes bytes, contiguous in dst and row_bytes apart in src. One launch, no allocation, no
/// host sync; rows[i] are valid (the caller's). 16-byte words where row_bytes and both bases
/// allow, else bytes.
struct GatherRowsArgs {
  const unsigned char* src = nullptr;
  int64_t row_bytes = 0;
  const int32_t* rows = nullptr;  ///< device [n]
  int n = 0;
  unsigned char* dst = nullptr;  ///< device, n * row_bytes bytes
};

namespace raw {
/// The gather's launch (none when n or row_bytes is 0); the launch error.
cudaError_t gather_rows(const GatherRowsArgs& args, cudaStream_t stream);
/// The two launches (none when there is nothing to move); the launch error. Arguments are
/// validated by launch_move_rows; row indices by the caller.
cudaError_t move_rows(const MoveRowsArgs& args, cudaStream_t stream);
}  // namespace raw

}  // namespace pagoda::kernels::cuda
