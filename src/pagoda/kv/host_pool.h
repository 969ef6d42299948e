#pragma once
/// HostKvPool: the hierarchical KV cache's host tier (HiCache L2): a KvPool in pinned host
/// memory with the device pool's geometry (layers, page size, dtype, rows) and its own
/// PageAllocator, so host pages have the device allocator's guarantees (reference counts,
/// all-or-nothing allocation, check_integrity). Contract: docs/design/kv.md "Host pool".
///
/// Layout: the device pool's, layer-major (per layer a K and a V buffer of
/// [host_pages + 1, page_size, heads, dim]; MLA: the latent buffer, and with DSA the index-key
/// buffer). One page of one layer is one contiguous block of
/// page_size rows on both sides, and a run of consecutive pages on both sides is one copy.
/// Chosen for the load-back, which goes layer by layer (layer i's attention waits only for
/// layer i's pages): a layer's pages are then one copy per page run instead of a strided gather
/// out of page-major blocks. Backups are batched per step, so their copy count matters less.
///
/// Not thread-safe: the scheduler thread owns the allocator; the memory is written by copy
/// streams (platform::CopyStream) under the tier controller's ordering.

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "pagoda/kv/kv_pool.h"
#include "pagoda/kv/page_allocator.h"
#include "pagoda/platform/platform.h"

namespace pagoda::kv {

/// Size of the host pool: a ratio of the device pool's pages, or bytes. Exactly one is set.
struct HostPoolSize {
  double ratio = 0;   ///< host pages = floor(ratio * device pages), ratio > 0
  int64_t bytes = 0;  ///< host pages = floor(bytes / bytes per page), bytes > 0
};

/// Usable host pages for a device pool of `device` geometry. Throws Error(kInvalidArgument)
/// naming the field when both or neither size is set, a size is not positive or finite, or
/// the result is below one page or above the int32 slot range.
int32_t host_pool_pages(const KvPoolConfig& device, const HostPoolSize& size);

/// Bytes one page occupies over all layers (K and V).
int64_t bytes_per_page(const KvPool& pool);

/// A run of page pairs: pages [src, src + count) of one pool go to [dst, dst + count) of another.
struct PageCopy {
  int32_t src = 0;
  int32_t dst = 0;
  int32_t count = 0;
};

/// Merges page pairs (src[i] -> dst[i]) into maximal runs consecutive on both sides, in order.
/// Throws kInvalidArgument when the sizes differ.
std::vector<PageCopy> page_copy_runs(std::span<const int32_t> src, std::span<const int32_t> dst);

/// Raw copy callback: (dst, src, bytes), e.g. a CopyStream's copy.
using CopyFn = std::function<void(void*, const void*, size_t)>;

/// Calls `copy` once per run and buffer (K, V for MHA, the DSA index keys when the pools have
/// them) of `layer`, copying the runs' pages from `src` to `dst`. The pools must have the same
/// geometry except num_pages (kInvalidArgument) and every page must be in range (kOutOfRange);
/// all of it is checked before the first call.
void copy_layer_pages(const KvPool& src, KvPool& dst, LayerId layer, std::span<const PageCopy> runs,
                      const CopyFn& copy);

/// Copies page `page` of every layer of a host pool into `out` (bytes_per_page(pool) bytes:
/// per layer its K rows, then its V rows for MHA, then its DSA index rows when the pool has
/// them) / back from `in`. kInvalidArgument for a wrong size, kOutOfRange for a bad page,
/// kUnsupported for a device pool; checked first.
void read_page(const KvPool& pool, int32_t page, std::span<std::byte> out);
void write_page(KvPool& pool, int32_t page, std::span<const std::byte> in);

class HostKvPool {
 public:
  /// A host pool for a device pool of `device` geometry, sized by `size` (host_pool_pages), in
  /// memory from `pinned` (Platform::pinned_allocator(); plain aligned memory on the CPU), which
  /// must outlive the pool.
  HostKvPool(const KvPoolConfig& device, const HostPoolSize& size, platform::Allocator& pinned);
  /// The same with exactly `pages` usable pages (>= 1): a tensor-parallel rank's shard of a host
  /// tier whose page count rank 0 chose (every rank's host pool has the same pages).
  HostKvPool(const KvPoolConfig& device, int32_t pages, platform::Allocator& pinned);

  KvPool& pool() { return pool_; }
  const KvPool& pool() const { return pool_; }
  PageAllocator& pages() { return pages_; }
  const PageAllocator& pages() const { return pages_; }
  int32_t num_pages() const { return pages_.num_pages(); }
  /// Bytes of host memory held (page 0 included).
  int64_t total_bytes() const { return pool_.total_bytes(); }

 private:
  KvPool pool_;
  PageAllocator pages_;
};

}  // namespace pagoda::kv
