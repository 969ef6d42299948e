#pragma once
/// ReferenceBackend: an AttentionBackend on top of the reference BatchAttention (fp64 host
/// loops). Supports every feature (decode, extend with prefix, mixed, causal / non-causal,
/// sliding window, soft cap, sinks, tree-mask verify, multi-step draft with any topk and page
/// size, MLA absorbed over an MLA pool, fp8 KV with scales, LSE) on host pools; no CUDA graphs.

#include <memory>

#include "pagoda/attention/backend.h"
#include "pagoda/attention/paged_plan.h"
#include "pagoda/attention/registry.h"
#include "pagoda/backends/reference/reference_batch_attention.h"

namespace pagoda::backends {

class ReferenceBackend : public attention::AttentionBackend {
 public:
  /// `ctx.kv_pool` and `ctx.req_to_token` must be non-null host objects that outlive the
  /// backend (Error(kInvalidArgument) otherwise). `faults` exists for the conformance mutant.
  explicit ReferenceBackend(const attention::BackendContext& ctx, ReferenceFaults faults = {},
                            std::string name = "reference");

  std::string name() const override { return name_; }
  const attention::BackendCapabilities& capabilities() const override;
  /// Builds the PagedPlan of `batch` (build_paged_plan); throws on bad input, keeping the
  /// previous plan.
  void init_forward_metadata(const attention::ForwardBatch& batch) override;
  void forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                      const attention::AttentionLayer& layer, const attention::ForwardBatch& batch,
                      const TensorView& out, attention::SaveKv save) override;
  void forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                      const attention::AttentionLayer& layer, const attention::ForwardBatch& batch,
                      const TensorView& out, attention::SaveKv save) override;

  /// The reference backend's capabilities (everything but CUDA graphs; any page size / dim).
  static attention::BackendCapabilities static_capabilities();

 private:
  void run(const TensorView& q, const TensorView& k, const TensorView& v,
           const attention::AttentionLayer& layer, const attention::ForwardBatch& batch,
           const TensorView& out, attention::SaveKv save);

  attention::BackendContext ctx_;
  std::string name_;
  std::unique_ptr<attention::BatchAttention> attn_;
  attention::PagedPlan plan_;
  bool planned_ = false;
  attention::ForwardMode planned_mode_ = attention::ForwardMode::kIdle;
  int planned_tokens_ = 0;
};

/// Registers "reference" in `registry`.
void register_reference_backend(attention::BackendRegistry& registry);

}  // namespace pagoda::backends
