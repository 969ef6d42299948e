#include "pagoda/backends/reference/reference_backend.h"

#include <memory>

namespace pagoda::backends {

ReferenceBackend::ReferenceBackend(const attention::BackendContext& ctx, ReferenceFaults faults,
                                   std::string name)
    : HostPagedBackend(ctx, std::move(name), static_capabilities(),
                       make_reference_batch_attention(faults),
                       attention::SparseAttentionPath::kMask, faults.indexer) {}

void register_reference_backend(attention::BackendRegistry& registry) {
  registry.add("reference", "fp64 host loops; the conformance oracle (slow, every feature)",
               ReferenceBackend::static_capabilities(),
               [](const attention::BackendContext& ctx) {
                 return std::make_unique<ReferenceBackend>(ctx);
               });
}

}  // namespace pagoda::backends
