#pragma once
/// The Mamba2 recurrence on the GPU (the cuda linear-attention backend, backends/cuda/
/// cuda_linear_backend.h; the math is attention/linear_backend.h's): per layer, on one stream,
///
///   1. conv: one thread per (conv channel, tile of kConvRows rows of one sequence) writes
///      SiLU(bias + Σ_k w·in) over the window [the slot's K-1 past inputs | the new rows] to act
///      [T, conv_dim]; the first tile (the only one that reads the old conv state) then writes the
///      last K-1 inputs back to the slot's conv state. A tree verify (one tile) takes each node's
///      window from its parent's conv state (the sequence's slot for the root) and writes the
///      node's conv state into its node slot.
///   2. token scan: one block per (sequence, head) keeps the head's [head_dim, state_size] SSM
///      state in shared memory and steps the tokens in order (h = exp(Δ·A)·h + Δ·x ⊗ B,
///      y = h·C + D·x, f32), writing y and the final state; a tree verify loads each node's state
///      from its parent's slot and stores it into the node's slot. It serves the sequences the
///      plan gives no SSD chunks (decode, tree verify, short extends) and skips the others.
///   3. chunked SSD scan (ssd_chunk_scan.cu), only when the plan has chunks: the sequences with
///      chunks (seq_chunk) are cut into chunks of kSsdChunk rows and run as three launches:
///      chunk states (each chunk's own contribution to the state, from a zero state), the state
///      pass (sequential over one sequence's chunks, parallel over heads and state elements: the
///      state entering each chunk, and the final state into the slot), chunk outputs (inside the
///      chunk the masked (C·Bᵀ ∘ decay)·X product, plus C·h_in scaled by the decay from the
///      chunk's start, plus D·x). f32 FMA in shared memory throughout.
///
/// States: slot-major as kv::StatePool keeps them: slot s's state block of the layer starts at
/// states + s * slot_stride (conv [K-1, conv_dim] time-major, then SSM [H, P, N]). Every index
/// array is device memory; every slot is trusted (the backend validated the plan). Plain types
/// only (nvcc-compiled header); launchers never allocate and never synchronize. Math is the
/// target's (fast math: __expf-class exp, approximate division), f32 throughout.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pagoda::kernels::cuda {

struct LinearRecurrenceArgs {
  // Inputs and output ([T, ...] rows at the given strides, elements contiguous; f32).
  const float* xbc = nullptr;  ///< [T, conv_dim] the projected xBC before the conv
  int64_t xbc_stride = 0;
  const float* dt = nullptr;   ///< [T, H] the raw time step
  int64_t dt_stride = 0;
  float* y = nullptr;          ///< [T, H·P] written
  int64_t y_stride = 0;
  float* act = nullptr;        ///< scratch [T, conv_dim] (contiguous): the conv's SiLU output
  // Weights (f32, device).
  const float* conv = nullptr;       ///< [conv_dim, K]
  const float* conv_bias = nullptr;  ///< [conv_dim] or null
  const float* dt_bias = nullptr;    ///< [H]
  const float* a_log = nullptr;      ///< [H]
  const float* d = nullptr;          ///< [H]
  // Sizes.
  int num_heads = 0;   ///< H
  int head_dim = 0;    ///< P
  int state_size = 0;  ///< N
  int num_groups = 1;  ///< G (divides H; head h reads group h / (H / G))
  int conv_kernel = 1; ///< K >= 1
  float dt_min = 0.f;  ///< Δ clamp
  float dt_max = 0.f;
  // States of this layer.
  float* states = nullptr;  ///< slot 0's block of this layer
  int64_t slot_stride = 0;  ///< floats between consecutive slots' blocks
  // The plan (device int32 arrays).
  int num_seqs = 0;
  const int32_t* seq_slot = nullptr;   ///< [num_seqs] each sequence's state slot
  const int32_t* seq_start = nullptr;  ///< [num_seqs + 1] first row of each sequence; last = T
  const int32_t* seq_nodes = nullptr;  ///< [num_seqs] offset of its tree nodes, -1 if none
  const int32_t* node_slot = nullptr;  ///< [nodes] each tree node's slot
  const int32_t* node_parent = nullptr;  ///< [nodes] parent node (index within its tree) or -1
  // The conv's row tiles and the chunked SSD scan's chunks (ssd_chunk_scan.cu): prefix sums
  // over the sequences (conv_tiles, ssd_chunks); the grids cover the totals, no empty blocks.
  const int32_t* seq_tile = nullptr;   ///< [num_seqs + 1] first conv tile of each sequence
  int num_tiles = 0;                   ///< seq_tile[num_seqs]
  const int32_t* seq_chunk = nullptr;  ///< [num_seqs + 1] first SSD chunk of each sequence
  int num_chunks = 0;  ///< seq_chunk[num_seqs]; 0: the chunked scan is not launched
  float* chunk_states = nullptr;  ///< scratch ssd_scratch_floats(num_chunks, H, P, N)
};

