#pragma once
/// CudaLinearBackend: the "cuda" linear-attention (Mamba2) backend (attention/linear_backend.h
/// gives the math; docs/design/state_pool.md "Linear-attention backends"). It runs on a device
/// kv::StatePool of the same CUDA platform, with f32 xBC / dt / y views and f32 weights in that
/// device's memory.
///
/// Per step, init_forward_metadata stages the plan (each sequence's slot, first row, tree
/// offset, first conv tile and first SSD chunk; the tree nodes' slots and parents) in pinned memory and uploads
/// it once into a device buffer on the platform's stream (both grow-only; a growth synchronizes
/// the stream first). A sequence (not a tree) of kSsdChunkedFromTokens or more tokens gets
/// ceil(tokens / kSsdChunk) chunks when the chunked scan's shared memory fits the device.
/// forward() then enqueues per layer (kernels/cuda/linear_params.h): the causal depthwise conv +
/// SiLU with the conv state, in row tiles, into a scratch [T, conv_dim] (grown at plan time);
/// the token scan, one block per (sequence, head) stepping the tokens in order with the head's
/// [head_dim, state_size] state in shared memory, for the sequences without chunks (decode,
/// trees, short extends); and, when the plan has chunks, the chunked SSD scan's three kernels
/// over the others, with a [chunks, H, P, N] state scratch (grown at plan time). A tree verify
/// runs node by node: each node's conv window and SSM state come from its parent's slot (the
/// sequence's for the root) and go to its own. Nothing synchronizes the host after
/// construction except those growths.
///
/// Not built yet: CUDA graphs (capabilities().cuda_graph is false: the plan buffers move when
/// they grow and there are no capture / replay hooks), and tensor cores for the chunked scan
/// (f32 FMA: bf16 / tf32 operands miss the f32 contract). Shared memory bounds the head:
/// 4·(head_dim·state_size + head_dim + 2·state_size) bytes must fit the device's opt-in limit
/// (Error(kUnsupported) naming the sizes otherwise).
///
/// Threading: one thread; every launch goes to the platform's stream.

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "pagoda/attention/linear_backend.h"
#include "pagoda/attention/registry.h"
#include "pagoda/platform/platform.h"

namespace pagoda::backends {

class CudaLinearBackend final : public attention::LinearAttentionBackend {
 public:
  /// ctx.platform must be a CUDA platform (its stream, allocators and events) that outlives the
  /// backend; Error(kInvalidArgument) otherwise.
  explicit CudaLinearBackend(const attention::LinearBackendContext& ctx);

  std::string name() const override { return "cuda"; }
  /// f32 views on "cuda", tree verify, no CUDA graphs.
  const attention::LinearCapabilities& capabilities() const override {
    return static_capabilities();
  }
  static const attention::LinearCapabilities& static_capabilities();

 protected:
  /// Stages and uploads the plan; grows the conv scratch to T rows.
  void planned() override;
  void run(const attention::LinearLayer& layer, const TensorView& xbc, const TensorView& dt,
           const TensorView& y) override;

 private:
  platform::Platform* platform_;
  cudaStream_t stream_;
  /// The plan as int32: seq_slot [S] | seq_start [S + 1] | seq_nodes [S] | seq_tile [S + 1] |
  /// seq_chunk [S + 1] | node_slot [M] | node_parent [M], staged in plan_host_ (pinned) and
  /// uploaded to plan_dev_.
  platform::DeviceBuffer plan_host_, plan_dev_;
  size_t plan_capacity_ = 0;  ///< bytes of each plan buffer
  std::unique_ptr<platform::Event> plan_uploaded_;  ///< the last upload (reads plan_host_)
  int32_t num_seqs_ = 0, num_nodes_ = 0;
  platform::DeviceBuffer act_;  ///< the conv's output [T, conv_dim] f32
  size_t act_capacity_ = 0;     ///< bytes
  int32_t num_tiles_ = 0, num_chunks_ = 0;  ///< conv tiles and SSD chunks of the plan
  platform::DeviceBuffer ssd_;  ///< the chunked scan's scratch (ssd_scratch_floats) f32
  size_t ssd_capacity_ = 0;     ///< bytes
};

/// Registers the linear kind of "cuda" in `registry` (beside the attention kind: --backend cuda
/// selects both).
void register_cuda_linear_backend(attention::BackendRegistry& registry);

}  // namespace pagoda::backends
