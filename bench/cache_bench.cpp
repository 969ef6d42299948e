// bench_cache: radix cache and page allocator costs on serving-sized state.
//   Tree: 10,000 cached 2,048-token prompts = 16 shared 1,024-token system prompts + a unique
//   1,024-token tail each (page sizes 1 and 16), LRU policy.
//   Allocator: alloc_extend / alloc_decode for a batch of 256 requests (restored in O(1) after
//   each iteration, so the state is identical every time).
// Results: bench/results/cache_cpu.md.
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <random>
#include <vector>

#include "pagoda/cache/radix_cache.h"

namespace {

using namespace pagoda;

constexpr int32_t kSequences = 10000;
constexpr int32_t kSystemPrompts = 16;
constexpr int32_t kSystemLen = 1024;
constexpr int32_t kTailLen = 1024;
constexpr int32_t kPromptLen = kSystemLen + kTailLen;

std::vector<int32_t> make_sequence(int64_t id) {
  std::vector<int32_t> t(kPromptLen);
  const auto sys = static_cast<int32_t>(id % kSystemPrompts);
  for (int32_t i = 0; i < kSystemLen; ++i) t[i] = sys * kSystemLen + i;
  std::mt19937 rng(static_cast<uint32_t>(id));
  for (int32_t i = kSystemLen; i < kPromptLen; ++i) t[i] = static_cast<int32_t>(rng() % 32000);
  return t;
}

/// A pool sized for the cached tree plus `headroom_seqs` more tails, and the tree itself.
struct TreeFixture {
  explicit TreeFixture(int32_t page_size)
      : alloc((kSystemPrompts * kSystemLen + (kSequences + 8) * kTailLen) / page_size, page_size),
        table(1, kPromptLen),
        cache(alloc, table) {
    for (int64_t i = 0; i < kSequences; ++i) insert_new(i);
    next_id = kSequences;
  }
  /// Inserts sequence `id` the way a finished request would: reuse the cached prefix, allocate
  /// the rest, insert, drop the request's references. Evicts when the pool is full.
  void insert_new(int64_t id) {
    const auto tokens = make_sequence(id);
    auto m = cache.match_prefix({tokens, ""});
    const auto pre = static_cast<int32_t>(m.slots.size());
    const std::vector<int32_t> pre_v{pre}, seq_v{kPromptLen};
    const std::vector<SlotIndex> last_v{pre == 0 ? -1 : m.slots.back()};
    auto out = alloc.alloc_extend(pre_v, seq_v, last_v);
    if (!out) {
      cache.evict(kPromptLen);
      out = alloc.alloc_extend(pre_v, seq_v, last_v);
    }
    m.slots.insert(m.slots.end(), out->begin(), out->end());
    cache.insert({tokens, ""}, m.slots);
    alloc.free(*out);
  }
  kv::PageAllocator alloc;
  kv::ReqToTokenTable table;
  cache::RadixCache cache;
  int64_t next_id = 0;
};

TreeFixture& fixture(int32_t page_size) {
  static std::map<int32_t, std::unique_ptr<TreeFixture>> fixtures;
  auto& f = fixtures[page_size];
  if (!f) f = std::make_unique<TreeFixture>(page_size);
  return *f;
}

void BM_MatchPrefix(benchmark::State& state) {
  auto& f = fixture(static_cast<int32_t>(state.range(0)));
  std::vector<std::vector<int32_t>> queries;
  for (int i = 0; i < 256; ++i) queries.push_back(make_sequence(f.next_id - 1 - i * 37));
  size_t q = 0;
  int64_t tokens = 0;
  for (auto _ : state) {
    auto m = f.cache.match_prefix({queries[q++ % queries.size()], ""},
                                  cache::scheduler_prefix_limit(kPromptLen));
    tokens += static_cast<int64_t>(m.slots.size());
    benchmark::DoNotOptimize(m);
  }
  state.SetItemsProcessed(tokens);
  state.counters["nodes"] = static_cast<double>(f.cache.num_nodes());
  state.counters["matched/query"] = static_cast<double>(tokens) / static_cast<double>(state.iterations());
}

void BM_InsertNewSequence(benchmark::State& state) {
  // One new 2k prompt (1k shared, 1k new) per iteration; allocation and eviction excluded.
  auto& f = fixture(static_cast<int32_t>(state.range(0)));
  for (auto _ : state) {
    state.PauseTiming();
    const auto tokens = make_sequence(f.next_id++);
    auto m = f.cache.match_prefix({tokens, ""});
    const auto pre = static_cast<int32_t>(m.slots.size());
    if (f.alloc.available_size() < kPromptLen) f.cache.evict(kPromptLen);
    auto out = *f.alloc.alloc_extend(std::vector<int32_t>{pre}, std::vector<int32_t>{kPromptLen},
                                     std::vector<SlotIndex>{m.slots.back()});
    m.slots.insert(m.slots.end(), out.begin(), out.end());
    state.ResumeTiming();
    benchmark::DoNotOptimize(f.cache.insert({tokens, ""}, m.slots));
    state.PauseTiming();
    f.alloc.free(out);
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * kPromptLen);
}

void BM_EvictOneSequence(benchmark::State& state) {
  // Evicts one 1k-token leaf (the LRU one) per iteration; re-inserting excluded.
  auto& f = fixture(static_cast<int32_t>(state.range(0)));
  for (auto _ : state) {
    benchmark::DoNotOptimize(f.cache.evict(kTailLen));
    state.PauseTiming();
    f.insert_new(f.next_id++);
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * kTailLen);
}

struct BatchFixture {
  explicit BatchFixture(int32_t page_size) : alloc(256 * 4096 / page_size, page_size) {
    std::mt19937 rng(7);
    for (int b = 0; b < 256; ++b) {
      const auto pre = static_cast<int32_t>(rng() % 2048);
      prefix.push_back(pre);
      extend.push_back(pre + 1 + static_cast<int32_t>(rng() % 512));
      decode.push_back(pre + 1);
      SlotIndex last = -1;
      if (pre > 0) {
        auto s = *alloc.alloc_extend(std::vector<int32_t>{0}, std::vector<int32_t>{pre},
                                     std::vector<SlotIndex>{-1});
        last = s.back();
      }
      last_loc.push_back(last);
    }
    for (size_t b = 0; b < prefix.size(); ++b) total += extend[b] - prefix[b];
    out.resize(static_cast<size_t>(total));
  }
  kv::PageAllocator alloc;
  std::vector<int32_t> prefix, extend, decode;
  std::vector<SlotIndex> last_loc, out;
  int64_t total = 0;
};

void BM_AllocExtendBatch256(benchmark::State& state) {
  BatchFixture f(static_cast<int32_t>(state.range(0)));
  for (auto _ : state) {
    const auto saved = f.alloc.backup_state();
    benchmark::DoNotOptimize(f.alloc.alloc_extend(f.prefix, f.extend, f.last_loc, f.out));
    f.alloc.restore_state(saved);
  }
  state.SetItemsProcessed(state.iterations() * f.total);
  state.counters["tokens/batch"] = static_cast<double>(f.total);
}

void BM_AllocDecodeBatch256(benchmark::State& state) {
  BatchFixture f(static_cast<int32_t>(state.range(0)));
  std::vector<SlotIndex> out(256);
  for (auto _ : state) {
    const auto saved = f.alloc.backup_state();
    benchmark::DoNotOptimize(f.alloc.alloc_decode(f.decode, f.last_loc, out));
    f.alloc.restore_state(saved);
  }
  state.SetItemsProcessed(state.iterations() * 256);
}

BENCHMARK(BM_MatchPrefix)->Arg(1)->Arg(16)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_InsertNewSequence)->Arg(1)->Arg(16)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EvictOneSequence)->Arg(1)->Arg(16)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AllocExtendBatch256)->Arg(1)->Arg(16)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AllocDecodeBatch256)->Arg(1)->Arg(16)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
