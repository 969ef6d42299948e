#pragma once
// A scheduler-like operation stream over PageAllocator + ReqToTokenTable + a PrefixCache, checked
// after every step against a small, obviously correct model. Shared by the property test
// (random choices from a seeded engine) and the libFuzzer target (choices from fuzz bytes).
//
// The model keeps, independently of the code under test:
//   * per request: its token ids, the slots its row must hold, cache_protected_len, seq_len;
//   * the tree's contents as a map (namespace, token prefix ending at a page boundary) -> page;
//   * content_[slot]: an identity of the KV "computed" into the slot (hash of the token prefix).
// Checks: match results equal the model's; every slot a request reads holds the KV computed for
// that token prefix; allocator refcount(page) == request references + tree references (so
// free + referenced == total and no page is owned twice); locked pages are never evicted;
// evictable / protected / total sizes; check_integrity() of every component.

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "pagoda/cache/prefix_cache.h"
#include "pagoda/kv/page_allocator.h"
#include "pagoda/kv/req_to_token.h"

namespace pagoda::testing {

/// Where the workload's choices come from.
class ChoiceSource {
 public:
  virtual ~ChoiceSource() = default;
  /// A value in [0, bound) (bound >= 1).
  virtual uint32_t next(uint32_t bound) = 0;
  /// True when no more operations should run (fuzz input consumed).
  virtual bool exhausted() const = 0;
};

class RandomChoices final : public ChoiceSource {
 public:
  explicit RandomChoices(uint64_t seed) : rng_(seed) {}
  uint32_t next(uint32_t bound) override {
    return static_cast<uint32_t>(rng_() % (bound == 0 ? 1 : bound));
  }
  bool exhausted() const override { return false; }

 private:
  std::mt19937_64 rng_;
};

class ByteChoices final : public ChoiceSource {
 public:
  ByteChoices(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint32_t next(uint32_t bound) override {
    uint32_t v = 0;
    for (int i = 0; i < 2 && pos_ < size_; ++i) v = (v << 8) | data_[pos_++];
    return bound == 0 ? 0 : v % bound;
  }
  bool exhausted() const override { return pos_ >= size_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

/// Thrown when the code under test and the model disagree.
class WorkloadMismatch : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct WorkloadConfig {
  int32_t page_size = 4;
  int32_t num_pages = 64;
  int32_t max_reqs = 8;
  int32_t max_context_len = 512;
  std::string policy = "lru";
  bool chunk_cache = false;  ///< ChunkCache instead of RadixCache
};

class CacheWorkload {
 public:
  explicit CacheWorkload(const WorkloadConfig& config);
  ~CacheWorkload();

  /// One operation (admit, chunk, decode, finish, evict, scratch, bad input), then all checks.
  void step(ChoiceSource& src);
  /// Finishes every request, evicts everything and checks that the pool is whole again.
  void drain();
  int64_t steps() const { return steps_; }
  const cache::CacheStats& stats() const;

 private:
  struct Req;
  void admit(ChoiceSource& src);
  void continue_prefill(Req& r, ChoiceSource& src);
  void decode(ChoiceSource& src);
  void finish(Req& r, cache::FinishPolicy policy);
  void finish_some(ChoiceSource& src);
  void scratch(ChoiceSource& src);
  void bad_input(ChoiceSource& src);
  bool extend(Req& r, int32_t new_len);
  void model_insert(Req& r, int64_t key_len);
  std::vector<SlotIndex> expected_match(const Req& r, int64_t cap) const;
  void on_event(cache::CacheEvent event, std::span<const SlotIndex> slots);
  void check_all();
  std::vector<int32_t> make_prompt(ChoiceSource& src);
  [[noreturn]] void fail(const std::string& what) const;

  WorkloadConfig config_;
  int32_t P_;
  std::unique_ptr<kv::PageAllocator> alloc_;
  std::unique_ptr<kv::ReqToTokenTable> table_;
  std::unique_ptr<cache::PrefixCache> cache_;
  std::vector<std::unique_ptr<Req>> reqs_;
  std::unordered_map<uint64_t, int32_t> tree_;  ///< prefix tag -> page (model of the tree)
  std::vector<uint64_t> page_tag_;              ///< page -> prefix tag while in the tree
  std::vector<uint64_t> content_;               ///< slot -> tag of the KV computed into it
  std::vector<std::vector<int32_t>> history_;   ///< finished conversations, for follow-ups
  std::vector<int32_t> stored_pages_;           ///< pages reported by kStored in the last call
  int64_t steps_ = 0;
};

}  // namespace pagoda::testing
