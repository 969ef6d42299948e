#include "pagoda/disagg/kv_layout.h"

#include <xxhash.h>

#include <fmt/format.h>

#include "pagoda/core/error.h"

namespace pagoda::disagg {

KvLayout layout_of(const kv::KvPool& pool, const std::string& model, uint64_t weights,
                   DType dtype) {
  const kv::KvPoolConfig& c = pool.config();
  PAGODA_REQUIRE(c.layout == kv::KvLayout::kMha, kUnsupported,
                 "disaggregation supports MHA KV pools only (this model's pool is MLA)");
  return KvLayout{.model = model,
                  .weights = weights,
                  .dtype = dtype,
                  .kv_dtype = c.dtype,
                  .page_size = c.page_size,
                  .num_layers = c.num_layers,
                  .num_kv_heads = c.num_kv_heads,
                  .head_dim = c.head_dim,
                  .head_dim_v = c.head_dim_v > 0 ? c.head_dim_v : c.head_dim};
}

std::string layout_mismatch(const KvLayout& a, const KvLayout& b) {
  auto diff = [](const char* field, const auto& here, const auto& peer) {
    return fmt::format("{}: {} here, {} on the peer", field, here, peer);
  };
  if (a.model != b.model) return diff("model", a.model, b.model);
  if (a.weights != b.weights) return diff("weight seed", a.weights, b.weights);
  if (a.dtype != b.dtype) return diff("dtype", a.dtype, b.dtype);
  if (a.kv_dtype != b.kv_dtype) return diff("KV dtype", a.kv_dtype, b.kv_dtype);
  if (a.page_size != b.page_size) return diff("page size", a.page_size, b.page_size);
  if (a.num_layers != b.num_layers) return diff("layers", a.num_layers, b.num_layers);
  if (a.num_kv_heads != b.num_kv_heads) return diff("KV heads", a.num_kv_heads, b.num_kv_heads);
  if (a.head_dim != b.head_dim) return diff("head dim", a.head_dim, b.head_dim);
  if (a.head_dim_v != b.head_dim_v) return diff("V head dim", a.head_dim_v, b.head_dim_v);
  return {};
}

std::vector<MemRegion> regions_of(const kv::KvPool& pool) {
  PAGODA_REQUIRE(pool.device().is_cpu(), kUnsupported,
                 "the KV transfer registers host pools only (a device pool goes through its "
                 "staging pool)");
  const std::vector<uint64_t> page_bytes = page_bytes_of(pool);
  const auto pages = static_cast<uint64_t>(pool.num_slots() / pool.page_size());
  std::vector<MemRegion> out;
  for (int32_t l = 0; l < pool.num_layers(); ++l) {
    out.push_back({pool.k_view(LayerId{l}).data(), pages * page_bytes[2 * static_cast<size_t>(l)]});
    out.push_back(
        {pool.v_view(LayerId{l}).data(), pages * page_bytes[2 * static_cast<size_t>(l) + 1]});
  }
  return out;
}

std::vector<uint64_t> page_bytes_of(const kv::KvPool& pool) {
  const auto elem = static_cast<uint64_t>(dtype_size(pool.config().dtype));
  const auto p = static_cast<uint64_t>(pool.page_size());
  std::vector<uint64_t> out;
  for (int32_t l = 0; l < pool.num_layers(); ++l) {
    out.push_back(p * static_cast<uint64_t>(pool.k_row_elems()) * elem);
    out.push_back(p * static_cast<uint64_t>(pool.v_row_elems()) * elem);
  }
  return out;
}

std::vector<WriteOp> page_write_ops(std::span<const PageId> src_pages,
                                    std::span<const PageId> dst_pages,
                                    std::span<const uint64_t> page_bytes) {
  PAGODA_REQUIRE(src_pages.size() == dst_pages.size(), kInvalidArgument,
                 "page map: {} source pages for {} destination pages", src_pages.size(),
                 dst_pages.size());
  // Runs of pages contiguous on both sides: [start, start + len).
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t i = 0; i < src_pages.size(); ++i) {
    if (!runs.empty()) {
      auto& [start, len] = runs.back();
      const size_t j = start + len - 1;
      if (src_pages[i].value() == src_pages[j].value() + 1 &&
          dst_pages[i].value() == dst_pages[j].value() + 1) {
        ++len;
        continue;
      }
    }
    runs.emplace_back(i, 1);
  }
  std::vector<WriteOp> ops;
  ops.reserve(runs.size() * page_bytes.size());
  for (size_t r = 0; r < page_bytes.size(); ++r) {
    for (const auto& [start, len] : runs) {
      ops.push_back(WriteOp{.src_region = static_cast<uint32_t>(r),
                            .src_offset = static_cast<uint64_t>(src_pages[start].value()) * page_bytes[r],
                            .dst_region = static_cast<uint32_t>(r),
                            .dst_offset = static_cast<uint64_t>(dst_pages[start].value()) * page_bytes[r],
                            .bytes = len * page_bytes[r]});
    }
  }
  return ops;
}

PagesChecksum::PagesChecksum() : state_(XXH3_createState()) {
  PAGODA_REQUIRE(state_ != nullptr, kInternal, "XXH3_createState failed");
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

PagesChecksum::~PagesChecksum() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void PagesChecksum::update(std::span<const MemRegion> regions, std::span<const uint64_t> page_bytes,
                           std::span<const PageId> pages) {
  PAGODA_REQUIRE(regions.size() == page_bytes.size(), kInvalidArgument,
                 "checksum: {} regions, {} page sizes", regions.size(), page_bytes.size());
  for (PageId p : pages)
    for (size_t r = 0; r < regions.size(); ++r)
      PAGODA_REQUIRE(p.value() >= 0 && (static_cast<uint64_t>(p.value()) + 1) * page_bytes[r] <=
                                           regions[r].bytes,
                     kOutOfRange, "checksum: page {} outside region {}", p.value(), r);
  auto* state = static_cast<XXH3_state_t*>(state_);
  for (PageId p : pages)
    for (size_t r = 0; r < regions.size(); ++r)
      XXH3_64bits_update(state,
                         static_cast<const char*>(regions[r].base) +
                             static_cast<uint64_t>(p.value()) * page_bytes[r],
                         page_bytes[r]);
}

uint64_t PagesChecksum::digest() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

uint64_t pages_checksum(std::span<const MemRegion> regions, std::span<const uint64_t> page_bytes,
                        std::span<const PageId> pages) {
  PagesChecksum c;
  c.update(regions, page_bytes, pages);
  return c.digest();
}

}  // namespace pagoda::disagg
