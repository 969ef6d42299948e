#include "pagoda/cache/eviction_policy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pagoda/core/error.h"

namespace pagoda::cache {

namespace {

int64_t as_i64(uint64_t v) { return static_cast<int64_t>(v); }

class LruPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "lru"; }
  EvictionKey key(const NodeStats& s) const override { return {as_i64(s.last_access), 0}; }
};

class LfuPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "lfu"; }
  EvictionKey key(const NodeStats& s) const override {
    return {as_i64(s.hit_count), as_i64(s.last_access)};
  }
};

class FifoPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "fifo"; }
  EvictionKey key(const NodeStats& s) const override { return {as_i64(s.creation), 0}; }
};

class PriorityPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "priority"; }
  EvictionKey key(const NodeStats& s) const override { return {s.priority, as_i64(s.last_access)}; }
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_lru_policy() { return std::make_unique<LruPolicy>(); }
std::unique_ptr<EvictionPolicy> make_lfu_policy() { return std::make_unique<LfuPolicy>(); }
std::unique_ptr<EvictionPolicy> make_fifo_policy() { return std::make_unique<FifoPolicy>(); }
std::unique_ptr<EvictionPolicy> make_priority_policy() { return std::make_unique<PriorityPolicy>(); }

std::vector<std::string_view> eviction_policy_names() { return {"lru", "lfu", "fifo", "priority"}; }

std::unique_ptr<EvictionPolicy> make_eviction_policy(std::string_view name) {
  if (name == "lru") return make_lru_policy();
  if (name == "lfu") return make_lfu_policy();
  if (name == "fifo") return make_fifo_policy();
  if (name == "priority") return make_priority_policy();
  throw_error(ErrorCode::kInvalidArgument, "unknown eviction policy '{}'; choose one of {}", name,
              fmt::join(eviction_policy_names(), ", "));
}

}  // namespace pagoda::cache
