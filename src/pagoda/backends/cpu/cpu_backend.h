#pragma once
/// CpuBackend: the HostPagedBackend over CpuBatchAttention (Highway SIMD + OpenMP). Same
/// feature set as the reference backend (decode, extend with prefix, mixed, causal / non-causal,
/// sliding window, soft cap, sinks, tree-mask verify, multi-step draft, MLA absorbed, fp8 KV with
/// scales, LSE, any page size, head dims 1..1024); no CUDA graphs.
///
/// Plan once per step (build_paged_plan, then CpuBatchAttention::plan of the work partition for
/// the first layer shape seen, re-planned only when a layer's shape differs), run per layer.
/// DeepSeek sparse attention takes the gather path (attention/dsa.h SparseAttentionPath::kGather):
/// a DSA layer reads only the selected latent rows, O(k) per query row. The lightning indexer
/// (select_index_topk) runs in f32 on OpenBLAS and OpenMP (cpu_indexer.h), not the reference's
/// one-thread f64 index_topk_host.
/// Host pools only. One caller thread at a time.

#include "pagoda/attention/host_paged_backend.h"
#include "pagoda/attention/registry.h"
#include "pagoda/backends/cpu/cpu_batch_attention.h"

namespace pagoda::backends {

class CpuBackend : public attention::HostPagedBackend {
 public:
  /// `ctx.kv_pool` and `ctx.req_to_token` must be non-null host objects that outlive the backend
  /// (Error(kInvalidArgument) otherwise; Error(kUnsupported) for a device pool).
  explicit CpuBackend(const attention::BackendContext& ctx, CpuAttentionOptions options = {});

  /// The CPU backend's capabilities (everything but CUDA graphs).
  static attention::BackendCapabilities static_capabilities() {
    return attention::full_feature_capabilities();
  }

  /// cpu_index_topk over the context's pool and this step's indexer metadata.
  void select_index_topk(LayerId layer, const attention::IndexerQuery& q, int k,
                         std::span<int32_t> topk, std::span<float> scores) override;

 private:
  const kv::KvPool* pool_;
};

/// Registers "cpu" in `registry`; its factory builds CpuBackend(ctx, options).
void register_cpu_backend(attention::BackendRegistry& registry, CpuAttentionOptions options = {});

}  // namespace pagoda::backends
