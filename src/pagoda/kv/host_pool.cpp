#include "pagoda/kv/host_pool.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "pagoda/core/dtype.h"
#include "pagoda/core/error.h"

namespace pagoda::kv {
namespace {

KvPoolConfig with_pages(KvPoolConfig c, int32_t pages) {
  PAGODA_REQUIRE(pages >= 1, kInvalidArgument, "a host pool needs at least one page (got {})",
                 pages);
  c.num_pages = pages;
  return c;
}

}  // namespace

int32_t host_pool_pages(const KvPoolConfig& device, const HostPoolSize& size) {
  const bool by_ratio = size.ratio != 0, by_bytes = size.bytes != 0;
  PAGODA_REQUIRE(by_ratio != by_bytes, kInvalidArgument,
                 "host pool size: give exactly one of a ratio (hicache_ratio) or bytes "
                 "(hicache_size)");
  double pages = 0;
  if (by_ratio) {
    PAGODA_REQUIRE(std::isfinite(size.ratio) && size.ratio > 0, kInvalidArgument,
                   "hicache_ratio must be a positive number (got {})", size.ratio);
    pages = std::floor(size.ratio * device.num_pages);
  } else {
    PAGODA_REQUIRE(size.bytes > 0, kInvalidArgument, "hicache_size must be positive (got {} bytes)",
                   size.bytes);
    const int64_t per_page = kv_bytes_per_token(device) * device.page_size;
    PAGODA_REQUIRE(per_page > 0, kInvalidArgument, "host pool: the device pool has empty pages");
    pages = static_cast<double>(size.bytes / per_page);
  }
  PAGODA_REQUIRE(pages >= 1, kInvalidArgument, "host pool of {} pages: it must hold at least one page",
                 pages);
  const double limit = static_cast<double>(std::numeric_limits<int32_t>::max() / device.page_size - 1);
  PAGODA_REQUIRE(pages <= limit, kInvalidArgument,
                 "host pool of {} pages at page size {} exceeds the int32 slot range", pages,
                 device.page_size);
  return static_cast<int32_t>(pages);
}

int64_t bytes_per_page(const KvPool& pool) { return pool.bytes_per_token() * pool.page_size(); }

std::vector<PageCopy> page_copy_runs(std::span<const int32_t> src, std::span<const int32_t> dst) {
  PAGODA_REQUIRE(src.size() == dst.size(), kInvalidArgument,
                 "page_copy_runs: {} source pages but {} destination pages", src.size(), dst.size());
  std::vector<PageCopy> runs;
  for (size_t i = 0; i < src.size(); ++i) {
    if (!runs.empty()) {
      PageCopy& r = runs.back();
      if (src[i] == r.src + r.count && dst[i] == r.dst + r.count) {
        ++r.count;
        continue;
      }
    }
    runs.push_back(PageCopy{src[i], dst[i], 1});
  }
  return runs;
}

void copy_layer_pages(const KvPool& src, KvPool& dst, LayerId layer, std::span<const PageCopy> runs,
                      const CopyFn& copy) {
  const KvPoolConfig& a = src.config();
  const KvPoolConfig& b = dst.config();
  PAGODA_REQUIRE(
      a.layout == b.layout && a.num_layers == b.num_layers && a.page_size == b.page_size &&
          a.dtype == b.dtype && src.k_row_elems() == dst.k_row_elems() &&
          src.v_row_elems() == dst.v_row_elems() && src.index_row_bytes() == dst.index_row_bytes(),
      kInvalidArgument, "copy_layer_pages: the two pools differ in geometry");
  for (const PageCopy& r : runs) {
    PAGODA_REQUIRE(r.count >= 1 && r.src >= 0 && r.dst >= 0 &&
                       int64_t{r.src} + r.count <= int64_t{a.num_pages} + 1 &&
                       int64_t{r.dst} + r.count <= int64_t{b.num_pages} + 1,
                   kOutOfRange, "copy_layer_pages: run {}+{} -> {}+{} outside the pools ({}, {} pages)",
                   r.src, r.count, r.dst, r.count, a.num_pages, b.num_pages);
  }
  const auto elem = static_cast<int64_t>(dtype_size(a.dtype));
  auto copy_buffer = [&](const void* from, void* to, int64_t row_bytes) {
    const int64_t page = row_bytes * a.page_size;
    for (const PageCopy& r : runs) {
      copy(static_cast<char*>(to) + r.dst * page, static_cast<const char*>(from) + r.src * page,
           static_cast<size_t>(r.count * page));
    }
  };
  copy_buffer(src.k_view(layer).data(), dst.k_view(layer).data(), src.k_row_elems() * elem);
  if (a.layout == KvLayout::kMha) {
    copy_buffer(src.v_view(layer).data(), dst.v_view(layer).data(), src.v_row_elems() * elem);
  }
  if (src.index_row_bytes() > 0) {  // DSA index keys: the same slots, their own buffer
    copy_buffer(src.index_data(layer), dst.index_data(layer), src.index_row_bytes());
  }
}

namespace {

/// Calls f(page_block, bytes) for page `page`'s K (and V, and DSA index-key) block of every
/// layer, in order.
template <typename F>
void for_each_page_block(const KvPool& pool, int32_t page, size_t size, F&& f) {
  PAGODA_REQUIRE(pool.device().is_cpu(), kUnsupported, "page (de)serialisation needs a host pool");
  PAGODA_REQUIRE(page >= 0 && page <= pool.config().num_pages, kOutOfRange,
                 "page {} outside [0, {}]", page, pool.config().num_pages);
  PAGODA_REQUIRE(static_cast<int64_t>(size) == bytes_per_page(pool), kInvalidArgument,
                 "a page is {} bytes, not {}", bytes_per_page(pool), size);
  const auto elem = static_cast<int64_t>(dtype_size(pool.config().dtype));
  const int64_t p = pool.page_size();
  for (int32_t l = 0; l < pool.num_layers(); ++l) {
    const int64_t k = p * pool.k_row_elems() * elem;
    f(static_cast<char*>(pool.k_view(LayerId{l}).data()) + page * k, k);
    if (pool.config().layout == KvLayout::kMha) {
      const int64_t v = p * pool.v_row_elems() * elem;
      f(static_cast<char*>(pool.v_view(LayerId{l}).data()) + page * v, v);
    }
    if (pool.index_row_bytes() > 0) {
      const int64_t x = p * pool.index_row_bytes();
      f(static_cast<char*>(pool.index_data(LayerId{l})) + page * x, x);
    }
  }
}

}  // namespace

void read_page(const KvPool& pool, int32_t page, std::span<std::byte> out) {
  size_t at = 0;
  for_each_page_block(pool, page, out.size(), [&](const char* block, int64_t n) {
    std::memcpy(out.data() + at, block, static_cast<size_t>(n));
    at += static_cast<size_t>(n);
  });
}

void write_page(KvPool& pool, int32_t page, std::span<const std::byte> in) {
  size_t at = 0;
  for_each_page_block(pool, page, in.size(), [&](char* block, int64_t n) {
    std::memcpy(block, in.data() + at, static_cast<size_t>(n));
    at += static_cast<size_t>(n);
  });
}

HostKvPool::HostKvPool(const KvPoolConfig& device, const HostPoolSize& size,
                       platform::Allocator& pinned)
    : HostKvPool(device, host_pool_pages(device, size), pinned) {}

HostKvPool::HostKvPool(const KvPoolConfig& device, int32_t pages, platform::Allocator& pinned)
    : pool_(with_pages(device, pages), pinned), pages_(pool_.config().num_pages, device.page_size) {}

}  // namespace pagoda::kv
