// Property test: 1M random operations per run on a RadixCache without a request table over a real
// PageAllocator, across page sizes 1/4/16/64 and every eviction policy (16 streams of 62,500).
// Inserts use both ownership rules (kTransfer with fresh slots for the whole key, SGLang's flow;
// kRetain after a match, the caller freeing its own slots); matches go into one reused buffer.
// Checked after every operation:
//   * every matched slot holds the KV computed for that token prefix (content tags), the match is
//     page aligned and within its cap;
//   * page accounting: between operations the caller holds nothing, so the allocator's referenced
//     pages are exactly the tree's pages (referenced * P == total_size) and evictable + protected
//     == total;
//   * policy order: a single-leaf eviction removes exactly the first leaf of evictable_leaves()
//     (computed by a tree walk, independently of the eviction heap), and only it;
// and check_integrity() of both every 64 operations. PAGODA_TEST_SEED=<n> replays a run.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include <fmt/format.h>

#include "cache_workload.h"

#include "pagoda/cache/radix_cache.h"
#include "pagoda/core/error.h"
#include "test_seed.h"

namespace pagoda::testing {
namespace {

struct PolicyCase {
  int32_t page_size;
  const char* policy;
};

constexpr int64_t kOpsPerCase = 62500;  // x 16 cases = 1,000,000 operations
constexpr int32_t kPages = 96;
constexpr int32_t kMaxPagesPerSeq = 8;
constexpr size_t kMaxLocks = 4;

class Stream {
 public:
  Stream(const PolicyCase& c, uint64_t seed)
      : P_(c.page_size),
        rng_(seed),
        alloc_(kPages, c.page_size),
        cache_(alloc_, cache::make_eviction_policy(c.policy)),
        content_(static_cast<size_t>(alloc_.num_slots_total()), 0) {
    for (auto& f : families_) {
      f.resize(static_cast<size_t>(kMaxPagesPerSeq * P_));
      for (auto& t : f) t = static_cast<int32_t>(rng_() % 1000);
    }
  }

  void run(int64_t ops) {
    for (op_ = 0; op_ < ops; ++op_) {
      const uint32_t r = pick(100);
      if (r < 40) {
        insert();
      } else if (r < 70) {
        match();
      } else if (r < 80) {
        unlock();
      } else if (r < 92) {
        evict_one();
      } else {
        evict_bulk();
      }
      check_accounting();
      if (op_ % 64 == 0) check_integrity();
    }
    while (!locks_.empty()) unlock();
    cache_.evict_all();
    expect(cache_.total_size() == 0 && alloc_.num_free_pages() == alloc_.num_pages(),
           "pool not whole after draining");
    check_integrity();
  }
  int64_t evicted() const { return cache_.stats().evicted_tokens; }
  int64_t matched() const { return cache_.stats().matched_tokens; }

 private:
  uint32_t pick(uint32_t bound) { return static_cast<uint32_t>(rng_() % bound); }
  void expect(bool ok, const std::string& what) const {
    if (!ok) throw std::runtime_error(fmt::format("op {}: {}", op_, what));
  }

  /// A key sharing a random prefix with one of a few families, then a random tail; tags_[i] is
  /// the identity of tokens[0..i].
  void make_key() {
    const auto& f = families_[pick(static_cast<uint32_t>(std::size(families_)))];
    const int32_t len = 1 + static_cast<int32_t>(pick(static_cast<uint32_t>(kMaxPagesPerSeq * P_)));
    const int32_t shared = static_cast<int32_t>(pick(static_cast<uint32_t>(len + 1)));
    tokens_.assign(f.begin(), f.begin() + shared);
    while (static_cast<int32_t>(tokens_.size()) < len) {
      tokens_.push_back(static_cast<int32_t>(pick(4)));
    }
    tags_.clear();
    uint64_t h = 0xC0FFEE;
    for (int32_t t : tokens_) {
      h = (h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x9E3779B97F4A7C15ull)) *
          0xBF58476D1CE4E5B9ull;
      tags_.push_back((h ^ (h >> 31)) | 1);
    }
  }

  /// n tokens of whole pages (n a multiple of P), evicting when short; false when even that fails.
  bool take(int64_t n, std::vector<SlotIndex>& out) {
    auto s = alloc_.alloc(n);
    if (!s) {
      cache_.evict(n - alloc_.available_size());
      s = alloc_.alloc(n);
    }
    if (!s) return false;
    out = std::move(*s);
    return true;
  }

  void insert() {
    make_key();
    const auto len = static_cast<int64_t>(tokens_.size());
    const int64_t key_len = len / P_ * P_;
    const int64_t padded = (len + P_ - 1) / P_ * P_;
    const cache::InsertOptions base{.priority = static_cast<int32_t>(pick(3))};
    if (pick(2) == 0) {
      // SGLang's flow: fresh slots for the whole sequence, ownership handed to the tree.
      std::vector<SlotIndex> fresh;
      if (!take(padded, fresh)) return;
      for (int64_t i = 0; i < len; ++i) content_[size_t(fresh[size_t(i)])] = tags_[size_t(i)];
      auto o = base;
      o.ownership = cache::SlotOwnership::kTransfer;
      const cache::InsertResult r = cache_.insert({tokens_, ""}, fresh, o);
      expect(r.total_len == key_len && r.prefix_len <= key_len && r.prefix_len % P_ == 0,
             "insert result lengths");
      alloc_.free(std::span<const SlotIndex>(fresh).subspan(size_t(key_len)));  // beyond L
    } else {
      // Match first, compute only the rest, insert keeping ownership, free all own slots.
      const int64_t pre = cache_.match_prefix({tokens_, ""}, cache::kNoPrefixLimit, buf_).length;
      std::vector<SlotIndex> fresh;
      if (padded > pre) {
        if (!take(padded - pre, fresh)) return;
        // take() may have evicted the matched prefix: match again and recompute if so.
        if (cache_.match_prefix({tokens_, ""}, pre, buf_).length != pre) {
          alloc_.free(fresh);
          return;
        }
      }
      for (size_t i = 0; i < fresh.size() && int64_t(i) + pre < len; ++i) {
        content_[size_t(fresh[i])] = tags_[size_t(pre) + i];
      }
      std::vector<SlotIndex> slots = buf_;
      slots.insert(slots.end(), fresh.begin(), fresh.end());
      const cache::InsertResult r = cache_.insert({tokens_, ""}, slots, base);
      expect(r.prefix_len >= pre, "insert after match found less than the match");
      alloc_.free(fresh);
    }
  }

