#pragma once
/// DSA lightning-indexer kernels (attention/dsa.h index_topk_host states the math): per query row
/// t and position p the row sees, score = Σ_h w[t, h] · ReLU(q[t, h] · key(p)) over the pool's
/// fp8 e4m3 index keys (key = code · the row's f32 scale), in f32; then each row's k best
/// positions by (score descending, position ascending) through a stable segmented radix sort
/// (CUB). Three launches on `stream` (scores, sort, gather of the first k), no allocation, no
/// host sync. A score of -0 is stored as +0 (the sort would order the two zeros apart; the
/// host's f64 compare treats them as a tie). nvcc-safe (no core headers); launch.h's
/// launch_dsa_index_topk wraps raw::dsa_index_topk into a Status.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace pagoda::kernels::cuda {

struct DsaIndexArgs {
  const unsigned char* index_rows = nullptr;  ///< the layer's rows [num_slots, row_bytes]
  int64_t row_bytes = 0;                      ///< dim codes, then the f32 scale
  int dim = 0, heads = 0;
  int rows = 0;         ///< query rows
  int max_visible = 0;  ///< segment length of the score arrays (max over rows of visible)
  int k = 0;
  const float* q = nullptr;             ///< [rows, heads, dim]
  const float* w = nullptr;             ///< [rows, heads]
  const int32_t* visible = nullptr;     ///< [rows] row t sees positions [0, visible[t]) ...
  const int32_t* slot_begin = nullptr;  ///< [rows] ... at slots[slot_begin[t] + p]
  const int32_t* slots = nullptr;
  const int32_t* seen = nullptr;        ///< [rows] positions the row sees (kept: min(k, seen))
  int tree_size = 0;                    ///< verify steps: ... except draft nodes off the path
  const int32_t* tree_begin = nullptr;  ///< [rows] (tree_size > 0)
  const uint8_t* tree_bits = nullptr;   ///< [rows, tree_size] (tree_size > 0)
  const int32_t* offsets = nullptr;     ///< [rows + 1] = t * max_visible (the sort's segments)
  float* keys = nullptr;                ///< scratch [rows * max_visible] (scores, -inf unseen)
  int32_t* vals = nullptr;              ///< scratch [rows * max_visible] (positions)
  float* keys_out = nullptr;            ///< scratch, same size
  int32_t* vals_out = nullptr;          ///< scratch, same size
  void* temp = nullptr;                 ///< the sort's scratch, temp_bytes (dsa_index_temp_bytes)
  size_t temp_bytes = 0;
  int32_t* topk = nullptr;       ///< out [rows, k], -1 padded
  float* topk_scores = nullptr;  ///< out [rows, k], -inf padded
};

namespace raw {
/// Scratch bytes the sort needs for `rows` segments of `max_visible` (no launch).
size_t dsa_index_temp_bytes(int rows, int max_visible);
/// The three launches (none for zero rows); the first error. Sizes are checked by the caller.
cudaError_t dsa_index_topk(const DsaIndexArgs& args, cudaStream_t stream);
}  // namespace raw

}  // namespace pagoda::kernels::cuda
