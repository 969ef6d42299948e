#pragma once
/// What the two sides of a prefill–decode pair must agree on before KV moves between them
/// (docs/design/pd.md), and the page-level pieces of a transfer: the KV pool's regions, the
/// write ops of a page map (runs contiguous on both sides merged) and a checksum of pages.
/// Pure functions (regions_of reads the pool's base pointers); thread safe.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "pagoda/core/dtype.h"
#include "pagoda/core/ids.h"
#include "pagoda/disagg/kv_transfer.h"
#include "pagoda/kv/kv_pool.h"

namespace pagoda::disagg {

/// The handshake's layout. Two sides match when every field is equal.
struct KvLayout {
  std::string model;        ///< served model name
  uint64_t weights = 0;     ///< weight seed of the builtin model (0 for a checkpoint)
  DType dtype = DType::kF32;     ///< compute dtype
  DType kv_dtype = DType::kF32;  ///< KV storage dtype
  int32_t page_size = 0;
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t head_dim_v = 0;
};

/// The layout of `pool` for `model` computing in `dtype` (MHA pools only: Error(kUnsupported)
/// for MLA).
KvLayout layout_of(const kv::KvPool& pool, const std::string& model, uint64_t weights,
                   DType dtype);

/// "" when `a` (this side) and `b` (the peer) match; otherwise the first differing field as
/// "page size: 16 here, 1 on the peer".
std::string layout_mismatch(const KvLayout& a, const KvLayout& b);

/// The host regions of `pool`: K then V of each layer (2 * num_layers regions). Host pools only
/// (Error(kUnsupported) for a device pool: a transfer registers its staging pool, staging.h).
std::vector<MemRegion> regions_of(const kv::KvPool& pool);

/// Bytes of one page of one region of `pool` (page_size rows of K, or of V; K and V rows have the
/// same size in an MHA pool with head_dim_v == head_dim, else per region: see page_bytes_of).
std::vector<uint64_t> page_bytes_of(const kv::KvPool& pool);

/// The writes that copy pages src_pages[i] → dst_pages[i] in every region (region r of this
/// side into region r of the peer; page_bytes[r] bytes per page), runs contiguous on both sides
/// merged into one op per region. Throws kInvalidArgument when the lists differ in length.
std::vector<WriteOp> page_write_ops(std::span<const PageId> src_pages,
                                    std::span<const PageId> dst_pages,
                                    std::span<const uint64_t> page_bytes);

/// XXH3 (64-bit) over pages of every region in page-major order (page p's region 0, 1, ...,
/// then the next page), fed in pieces: updating with pages [a, b) then [b, c) digests what one
/// update with [a, c) does, so a sender can hash its staging chunk by chunk. Not thread-safe.
class PagesChecksum {
 public:
  PagesChecksum();
  ~PagesChecksum();
  PagesChecksum(const PagesChecksum&) = delete;
  PagesChecksum& operator=(const PagesChecksum&) = delete;
  /// Adds `pages` of `regions` (page_bytes[r] bytes per page of region r). Throws kInvalidArgument
  /// for mismatched lists, kOutOfRange for a page outside a region (checked before hashing).
  void update(std::span<const MemRegion> regions, std::span<const uint64_t> page_bytes,
              std::span<const PageId> pages);
  uint64_t digest() const;

 private:
  void* state_;  ///< XXH3_state_t
};

/// PagesChecksum of `pages` in one piece: what a sender computes over its staged source pages and
/// a receiver over its staging pages after the transfer.
uint64_t pages_checksum(std::span<const MemRegion> regions, std::span<const uint64_t> page_bytes,
                        std::span<const PageId> pages);

}  // namespace pagoda::disagg
