#pragma once
/// EvictionPolicy: orders evictable leaves of the radix tree (sglang_spec §4.6). A policy maps a
/// node's statistics to a key; the leaf with the smallest key is evicted first, ties broken by
/// node creation order. Policies are stateless and pure; a custom policy is one subclass.

#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

namespace pagoda::cache {

/// What a policy may look at. Times are the cache's logical clock (one tick per operation).
struct NodeStats {
  uint64_t last_access = 0;
  uint64_t creation = 0;
  uint64_t hit_count = 0;  ///< insert traversals through the node (chunked self-inserts excluded)
  int32_t priority = 0;    ///< max priority of the requests that inserted through the node
};

/// Smallest evicted first.
using EvictionKey = std::pair<int64_t, int64_t>;

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  /// "lru", "lfu", "fifo", "priority", ...
  virtual std::string_view name() const = 0;
  virtual EvictionKey key(const NodeStats& stats) const = 0;
};

/// Least recently used: (last_access, 0). The default.
std::unique_ptr<EvictionPolicy> make_lru_policy();
/// Least frequently used: (hit_count, last_access).
std::unique_ptr<EvictionPolicy> make_lfu_policy();
/// First in, first out: (creation, 0).
std::unique_ptr<EvictionPolicy> make_fifo_policy();
/// Lowest priority first, then LRU: (priority, last_access).
std::unique_ptr<EvictionPolicy> make_priority_policy();
/// By name (one of eviction_policy_names()); throws kInvalidArgument listing the names.
std::unique_ptr<EvictionPolicy> make_eviction_policy(std::string_view name);
std::vector<std::string_view> eviction_policy_names();

}  // namespace pagoda::cache
