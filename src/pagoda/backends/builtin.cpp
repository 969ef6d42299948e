#include "pagoda/backends/builtin.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pagoda/backends/reference/reference_backend.h"
#include "pagoda/backends/reference/reference_linear_backend.h"
#include "pagoda/core/error.h"
#include "pagoda/platform/platform.h"
#ifdef PAGODA_HAVE_CPU_BACKEND
#include "pagoda/backends/cpu/cpu_backend.h"
#include "pagoda/backends/cpu/cpu_linear_backend.h"
#endif
#ifdef PAGODA_HAVE_AMX_BACKEND
#include "pagoda/backends/amx/amx_backend.h"
#endif
#ifdef PAGODA_HAVE_CUDA_BACKEND
#include "pagoda/backends/cuda/cuda_backend.h"
#include "pagoda/backends/cuda/cuda_linear_backend.h"
#endif

namespace pagoda::backends {

using namespace pagoda::attention;

void register_builtin_backends(BackendRegistry& registry, const KernelOptions& kernels) {
  kernels.validate();
  register_reference_backend(registry);
  register_reference_linear_backend(registry);
#ifdef PAGODA_HAVE_CPU_BACKEND
  register_cpu_backend(registry, {.bf16_tiles = kernels.cpu_bf16,
                                  .bf16_decode = kernels.cpu_bf16_decode});
  register_cpu_linear_backend(registry);
#endif
#ifdef PAGODA_HAVE_AMX_BACKEND
  register_amx_backend(registry, {.decode = {.bf16_tiles = kernels.cpu_bf16,
                                             .bf16_decode = kernels.cpu_bf16_decode,
                                             .amx_decode = kernels.amx_decode},
                                  .tiles = kernels.amx_tiles});
#endif
#ifdef PAGODA_HAVE_CUDA_BACKEND
  register_cuda_backend(registry, kernels);
  register_cuda_linear_backend(registry);
#endif
}

namespace {

/// `attention`, else the platform's default ("reference" without a platform).
std::string base_name(const BackendSelection& selection, const platform::Platform* platform) {
  if (!selection.attention.empty()) return selection.attention;
  return platform != nullptr ? platform->default_attention_backend() : "reference";
}

}  // namespace

std::pair<std::string, std::string> resolve_selection(const BackendSelection& selection,
                                                      const BackendContext& ctx) {
  const std::string base = base_name(selection, ctx.platform);
  return {selection.prefill.empty() ? base : selection.prefill,
          selection.decode.empty() ? base : selection.decode};
}

std::string resolve_linear(const BackendSelection& selection, const platform::Platform* platform) {
  return selection.linear.empty() ? base_name(selection, platform) : selection.linear;
}

std::unique_ptr<LinearAttentionBackend> make_linear_backend(const BackendRegistry& registry,
                                                            const BackendSelection& selection,
                                                            const LinearRequirements& requirements,
                                                            const LinearBackendContext& ctx) {
  const std::string name = resolve_linear(selection, ctx.platform);
  PAGODA_REQUIRE(!selection.linear.empty() || registry.contains_linear(name), kUnsupported,
                 "the linear (Mamba2) layers follow the attention backend '{}', which has no "
                 "linear-attention backend; name one with --linear-backend (registered: {})",
                 name, fmt::join(registry.linear_names(), ", "));
  return registry.create_linear(name, requirements, ctx);
}

std::unique_ptr<AttentionBackend> make_backend(const BackendRegistry& registry,
                                               const BackendSelection& selection,
                                               const BackendRequirements& requirements,
                                               const BackendContext& ctx) {
  const auto [prefill, decode] = resolve_selection(selection, ctx);
  if (prefill == decode) return registry.create(prefill, requirements, ctx);
  const bool verify_on_decode = selection.verify == VerifyRoute::kDecode;
  BackendRequirements prefill_req = requirements;
  prefill_req.cuda_graph = false;
  prefill_req.multi_step_draft = false;
  if (verify_on_decode) prefill_req.custom_mask = false;
  BackendRequirements decode_req = requirements;
  decode_req.mixed_batches = false;
  if (!verify_on_decode) decode_req.custom_mask = false;
  // Validate both before building either.
  registry.validate(prefill, prefill_req);
  registry.validate(decode, decode_req);
  return std::make_unique<HybridBackend>(registry.create(prefill, prefill_req, ctx),
                                         registry.create(decode, decode_req, ctx),
                                         selection.verify);
}

}  // namespace pagoda::backends
