#pragma once
/// HiCacheConfig: the hierarchical KV cache's options (CLI --hicache-*). Contract:
/// docs/design/tier.md.

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/kv/host_pool.h"

namespace pagoda::tier {

/// When the device's pages get a host copy.
enum class WritePolicy : uint8_t {
  kWriteThrough,           ///< when the tree stores them (SGLang's default)
  kWriteThroughSelective,  ///< once admissions hit them `selective_threshold` times
  kWriteBack,              ///< only when the device evicts them
};

/// "write_through", "write_through_selective", "write_back".
std::string_view write_policy_name(WritePolicy p);
/// By name; throws Error(kInvalidArgument) listing the names.
WritePolicy parse_write_policy(std::string_view name);

/// How long a queued request's admission waits for its prefix's pages from storage (read ahead
/// while it waits; docs/design/tier.md "Prefetch").
enum class PrefetchPolicy : uint8_t {
  kBestEffort,    ///< never waits: admitted with the pages that have arrived
  kWaitComplete,  ///< until every present page is read
  kTimeout,       ///< until the read-ahead is done or its timeout passed, then uses what arrived
};
/// "best_effort", "wait_complete", "timeout".
std::string_view prefetch_policy_name(PrefetchPolicy p);
/// By name; throws Error(kInvalidArgument) listing the names.
PrefetchPolicy parse_prefetch_policy(std::string_view name);

struct HiCacheConfig {
  /// Host pool size (a ratio of the device pool or bytes); both 0 = no hierarchical cache.
  kv::HostPoolSize host{};
  WritePolicy write_policy = WritePolicy::kWriteThrough;
  /// Admission hits before a kWriteThroughSelective backup (>= 1).
  int32_t selective_threshold = 2;
  /// Storage tier (L3): "" (none) or "file:DIR" (tier/storage.h).
  std::string storage;
  PrefetchPolicy prefetch = PrefetchPolicy::kWaitComplete;
  /// kTimeout's limit for a read-ahead of n tokens: base + per_1k_tokens * n / 1000 seconds
  /// (SGLang's defaults).
  double prefetch_timeout_base_s = 1.0;
  double prefetch_timeout_per_1k_tokens_s = 0.25;

  bool enabled() const { return host.ratio != 0 || host.bytes != 0; }
  /// kTimeout's limit for a read-ahead of `tokens` tokens.
  std::chrono::steady_clock::duration prefetch_timeout(int64_t tokens) const;
  /// Throws Error(kInvalidArgument) naming the first bad field (sizes are checked against the
  /// device pool when the host pool is built, the storage when it is opened).
  void validate() const;
};

}  // namespace pagoda::tier
