set -e
cp /work/main/bench/cache_bench.cpp /tmp/before/bench/cache_bench.cpp
cd /tmp/before && python3 - <<'PY'
p='bench/cache_bench.cpp'
s=open(p).read()
a=s.index('/// The harness\'s fake allocator')
b=s.index('double now_s()')
s=s[:a]+'''struct CountingPages : kv::PageAllocator {
  CountingPages(int32_t n, int32_t p) : kv::PageAllocator(n, p) {}
};
int64_t w_match(cache::RadixCache& c, std::span<const int32_t> q, std::vector<SlotIndex>& out) {
  auto m = c.match_prefix({q, ""});
  out = std::move(m.slots);
  return static_cast<int64_t>(out.size());
}
int64_t w_insert(cache::RadixCache& c, std::span<const int32_t> t, std::span<const SlotIndex> s) {
  return c.insert({t, ""}, s);
}
void w_after_insert(kv::PageAllocator& a, std::span<const SlotIndex> s) { a.free(s); }
std::unique_ptr<cache::RadixCache> w_make_cache(kv::PageAllocator&, kv::PageAllocator* a) {
  static kv::ReqToTokenTable table(1, 8);
  return std::make_unique<cache::RadixCache>(*a, table);
}

'''+s[b:]
s=s.replace('kv::PageRefs* pages;','kv::PageAllocator* pages;')
a=s.index('BENCHMARK_TEMPLATE(BM_WorkloadW, false)')
b=s.index('BENCHMARK(BM_MatchPrefix)')
s=s[:a]+s[b:]
# old benches use the old API unchanged
open(p,'w').write(s)
PY
nice cmake --build build -j1 --target bench_cache 2>&1 | grep -E "error" -A3 | head
