#pragma once
/// DSA lightning-indexer kernels (attention/dsa.h index_topk_host states the math): per query row
/// t and position p the row sees, score = Σ_h w[t, h] · ReLU(q̂[t, h] · key(p)) over the pool's
/// fp8 e4m3 index keys (key = code · the row's power-of-two f32 scale), q̂ each query head on
/// the same grid (kv::quantize_index_key's rule, applied here); then each row's k best
/// positions in (score descending, position ascending) order. Two launches on `stream`, no
/// allocation, no host sync:
///   scores  tensor cores (mma.sync m16n8k16 with positions as M and heads as N: the e4m3 key
///           codes widened to f16 once per 32 heads, the query codes in registers; every
///           product of two codes is exact in the f32 accumulator): 8-warp blocks, a warp 32
///           heads of 16-position m-tiles, 128-position tiles staged by cp.async four deep
///           (16-byte copies per run of consecutive slots: gcd(page_size, 64) positions, the
///           paged layout's contiguity); the head scales fold into the weights, the key scale
///           multiplies the head sum. One wave of blocks.
///   top-k   radix select on the scores' order-preserving bits (11/11/10-bit digits) finds the
///           k-th best score T; the positions above T and the earliest ones equal to T (all of
///           them when they fit: the common case) are gathered, then a bitonic sort orders them
///           by (score descending, position ascending). On sm_90 a row's positions are split
///           over a thread-block cluster of up to 8 blocks (histograms summed through
///           distributed shared memory, the candidates gathered into the first block); one
///           512-thread block per row elsewhere.
/// Positions the row does not see are never read from the pool: draft nodes off its path score
/// -inf, positions past its visible count are not written; a score of -0 is stored as +0 (one zero,
/// as the host's f64 compare sees it). Limits: dim ≤ 128 and a multiple of 4, heads ≤ 128, k ≤
/// 4,096 (kUnsupported from launch_dsa_index_topk otherwise). nvcc-safe (no core headers);
/// launch.h's launch_dsa_index_topk wraps raw::dsa_index_topk into a Status.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace pagoda::kernels::cuda {

inline constexpr int kDsaMaxDim = 128, kDsaMaxHeads = 128, kDsaMaxTopk = 4096;

struct DsaIndexArgs {
  const unsigned char* index_rows = nullptr;  ///< the layer's rows [num_slots, row_bytes]
  int64_t row_bytes = 0;                      ///< dim codes, then the f32 scale (a multiple of 4)
  int dim = 0, heads = 0;
  int rows = 0;  ///< query rows
  /// Row stride of the score scratch: at least every row's visible count (a CUDA graph passes
  /// its capacity). Sizes the launch, with rows; the kernels read the real counts.
  int max_visible = 0;
  int k = 0;
  const float* q = nullptr;             ///< [rows, heads, dim]
  const float* w = nullptr;             ///< [rows, heads]
  const int32_t* visible = nullptr;     ///< [rows] row t sees positions [0, visible[t]) ...
  /// ... of its request, whose position p lives in slot pages[page_begin[t] + p / page_size] ·
  /// page_size + p % page_size (the step's page table: the plan's kv_indices).
  const int32_t* page_begin = nullptr;  ///< [rows]
  const int32_t* pages = nullptr;
  int page_size = 1;
  const int32_t* seen = nullptr;        ///< [rows] positions the row sees (kept: min(k, seen))
  int tree_size = 0;                    ///< verify steps: ... except draft nodes off the path
  const int32_t* tree_begin = nullptr;  ///< [rows] (tree_size > 0)
  const uint8_t* tree_bits = nullptr;   ///< [rows, tree_size] (tree_size > 0)
  float* scores = nullptr;  ///< scratch [rows * max_visible] (-inf where a row does not see)
  int32_t* topk = nullptr;              ///< out [rows, k], -1 padded
  float* topk_scores = nullptr;         ///< out [rows, k], -inf padded
  /// Optional out: row t's selected pool slots (in the top-k's order) at
  /// slot_out[slot_out_begin[t] + i], i < min(k, seen[t]): a sparse plan's kv_indices.
  int32_t* slot_out = nullptr;
  const int32_t* slot_out_begin = nullptr;  ///< [rows] (with slot_out)
};

namespace raw {
/// The two launches (none for zero rows); the first error. Sizes are checked by the caller.
cudaError_t dsa_index_topk(const DsaIndexArgs& args, cudaStream_t stream);
}  // namespace raw

}  // namespace pagoda::kernels::cuda
