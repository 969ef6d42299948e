#pragma once
// Shared fixtures of the tier tests: small pools whose KV rows are a known function of the
// token prefix they hold (so a page loaded back can be checked against what was computed), and
// a platform whose copy stream runs copies only when the test lets it.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "pagoda/kv/kv_pool.h"
#include "pagoda/platform/platform.h"
#include "pagoda/tier/hicache.h"

namespace pagoda::tier::testing {

/// splitmix64 step: the value of row element `e` of `layer` for a prefix hashed `h`.
inline uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Prefix hashes: h[i] names tokens[0..i] (independent of the cache's SHA-256 page keys).
inline std::vector<uint64_t> prefix_hashes(std::span<const int32_t> tokens) {
  std::vector<uint64_t> h(tokens.size());
  uint64_t acc = 0x1234;
  for (size_t i = 0; i < tokens.size(); ++i) h[i] = acc = mix(acc ^ static_cast<uint64_t>(tokens[i] + 1));
  return h;
}

inline float kv_value(uint64_t prefix_hash, int32_t layer, int64_t elem, bool v) {
  const uint64_t x = mix(prefix_hash ^ mix(static_cast<uint64_t>(layer) * 131 + static_cast<uint64_t>(elem) * 2 + v));
  return static_cast<float>(x % 100000) / 1000.f;
}

/// Writes the "computed" K/V of tokens[begin, end) at `slots` (one per token) into an f32 pool.
inline void write_kv(kv::KvPool& pool, std::span<const int32_t> tokens, int64_t begin,
                     std::span<const SlotIndex> slots) {
  const auto h = prefix_hashes(tokens.first(static_cast<size_t>(begin) + slots.size()));
  for (int32_t l = 0; l < pool.num_layers(); ++l) {
    auto* k = static_cast<float*>(pool.k_view(LayerId{l}).data());
    auto* v = static_cast<float*>(pool.v_view(LayerId{l}).data());
    for (size_t i = 0; i < slots.size(); ++i) {
      const uint64_t hp = h[static_cast<size_t>(begin) + i];
      for (int64_t e = 0; e < pool.k_row_elems(); ++e)
        k[slots[i] * pool.k_row_elems() + e] = kv_value(hp, l, e, false);
      for (int64_t e = 0; e < pool.v_row_elems(); ++e)
        v[slots[i] * pool.v_row_elems() + e] = kv_value(hp, l, e, true);
    }
  }
}

/// Whether layer `layer` of `slots` holds the K/V computed for tokens[0, slots.size()).
inline bool kv_matches(const kv::KvPool& pool, std::span<const int32_t> tokens,
                       std::span<const SlotIndex> slots, int32_t layer) {
  const auto h = prefix_hashes(tokens.first(slots.size()));
  const auto* k = static_cast<const float*>(pool.k_view(LayerId{layer}).data());
  const auto* v = static_cast<const float*>(pool.v_view(LayerId{layer}).data());
  for (size_t i = 0; i < slots.size(); ++i) {
    for (int64_t e = 0; e < pool.k_row_elems(); ++e)
      if (k[slots[i] * pool.k_row_elems() + e] != kv_value(h[i], layer, e, false)) return false;
    for (int64_t e = 0; e < pool.v_row_elems(); ++e)
      if (v[slots[i] * pool.v_row_elems() + e] != kv_value(h[i], layer, e, true)) return false;
  }
  return true;
}

inline bool kv_matches_all(const kv::KvPool& pool, std::span<const int32_t> tokens,
                           std::span<const SlotIndex> slots) {
  for (int32_t l = 0; l < pool.num_layers(); ++l)
    if (!kv_matches(pool, tokens, slots, l)) return false;
  return true;
}

inline kv::KvPoolConfig small_pool(int32_t pages, int32_t page_size, int32_t layers = 3) {
  return kv::KvPoolConfig{.layout = kv::KvLayout::kMha, .num_layers = layers, .num_pages = pages,
                          .page_size = page_size, .dtype = DType::kF32, .num_kv_heads = 2,
                          .head_dim = 4, .head_dim_v = 4};
}

/// A copy stream that runs nothing until told: copies wait in a queue; an event completes when
/// the copies enqueued before it have run. run(n) runs the next n.
class ManualStream final : public platform::CopyStream {
 public:
  struct Shared {
    std::deque<std::tuple<void*, const void*, size_t>> queue;
    uint64_t enqueued = 0;
    uint64_t executed = 0;
    void run(uint64_t n) {
      while (n-- > 0 && !queue.empty()) {
        auto [d, s, b] = queue.front();
        queue.pop_front();
        std::memcpy(d, s, b);
        ++executed;
      }
    }
  };
  explicit ManualStream(std::shared_ptr<Shared> s) : s_(std::move(s)) {}
  void copy(void* dst, const void* src, size_t bytes) override {
    s_->queue.emplace_back(dst, src, bytes);
    ++s_->enqueued;
  }
  std::unique_ptr<platform::Event> record() override {
    return std::make_unique<Mark>(s_, s_->enqueued);
  }
  void synchronize() override { s_->run(s_->queue.size()); }
  void wait(platform::Event& e) override { e.synchronize(); }

 private:
  class Mark final : public platform::Event {
   public:
    Mark(std::shared_ptr<Shared> s, uint64_t target) : s_(std::move(s)), target_(target) {}
    void record() override { target_ = s_->enqueued; }
    void synchronize() override { s_->run(target_ - std::min(target_, s_->executed)); }
    bool done() override { return s_->executed >= target_; }

   private:
    std::shared_ptr<Shared> s_;
    uint64_t target_;
  };
  std::shared_ptr<Shared> s_;
};

/// The CPU platform with a ManualStream as its copy stream; wait_event records how many copies
/// had run before each wait and then runs exactly up to the event.
class ManualPlatform final : public platform::Platform {
 public:
  ManualPlatform() : cpu_(platform::make_cpu_platform()), shared_(std::make_shared<ManualStream::Shared>()) {}
  platform::PlatformKind kind() const override { return cpu_->kind(); }
  std::string name() const override { return "manual"; }
  Device device() const override { return cpu_->device(); }
  const platform::Capabilities& capabilities() const override { return cpu_->capabilities(); }
  platform::Allocator& allocator() override { return cpu_->allocator(); }
  std::string default_attention_backend() const override { return "cpu"; }
  std::unique_ptr<platform::CopyStream> make_copy_stream() override {
    return std::make_unique<ManualStream>(shared_);
  }
  void wait_event(platform::Event& e) override {
    ++waits;
    e.synchronize();
  }
  ManualStream::Shared& stream() { return *shared_; }
  int waits = 0;

 private:
  std::unique_ptr<platform::Platform> cpu_;
  std::shared_ptr<ManualStream::Shared> shared_;
};

/// A minimal scheduler around one HiCache: runs requests one at a time.
struct Harness {
  Harness(int32_t pages, int32_t page_size, HiCacheConfig config, StorageFactory storage = {})
      : alloc(pages, page_size),
        table(8, 4096),
        dev(small_pool(pages, page_size), platform->allocator()),
        cache(alloc, table, dev, *platform, config, std::move(storage)) {}

  /// Admits `tokens` (prefix checked after the forward's layer waits), computes the rest and
  /// finishes with an insert unless `keep`. Returns the admitted prefix length.
  int64_t run(const std::vector<int32_t>& tokens, cache::CacheRequest* keep = nullptr) {
    cache::CacheRequest local;
    cache::CacheRequest& req = keep ? *keep : local;
    req.tokens = tokens;
    return run_request(req, keep == nullptr);
  }

  /// run() for a request whose tokens are set (e.g. queued earlier with prefetch()).
  int64_t run_request(cache::CacheRequest& req, bool finish) {
    const std::vector<int32_t>& tokens = req.tokens;
    const int64_t len = static_cast<int64_t>(tokens.size());
    cache.admit(req, cache::scheduler_prefix_limit(len));
    const int64_t pre = req.cache_protected_len;
    req.req_slot = *table.alloc();
    table.write(req.req_slot, 0, req.prefix_slots);
    cache.begin_forward();
    for (int32_t l = 0; l < dev.num_layers(); ++l) {
      dev.wait_layer(LayerId{l});
      EXPECT_TRUE(testing::kv_matches(dev, tokens, req.prefix_slots, l)) << "layer " << l;
    }
    cache.end_forward();
    const int32_t p = pre, s = static_cast<int32_t>(len);
    const SlotIndex last = pre > 0 ? req.prefix_slots.back() : -1;
    auto slots = alloc.alloc_extend(std::span(&p, 1), std::span(&s, 1), std::span(&last, 1));
    if (!slots) {
      cache.evict(len);
      slots = alloc.alloc_extend(std::span(&p, 1), std::span(&s, 1), std::span(&last, 1));
    }
    EXPECT_TRUE(slots.has_value());
    testing::write_kv(dev, tokens, pre, *slots);
    table.write(req.req_slot, pre, *slots);
    if (finish) {
      cache.cache_finished_req(req, len);
      table.free(req.req_slot);
    }
    check();
    return pre;
  }
  void check() {
    cache.check_integrity();
    alloc.check_integrity();
  }

  std::unique_ptr<platform::Platform> platform = platform::make_cpu_platform();
  kv::PageAllocator alloc;
  kv::ReqToTokenTable table;
  kv::KvPool dev;
  HiCache cache;
};

}  // namespace pagoda::tier::testing
