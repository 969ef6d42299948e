#include "pagoda/backends/amx/amx_backend.h"

#include <memory>

namespace pagoda::backends {

attention::BackendCapabilities AmxBackend::static_capabilities() {
  attention::BackendCapabilities c;
  c.q_dtypes = {DType::kBF16, DType::kF32};
  c.kv_dtypes = {DType::kBF16};
  c.non_causal = true;
  c.mixed_batches = true;
  c.lse = true;
  c.device = "cpu";
  return c;
}

AmxBackend::AmxBackend(const attention::BackendContext& ctx, AmxOptions options)
    : HostPagedBackend(ctx, "amx", static_capabilities(), make_amx_batch_attention(options)) {}

void register_amx_backend(attention::BackendRegistry& registry, AmxOptions options) {
  registry.add("amx",
               "bf16 Q·Kᵀ / P·V on AMX tiles (oneDNN's matmul without AMX) over packed K/V on "
               "the host; decode on the cpu kernels",
               AmxBackend::static_capabilities(),
               [options](const attention::BackendContext& ctx) {
                 return std::make_unique<AmxBackend>(ctx, options);
               });
}

}  // namespace pagoda::backends
