#pragma once
/// KV pool sizes from a memory budget (docs/design/engine.md "Pool sizing"): SGLang's
/// --mem-fraction-static (the weights and the KV pools together fill that fraction of the
/// device's memory) and vLLM's kv_cache_memory_bytes (the pools' bytes given directly); with the
/// sliding-window pool, SGLang's swa_full_tokens_ratio sets the window pool's share of the one
/// budget. Pure functions; the engine gathers the inputs (engine.cpp).

#include <cstdint>

#include "pagoda/platform/platform.h"

namespace pagoda::engine {

/// What size_pools() divides.
struct PoolBudget {
  int64_t budget_bytes = 0;          ///< bytes the KV pools may take together
  int32_t page_size = 16;
  int64_t full_bytes_per_token = 0;  ///< the full pool's (all layers; with an SWA pool the
                                     ///< full-attention layers: 0 when every layer has a window)
  int64_t swa_bytes_per_token = 0;   ///< the SWA pool's (window layers); 0: no SWA pool
  /// SWA pool tokens per full-pool token, in (0, 1] (used when swa_pool_tokens is 0).
  double swa_full_tokens_ratio = 0.8;
  int64_t swa_pool_tokens = 0;       ///< a fixed SWA pool (0: by the ratio)
};

/// Usable tokens of each pool (whole pages; page 0, which every pool adds, is paid from the
/// budget too).
struct PoolSizes {
  int64_t pool_tokens = 0;
  int64_t swa_pool_tokens = 0;  ///< 0 without an SWA pool
};

/// The bytes --mem-fraction-static leaves to the KV pools: fraction · total − (total − free) −
/// pending_weight_bytes (weights still to be copied to the device: the CUDA worker uploads them
/// after the pools), i.e. what remains once the static memory (weights, KV, whatever else is
/// already allocated) fills `fraction` of the device; the rest (activations, CUDA graphs,
/// workspaces) stays free. Throws Error(kInvalidArgument) for a fraction outside (0, 1) and
/// Error(kResourceExhausted) naming the numbers when nothing is left.
int64_t kv_budget_from_fraction(const platform::MemoryInfo& memory, double fraction,
                                int64_t pending_weight_bytes);

/// The largest pools of whole pages whose bytes ((pages + 1) · page_size · bytes per token per
/// pool) fit the budget: one pool without an SWA pool; with one, the SWA pool holds
/// floor(ratio · full pages) pages (or swa_pool_tokens) and the full pool the rest (when the
/// full pool stores no layer its pages are ids only: full pages = SWA pages / ratio). Pages stay
/// under 2^30 / page_size slots. Throws Error(kInvalidArgument) for bad inputs and
/// Error(kResourceExhausted) when the budget holds less than one page of each pool.
PoolSizes size_pools(const PoolBudget& budget);

}  // namespace pagoda::engine
