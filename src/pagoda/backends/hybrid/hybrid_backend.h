#pragma once
/// HybridBackend: two backends composed by forward mode (sglang HybridAttnBackend, spec §1.5):
/// kDecode and kIdle go to the decode backend, every other mode to the prefill backend;
/// kTargetVerify goes to the prefill backend unless VerifyRoute::kDecode is chosen. Capabilities
/// are the intersection of both; CUDA-graph hooks are delegated to the decode backend; the ragged
/// calls (extend steps) go to the prefill backend, whose `ragged` capability the hybrid's is.

#include <memory>

#include "pagoda/attention/backend.h"

namespace pagoda::backends {

/// Which child serves kTargetVerify (sglang --speculative-attention-mode).
enum class VerifyRoute : uint8_t { kPrefill, kDecode };

/// The capabilities both `a` and `b` have (lists intersected, empty = any; flags and-ed;
/// max_topk the smaller). Throws kInvalidArgument when the devices differ.
attention::BackendCapabilities intersect_capabilities(const attention::BackendCapabilities& a,
                                                      const attention::BackendCapabilities& b);

/// A hybrid's capabilities: intersect_capabilities of both, and the ragged calls (extend steps
/// only) as the prefill child has them.
attention::BackendCapabilities hybrid_capabilities(const attention::BackendCapabilities& prefill,
                                                   const attention::BackendCapabilities& decode);

class HybridBackend final : public attention::AttentionBackend {
 public:
  /// Takes ownership of both children (non-null; Error(kInvalidArgument) otherwise).
  HybridBackend(std::unique_ptr<attention::AttentionBackend> prefill,
                std::unique_ptr<attention::AttentionBackend> decode,
                VerifyRoute verify = VerifyRoute::kPrefill);

  /// "hybrid(<prefill>,<decode>)".
  std::string name() const override;
  const attention::BackendCapabilities& capabilities() const override { return caps_; }
  /// Plans on the child that serves batch.mode.
  void init_forward_metadata(const attention::ForwardBatch& batch) override;
  void forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                      const attention::AttentionLayer& layer, const attention::ForwardBatch& batch,
                      const TensorView& out, attention::SaveKv save) override;
  void save_kv(const TensorView& k, const TensorView& v, const attention::AttentionLayer& layer,
               const attention::ForwardBatch& batch) override;
  void gather_kv(const attention::AttentionLayer& layer, const attention::ForwardBatch& batch,
                 const attention::KeyWindows& windows, const TensorView& k_out,
                 const TensorView& v_out) override;
  void forward_ragged(const TensorView& q, const TensorView& k, const TensorView& v,
                      const attention::AttentionLayer& layer, const attention::ForwardBatch& batch,
                      const attention::KeyWindows& windows, const TensorView& out,
                      const TensorView& lse) override;
  void forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                      const attention::AttentionLayer& layer, const attention::ForwardBatch& batch,
                      const TensorView& out, attention::SaveKv save) override;

  void init_cuda_graph_state(int max_bs, int max_num_tokens) override;
  void init_forward_metadata_capture_cuda_graph(const attention::ForwardBatch& batch) override;
  void init_forward_metadata_replay_cuda_graph(const attention::ForwardBatch& batch) override;
  int cuda_graph_seq_len_fill_value() const override;

  /// The child that serves `mode` (not owned by the caller).
  attention::AttentionBackend& backend_for(attention::ForwardMode mode) const;
  attention::AttentionBackend& prefill() const { return *prefill_; }
  attention::AttentionBackend& decode() const { return *decode_; }

 private:
  std::unique_ptr<attention::AttentionBackend> prefill_;
  std::unique_ptr<attention::AttentionBackend> decode_;
  VerifyRoute verify_;
  attention::BackendCapabilities caps_;
};

}  // namespace pagoda::backends
