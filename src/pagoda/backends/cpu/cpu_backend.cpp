#include "pagoda/backends/cpu/cpu_backend.h"

#include <memory>

namespace pagoda::backends {

CpuBackend::CpuBackend(const attention::BackendContext& ctx, CpuAttentionOptions options)
    : HostPagedBackend(ctx, "cpu", static_capabilities(), make_cpu_batch_attention(options),
                       attention::SparseAttentionPath::kGather) {}

void register_cpu_backend(attention::BackendRegistry& registry, CpuAttentionOptions options) {
  registry.add("cpu", "SIMD (Highway, runtime ISA dispatch) + OpenMP paged attention on the host",
               CpuBackend::static_capabilities(),
               [options](const attention::BackendContext& ctx) {
                 return std::make_unique<CpuBackend>(ctx, options);
               });
}

}  // namespace pagoda::backends
