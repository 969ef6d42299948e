#pragma once
/// The KV side of a speculative round, for any page size (sglang_spec §6, page size > 1).
///
///   1. alloc_draft_slots: every request gets `extra` slots after its committed tokens
///      (alloc_extend: the free tail of its partial last page first, then fresh pages), written
///      into its req→token row at positions [kv_len, kv_len + extra). Draft forwards and the
///      verify forward write their K/V there (node i of a tree at row position kv_len + i), so a
///      branch never shares a partially filled page with another request: the tail page it
///      continues is the request's own.
///   2. verify, accept.
///   3. commit_draft_slots: request b keeps `keep` positions; position kv_len + j takes the K/V of
///      tree node kv_nodes[j] (the root, then the accepted nodes). Where the node is not j, the
///      K/V must move (returned as src → dst pairs for KvPool::move_kv, all reads before any
///      write); the whole pages past the kept positions go back to the allocator. Only the kept
///      positions ever enter the radix cache (the caller sets kv_len += keep).
///
/// A failed round before commit returns its slots with PageAllocator::restore_state (take
/// backup_state() before alloc_draft_slots). Host bookkeeping only; not thread-safe.

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "pagoda/core/ids.h"
#include "pagoda/kv/page_allocator.h"
#include "pagoda/kv/req_to_token.h"

namespace pagoda::spec {

/// One request of a speculative round.
struct SpecSeqKv {
  ReqSlot row;         ///< its req→token row
  int32_t kv_len = 0;  ///< committed tokens with K/V (>= 1)
};

/// Allocates `extra` (>= 1) slots per request in batch order and writes them into the rows.
/// Returns [bs * extra] slots (request b's at [b * extra, (b + 1) * extra)), or nullopt
/// (nothing changed) when the pool is short. Throws kInvalidArgument (unchanged) when a row would
/// overflow the table's context length or a kv_len < 1.
std::optional<std::vector<SlotIndex>> alloc_draft_slots(kv::PageAllocator& allocator,
                                                        kv::ReqToTokenTable& table,
                                                        std::span<const SpecSeqKv> seqs,
                                                        int32_t extra);

/// K/V rows to copy, pairwise (src[i] → dst[i]).
struct KvMoves {
  std::vector<SlotIndex> src;
  std::vector<SlotIndex> dst;
};

/// Commits a round (see the file comment). kv_nodes[b] has 1..extra entries, kv_nodes[b][0] == 0
/// and kv_nodes[b][j] in [j, extra) (a node at depth j has index >= j). Frees the pages past the
/// kept positions and returns the moves. Throws kInvalidArgument (unchanged) on bad sizes.
KvMoves commit_draft_slots(kv::PageAllocator& allocator, std::span<const SpecSeqKv> seqs,
                           std::span<const SlotIndex> slots, int32_t extra,
                           std::span<const std::vector<int32_t>> kv_nodes);

}  // namespace pagoda::spec