/// Rows of one conv block: one sequence's rows run in parallel tiles of this many (each thread
/// one channel steps its tile's rows); conv_kernel - 1 must not exceed it, so only the first
/// tile reads the old conv state. 64: 128 x 34 blocks for 8192 tokens of the Bamba layer.
constexpr int kConvRows = 64;
/// Rows of one SSD chunk. 64 keeps a chunk's C, B (then the entering state), x and masked
/// scores in ~100 KB of shared memory at the Bamba head (P 64, N 128: two blocks per SM), and
/// the [chunks, H, P, N] state scratch (written, read and rewritten once each) at 32 KB per
/// token for that layer; 128 would halve that traffic but need ~230 KB, more than an SM has.
constexpr int kSsdChunk = 64;
/// A sequence (not a tree) of at least this many tokens gets SSD chunks; shorter ones (decode,
/// speculative extends) stay on the token scan. An estimate, not a measurement: the token scan
/// costs ~7 µs per token at the Bamba-1B head (59.2 ms for 8192 tokens on an H100, 8aa53b1),
/// the chunked scan three launches (tens of µs) whatever the length up to a chunk.
constexpr int kSsdChunkedFromTokens = 16;
/// Threads of each chunked-scan block: 16 x 16, each a 4 x 4 register tile of a 64 x 64 tile.
constexpr int kSsdThreads = 256;

/// The conv tiles of a sequence of `tokens` tokens: one for a tree (its nodes run in order) or
/// an empty sequence, else ceil(tokens / kConvRows).
inline int conv_tiles(int tokens, bool tree) {
  return tree || tokens <= kConvRows ? 1 : (tokens + kConvRows - 1) / kConvRows;
}

/// The chunks of a sequence of `tokens` tokens (0 when it stays on the token scan).
inline int ssd_chunks(int tokens, bool tree) {
  return tree || tokens < kSsdChunkedFromTokens ? 0 : (tokens + kSsdChunk - 1) / kSsdChunk;
}

/// Floats of the chunked scan's scratch: each chunk's [H, P, N] state, then each chunk's [H]
/// decay over the whole chunk.
inline int64_t ssd_scratch_floats(int64_t chunks, int heads, int head_dim, int state_size) {
  return chunks * heads * (int64_t{head_dim} * state_size + 1);
}

/// Shared memory of the largest chunked-scan kernel for these sizes (bytes); a device with less
/// opt-in shared memory per block keeps every sequence on the token scan.
int64_t ssd_chunk_smem_bytes(int head_dim, int state_size);

/// Shared memory the scan kernel needs for these sizes (bytes).
inline int64_t linear_scan_smem_bytes(int head_dim, int state_size) {
  return (int64_t{head_dim} * state_size + head_dim + 2 * int64_t{state_size}) * 4;
}

namespace raw {
/// The conv launch, the token scan launch, then ssd_chunk_scan when num_chunks > 0 (nothing
/// when num_seqs is 0); the first launch error. Arguments are validated by
/// launch_linear_recurrence.
cudaError_t linear_recurrence(const LinearRecurrenceArgs& args, cudaStream_t stream);
/// The chunked SSD scan's three launches (chunk states, state pass, chunk outputs) over the
/// sequences with chunks; reads act (the conv's output) and dt, writes y, chunk_states and the
/// SSM states of those sequences' slots.
cudaError_t ssd_chunk_scan(const LinearRecurrenceArgs& args, cudaStream_t stream);
}  // namespace raw

}  // namespace pagoda::kernels::cuda
