#include "pagoda/spec/spec_kv.h"

#include <algorithm>

#include "pagoda/core/error.h"

namespace pagoda::spec {

std::optional<std::vector<SlotIndex>> alloc_draft_slots(kv::PageAllocator& allocator,
                                                        kv::ReqToTokenTable& table,
                                                        std::span<const SpecSeqKv> seqs,
                                                        int32_t extra) {
  PAGODA_REQUIRE(extra >= 1, kInvalidArgument, "draft slots per request must be >= 1 (got {})",
                 extra);
  std::vector<int32_t> pre, seq;
  std::vector<SlotIndex> last;
  for (const SpecSeqKv& s : seqs) {
    PAGODA_REQUIRE(s.kv_len >= 1, kInvalidArgument, "speculative request kv_len {} < 1",
                   s.kv_len);
    PAGODA_REQUIRE(int64_t{s.kv_len} + extra <= table.max_context_len(), kInvalidArgument,
                   "{} draft slots after {} tokens overflow the context of {}", extra, s.kv_len,
                   table.max_context_len());
    pre.push_back(s.kv_len);
    seq.push_back(s.kv_len + extra);
    last.push_back(table.row(s.row)[static_cast<size_t>(s.kv_len - 1)]);
  }
  auto slots = allocator.alloc_extend(pre, seq, last);
  if (!slots) return std::nullopt;
  for (size_t b = 0; b < seqs.size(); ++b)
    table.write(seqs[b].row, seqs[b].kv_len,
                std::span<const SlotIndex>(*slots).subspan(b * static_cast<size_t>(extra),
                                                           static_cast<size_t>(extra)));
  return slots;
}

KvMoves commit_draft_slots(kv::PageAllocator& allocator, std::span<const SpecSeqKv> seqs,
                           std::span<const SlotIndex> slots, int32_t extra,
                           std::span<const std::vector<int32_t>> kv_nodes) {
  const size_t bs = seqs.size();
  PAGODA_REQUIRE(kv_nodes.size() == bs && slots.size() == bs * static_cast<size_t>(extra),
                 kInvalidArgument, "commit got {} node lists and {} slots for {} requests × {}",
                 kv_nodes.size(), slots.size(), bs, extra);
  const int64_t page = allocator.page_size();
  KvMoves moves;
  std::vector<SlotIndex> to_free;
  for (size_t b = 0; b < bs; ++b) {
    const auto& nodes = kv_nodes[b];
    const int64_t keep = static_cast<int64_t>(nodes.size());
    PAGODA_REQUIRE(keep >= 1 && keep <= extra && nodes[0] == 0, kInvalidArgument,
                   "request {} keeps {} of {} draft positions (root first required)", b, keep,
                   extra);
    const SlotIndex* mine = slots.data() + b * static_cast<size_t>(extra);
    for (int64_t j = 0; j < keep; ++j) {
      const int32_t node = nodes[static_cast<size_t>(j)];
      PAGODA_REQUIRE(node >= j && node < extra, kInvalidArgument,
                     "request {} position {} takes node {} (must be in [{}, {}))", b, j, node, j,
                     extra);
      if (node == j) continue;
      moves.src.push_back(mine[node]);
      moves.dst.push_back(mine[j]);
    }
    const int64_t len = seqs[b].kv_len;
    const int64_t end_kept_page = (len + keep + page - 1) / page * page;  // first position past
    for (int64_t pos = std::max(end_kept_page, len); pos < len + extra; ++pos)
      to_free.push_back(mine[pos - len]);
  }
  allocator.free(to_free);
  return moves;
}

}  // namespace pagoda::spec
