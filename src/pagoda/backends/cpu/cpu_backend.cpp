#include "pagoda/backends/cpu/cpu_backend.h"

#include <memory>

#include "pagoda/backends/cpu/cpu_indexer.h"
#include "pagoda/core/error.h"

namespace pagoda::backends {

CpuBackend::CpuBackend(const attention::BackendContext& ctx, CpuAttentionOptions options)
    : HostPagedBackend(ctx, "cpu", static_capabilities(), make_cpu_batch_attention(options),
                       attention::SparseAttentionPath::kGather),
      pool_(ctx.kv_pool) {}

void CpuBackend::select_index_topk(LayerId layer, const attention::IndexerQuery& q, int k,
                                   std::span<int32_t> topk, std::span<float> scores) {
  const attention::IndexerMetadata* meta = get_indexer_metadata();
  PAGODA_REQUIRE(meta != nullptr, kFailedPrecondition,
                 "backend 'cpu': select_index_topk without indexer metadata (the pool has no "
                 "index keys, or init_forward_metadata was not called)");
  cpu_index_topk(*pool_, layer, *meta, q, k, topk, scores);
}

void register_cpu_backend(attention::BackendRegistry& registry, CpuAttentionOptions options) {
  registry.add("cpu", "SIMD (Highway, runtime ISA dispatch) + OpenMP paged attention on the host",
               CpuBackend::static_capabilities(),
               [options](const attention::BackendContext& ctx) {
                 return std::make_unique<CpuBackend>(ctx, options);
               });
}

}  // namespace pagoda::backends
