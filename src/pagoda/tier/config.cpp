#include "pagoda/tier/config.h"

#include <cmath>

#include "pagoda/core/error.h"
#include "pagoda/tier/storage.h"

namespace pagoda::tier {

std::string_view write_policy_name(WritePolicy p) {
  switch (p) {
    case WritePolicy::kWriteThrough: return "write_through";
    case WritePolicy::kWriteThroughSelective: return "write_through_selective";
    case WritePolicy::kWriteBack: return "write_back";
  }
  return "?";
}

WritePolicy parse_write_policy(std::string_view name) {
  for (WritePolicy p : {WritePolicy::kWriteThrough, WritePolicy::kWriteThroughSelective,
                        WritePolicy::kWriteBack}) {
    if (write_policy_name(p) == name) return p;
  }
  throw_error(ErrorCode::kInvalidArgument,
              "unknown hicache write policy '{}' (have: write_through, write_through_selective, "
              "write_back)",
              name);
}

std::string_view prefetch_policy_name(PrefetchPolicy p) {
  switch (p) {
    case PrefetchPolicy::kBestEffort: return "best_effort";
    case PrefetchPolicy::kWaitComplete: return "wait_complete";
    case PrefetchPolicy::kTimeout: return "timeout";
  }
  return "?";
}

PrefetchPolicy parse_prefetch_policy(std::string_view name) {
  for (PrefetchPolicy p :
       {PrefetchPolicy::kBestEffort, PrefetchPolicy::kWaitComplete, PrefetchPolicy::kTimeout}) {
    if (prefetch_policy_name(p) == name) return p;
  }
  throw_error(ErrorCode::kInvalidArgument,
              "unknown hicache prefetch policy '{}' (have: best_effort, wait_complete, timeout)",
              name);
}

std::chrono::steady_clock::duration HiCacheConfig::prefetch_timeout(int64_t tokens) const {
  const double s = prefetch_timeout_base_s +
                   prefetch_timeout_per_1k_tokens_s * static_cast<double>(tokens) / 1000.0;
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}

void HiCacheConfig::validate() const {
  PAGODA_REQUIRE(host.ratio == 0 || host.bytes == 0, kInvalidArgument,
                 "give either hicache_ratio or hicache_size, not both");
  PAGODA_REQUIRE(host.ratio == 0 || (std::isfinite(host.ratio) && host.ratio > 0), kInvalidArgument,
                 "hicache_ratio must be a positive number (got {})", host.ratio);
  PAGODA_REQUIRE(host.bytes >= 0, kInvalidArgument, "hicache_size must be positive (got {})",
                 host.bytes);
  PAGODA_REQUIRE(selective_threshold >= 1, kInvalidArgument,
                 "hicache selective threshold must be >= 1 (got {})", selective_threshold);
  PAGODA_REQUIRE(std::isfinite(prefetch_timeout_base_s) && prefetch_timeout_base_s >= 0 &&
                     std::isfinite(prefetch_timeout_per_1k_tokens_s) &&
                     prefetch_timeout_per_1k_tokens_s >= 0 &&
                     prefetch_timeout_base_s + prefetch_timeout_per_1k_tokens_s * 1e6 < 1e9,
                 kInvalidArgument,
                 "hicache prefetch timeouts must be finite and >= 0 (got {} s + {} s per 1,000 "
                 "tokens)",
                 prefetch_timeout_base_s, prefetch_timeout_per_1k_tokens_s);
  PAGODA_REQUIRE(storage.empty() || enabled(), kInvalidArgument,
                 "hicache storage needs a host tier (hicache_ratio or hicache_size)");
  if (!storage.empty()) check_storage_spec(storage);
}

}  // namespace pagoda::tier