  void match() {
    make_key();
    const auto len = static_cast<int64_t>(tokens_.size());
    const int64_t cap = pick(2) == 0 ? cache::kNoPrefixLimit : len - 1;
    const cache::PrefixMatch m = cache_.match_prefix({tokens_, ""}, cap, buf_);
    expect(m.length == static_cast<int64_t>(buf_.size()) && m.length % P_ == 0 &&
               m.length <= std::min(cap, len),
           "match length");
    for (size_t i = 0; i < buf_.size(); ++i) {
      expect(content_[size_t(buf_[i])] == tags_[i],
             fmt::format("matched slot {} at {} holds other KV", buf_[i], i));
    }
    if (m.length > 0 && pick(3) == 0) {
      cache_.inc_lock_ref(m.last_node);
      locks_.push_back(m.last_node);
      if (locks_.size() > kMaxLocks) unlock();
    }
  }

  void unlock() {
    if (locks_.empty()) return;
    const size_t i = pick(static_cast<uint32_t>(locks_.size()));
    cache_.dec_lock_ref(locks_[i]);
    locks_.erase(locks_.begin() + static_cast<int64_t>(i));
  }

  void evict_one() {
    const auto leaves = cache_.evictable_leaves();
    const int64_t nodes = cache_.num_nodes();
    const int64_t got = cache_.evict(1);
    if (leaves.empty()) {
      expect(got == 0, "evicted with no evictable leaf");
      return;
    }
    expect(got == leaves[0].length, fmt::format("evicted {} tokens, the first leaf has {}", got,
                                                leaves[0].length));
    expect(cache_.num_nodes() == nodes - 1, "evict(1) removed more than one node");
    bool gone = false;
    try {
      cache_.lock_ref(leaves[0].node);
    } catch (const Error&) {
      gone = true;
    }
    expect(gone, fmt::format("policy order: the first leaf (key {},{}) was not the one evicted",
                             leaves[0].key.first, leaves[0].key.second));
    for (size_t i = 1; i < leaves.size(); ++i) cache_.lock_ref(leaves[i].node);  // still live
  }

  void evict_bulk() {
    const int64_t before = cache_.evictable_size();
    const int64_t want = pick(static_cast<uint32_t>(4 * P_ + 1));
    const int64_t got = cache_.evict(want);
    expect(got >= std::min(want, before) && got <= before, "bulk evict amount");
    expect(cache_.evictable_size() == before - got, "evictable size after evict");
  }

  void check_accounting() const {
    expect(int64_t{alloc_.num_referenced_pages()} * P_ == cache_.total_size(),
           fmt::format("{} referenced pages for {} tree tokens", alloc_.num_referenced_pages(),
                       cache_.total_size()));
    expect(cache_.evictable_size() + cache_.protected_size() == cache_.total_size(),
           "evictable + protected != total");
    expect(alloc_.num_free_pages() + alloc_.num_referenced_pages() == alloc_.num_pages(),
           "free + referenced != pages");
  }

  void check_integrity() const {
    alloc_.check_integrity();
    cache_.check_integrity();
  }

  int32_t P_;
  std::mt19937_64 rng_;
  kv::PageAllocator alloc_;
  cache::RadixCache cache_;
  std::vector<uint64_t> content_;
  std::vector<int32_t> families_[6];
  std::vector<int32_t> tokens_;
  std::vector<uint64_t> tags_;
  std::vector<SlotIndex> buf_;
  std::vector<cache::NodeHandle> locks_;
  int64_t op_ = 0;
};

class RadixPolicyProperty : public ::testing::TestWithParam<PolicyCase> {};

TEST_P(RadixPolicyProperty, MillionOperationsKeepPolicyOrderAndAccounting) {
  const PolicyCase c = GetParam();
  const pagoda::testing::TestSeed seed(pagoda::testing::process_seed());  // one for every case
  std::printf("page_size %d, policy %s, %lld ops\n", c.page_size, c.policy,
              static_cast<long long>(kOpsPerCase));
  Stream stream(c, seed ^ (static_cast<uint64_t>(c.page_size) << 40) ^
                       std::hash<std::string>()(c.policy));
  try {
    stream.run(kOpsPerCase);
  } catch (const std::exception& e) {
    FAIL() << e.what();
  }
  EXPECT_GT(stream.evicted(), 0);
  EXPECT_GT(stream.matched(), 0);
}

std::vector<PolicyCase> all_cases() {
  std::vector<PolicyCase> cases;
  for (int32_t p : {1, 4, 16, 64}) {
    for (const char* policy : {"lru", "lfu", "fifo", "priority"}) cases.push_back(PolicyCase{p, policy});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Streams, RadixPolicyProperty, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) {
                           return fmt::format("P{}_{}", info.param.page_size, info.param.policy);
                         });

}  // namespace
}  // namespace pagoda::testing
