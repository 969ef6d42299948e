#pragma once
/// The built-in attention backends and the selection rules of the --backend /
/// --prefill-backend / --decode-backend / --linear-backend flags (sglang_spec §1.5): one backend
/// per layer kind, the attention kind (full and sliding-window layers) and the linear kind
/// (Mamba2 layers, attention/linear_backend.h).
///
///   attention::BackendRegistry registry;
///   backends::register_builtin_backends(registry, selection.kernels);  // reference, cpu, amx, cuda
///   auto backend = backends::make_backend(registry, {.attention = "cpu"}, requirements, ctx);
///   auto linear = backends::make_linear_backend(registry, {.attention = "cpu"}, linear_req, {});

#include <memory>
#include <string>

#include "pagoda/attention/registry.h"
#include "pagoda/backends/hybrid/hybrid_backend.h"
#include "pagoda/backends/kernel_options.h"

namespace pagoda::backends {

/// Registers every backend this build has: "reference" always, "cpu" and "cuda" when built; their
/// factories build backends with `kernels` (a worker registers with its selection's options).
/// The linear kind: "reference" always, "cpu" and "cuda" when their backends are built.
/// Explicit, never a static initialiser. Throws kInvalidArgument if one is already registered or
/// `kernels` is invalid (KernelOptions::validate).
void register_builtin_backends(attention::BackendRegistry& registry,
                               const KernelOptions& kernels = {});

/// The user's backend choice. Empty prefill / decode fall back to `attention`; an empty
/// `attention` falls back to ctx.platform->default_attention_backend() ("reference" without a
/// platform). An empty `linear` falls back to the same base as prefill / decode (`attention`, or
/// the platform's default): `--backend reference` runs both kinds on reference.
struct BackendSelection {
  std::string attention;
  std::string prefill;
  std::string decode;
  std::string linear;  ///< the linear layers' backend (--linear-backend)
  VerifyRoute verify = VerifyRoute::kPrefill;  ///< which side serves kTargetVerify when split
  /// Kernel variants of the backends built for this selection (register_builtin_backends).
  KernelOptions kernels{};
};

/// The (prefill, decode) names `selection` resolves to.
std::pair<std::string, std::string> resolve_selection(const BackendSelection& selection,
                                                      const attention::BackendContext& ctx);

/// Builds the selected backend: one backend when prefill and decode resolve to the same name,
/// otherwise HybridBackend(prefill, decode). Each side is validated against the requirements it
/// serves (decode: CUDA graphs, multi-step draft; prefill: mixed batches, tree mask unless the
/// verify route is kDecode). Throws Error(kUnsupported) naming the reason and what would work.
std::unique_ptr<attention::AttentionBackend> make_backend(
    const attention::BackendRegistry& registry, const BackendSelection& selection,
    const attention::BackendRequirements& requirements, const attention::BackendContext& ctx);

/// The linear-kind name `selection` resolves to on `platform` (null: "reference" as the default).
std::string resolve_linear(const BackendSelection& selection, const platform::Platform* platform);

/// Builds the linear-attention backend of `selection` (resolve_linear). Throws Error(kUnsupported)
/// naming the backend, the reason and what would work: a name with no linear kind (when it came
/// from --backend or the platform's default, the message says to name one with
/// --linear-backend), or one that cannot serve `requirements`.
std::unique_ptr<attention::LinearAttentionBackend> make_linear_backend(
    const attention::BackendRegistry& registry, const BackendSelection& selection,
    const attention::LinearRequirements& requirements, const attention::LinearBackendContext& ctx);

}  // namespace pagoda::backends
