#pragma once
/// ReferenceBackend: the HostPagedBackend over the reference BatchAttention (fp64 host loops).
/// Supports every feature (decode, extend with prefix, mixed, causal / non-causal, sliding
/// window, soft cap, sinks, tree-mask verify, multi-step draft with any topk and page size, MLA
/// absorbed over an MLA pool, fp8 KV with scales, LSE, DeepSeek sparse attention) on host pools;
/// no CUDA graphs. DSA keeps the mask path (attention/dsa.h SparseAttentionPath::kMask): every
/// key visited under a bit per (row, position), the plain statement the cpu backend's gather
/// path is checked against.

#include <string>

#include "pagoda/attention/host_paged_backend.h"
#include "pagoda/attention/registry.h"
#include "pagoda/backends/reference/reference_batch_attention.h"

namespace pagoda::backends {

class ReferenceBackend : public attention::HostPagedBackend {
 public:
  /// `ctx.kv_pool` and `ctx.req_to_token` must be non-null host objects that outlive the
  /// backend (Error(kInvalidArgument) otherwise). `faults` exists for the conformance mutant.
  explicit ReferenceBackend(const attention::BackendContext& ctx, ReferenceFaults faults = {},
                            std::string name = "reference");

  /// The reference backend's capabilities (everything but CUDA graphs; any page size / dim).
  static attention::BackendCapabilities static_capabilities() {
    return attention::full_feature_capabilities();
  }
};

/// Registers "reference" in `registry`.
void register_reference_backend(attention::BackendRegistry& registry);

}  // namespace pagoda::backends
