#pragma once
/// HiCacheConfig: the hierarchical KV cache's options (CLI --hicache-*). Contract:
/// docs/design/tier.md.

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

/// How long an admission waits for its prefix's pages from storage.
enum class PrefetchPolicy : uint8_t {
  kBestEffort,    ///< never waits (needs a background prefetch: not implemented yet)
  kWaitComplete,  ///< until every present page is read
  kTimeout,       ///< until 1 s + 0.25 s per 1,000 tokens, then uses what arrived
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

  bool enabled() const { return host.ratio != 0 || host.bytes != 0; }
  /// Throws Error(kInvalidArgument) naming the first bad field (sizes are checked against the
  /// device pool when the host pool is built, the storage when it is opened), kUnsupported for
  /// the best_effort prefetch policy.
  void validate() const;
};

}  // namespace pagoda::tier
