#pragma once
/// CpuBackend: the AttentionBackend for host KV pools on top of CpuBatchAttention (SIMD +
/// OpenMP). Same feature set as the reference backend (decode, extend with prefix, mixed,
/// causal / non-causal, sliding window, soft cap, sinks, tree-mask verify, multi-step draft,
/// MLA absorbed, fp8 KV with scales, LSE, any page size, head dims 1..1024); no CUDA graphs.
///
/// Plan once per step (init_forward_metadata: build_paged_plan + CpuBatchAttention::plan of the
/// work partition for the first layer shape seen, re-planned only when a layer's shape differs),
/// run per layer. Host pools only. One caller thread at a time.

#include <memory>
#include <optional>
#include <string>

#include "pagoda/attention/backend.h"
#include "pagoda/attention/paged_plan.h"
#include "pagoda/attention/registry.h"
#include "pagoda/backends/cpu/cpu_batch_attention.h"

namespace pagoda::backends {

class CpuBackend : public attention::AttentionBackend {
 public:
  /// `ctx.kv_pool` and `ctx.req_to_token` must be non-null host objects that outlive the backend
  /// (Error(kInvalidArgument) otherwise; Error(kUnsupported) for a device pool).
  explicit CpuBackend(const attention::BackendContext& ctx, CpuAttentionOptions options = {});

  std::string name() const override { return "cpu"; }
  const attention::BackendCapabilities& capabilities() const override;
  /// Builds the step's PagedPlan; throws on bad input, keeping the previous plan.
  void init_forward_metadata(const attention::ForwardBatch& batch) override;
  void forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                      const attention::AttentionLayer& layer, const attention::ForwardBatch& batch,
                      const TensorView& out, attention::SaveKv save) override;
  void forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                      const attention::AttentionLayer& layer, const attention::ForwardBatch& batch,
                      const TensorView& out, attention::SaveKv save) override;

  /// The CPU backend's capabilities (everything but CUDA graphs).
  static attention::BackendCapabilities static_capabilities();

 private:
  void run(const TensorView& q, const TensorView& k, const TensorView& v,
           const attention::AttentionLayer& layer, const attention::ForwardBatch& batch,
           const TensorView& out, attention::SaveKv save);

  attention::BackendContext ctx_;
  std::unique_ptr<attention::BatchAttention> attn_;
  attention::PagedPlan plan_;
  bool planned_ = false;
  std::optional<attention::AttentionShape> planned_shape_;  ///< shape attn_ is planned for
  attention::ForwardMode planned_mode_ = attention::ForwardMode::kIdle;
  int planned_tokens_ = 0;
};

/// Registers "cpu" in `registry`.
void register_cpu_backend(attention::BackendRegistry& registry);

}  // namespace pagoda::backends
