#pragma once
/// The Mamba2 recurrence on the GPU (the cuda linear-attention backend, backends/cuda/
/// cuda_linear_backend.h; the math is attention/linear_backend.h's): per layer two launches on
/// one stream,
///
///   1. conv: one thread per (sequence, conv channel) steps the sequence's tokens in order over
///      the window [the slot's K-1 past inputs | the new rows], writes SiLU(bias + Σ_k w·in) to
///      act [T, conv_dim] and the last K-1 inputs back to the slot's conv state; a tree verify
///      takes each node's window from its parent's conv state (the sequence's slot for the root)
///      and writes the node's conv state into its node slot;
///   2. scan: one block per (sequence, head) keeps the head's [head_dim, state_size] SSM state
///      in shared memory and steps the tokens in order (h = exp(Δ·A)·h + Δ·x ⊗ B,
///      y = h·C + D·x, f32), writing y and the final state; a tree verify loads each node's
///      state from its parent's slot and stores it into the node's slot.
///
/// This is the correctness-first form: sequential in the tokens (one step per token, like a
/// decode), not the chunked SSD scan on tensor cores. A prefill of T tokens is T dependent steps.
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
};

/// Shared memory the scan kernel needs for these sizes (bytes).
inline int64_t linear_scan_smem_bytes(int head_dim, int state_size) {
  return (int64_t{head_dim} * state_size + head_dim + 2 * int64_t{state_size}) * 4;
}

namespace raw {
/// The conv launch, then the scan launch (nothing when num_seqs is 0); the first launch error.
/// Arguments are validated by launch_linear_recurrence.
cudaError_t linear_recurrence(const LinearRecurrenceArgs& args, cudaStream_t stream);
}  // namespace raw

}  // namespace pagoda::kernels::cuda
