#pragma once
/// The WorkerBatches of a speculative round (SpecWorker's internals; spec_draft.cpp).

#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/engine/spec_worker.h"

namespace pagoda::engine::spec_batch {

/// The kTargetVerify batch of `trees` (one per sequence, all of one size n) forwarding nodes
/// first..n−1: node i of sequence b at row position lens[b] + i (slot node_slots[b * (n − first)
/// + i − first]) and RoPE position lens[b] + depth(i). Nodes before `first` are not forwarded:
/// their K/V is already at row positions lens[b] .. lens[b] + first − 1 (a drafter's earlier
/// steps), and the mask lets each forwarded node see its ancestors among them.
model::WorkerBatch tree_batch(const std::vector<SpecWorker::Seq>& seqs,
                              const std::vector<spec::DraftTree>& trees,
                              std::span<const int32_t> lens, std::span<const SlotIndex> node_slots,
                              const SpecConfig& sc, int32_t first = 0);

/// The slots of draft nodes first..n−1 of every sequence ([b * extra + first, b * extra + n) of
/// `slots`).
std::vector<SlotIndex> tree_slots(size_t nseq, std::span<const SlotIndex> slots, int32_t extra,
                                  int32_t n, int32_t first = 0);

/// Each sequence's kv_len.
std::vector<int32_t> kv_lens(const std::vector<SpecWorker::Seq>& seqs);

/// A greedy decode batch: row rows[i] computes token ids[i] at position prefix[i] into slot
/// slots[i] (already in its req→token row), one logit row each.
model::WorkerBatch one_token_batch(std::span<const int32_t> rows, std::vector<int32_t> ids,
                                   std::span<const int32_t> prefix,
                                   std::span<const SlotIndex> slots);

/// A round's trees are at most `steps` deep; every sliding window must reach back past them
/// (a tree row's window then starts in the cached prefix: the CUDA kernels' rule, exact there,
/// docs/design/spec.md §1). Throws Error(kInvalidArgument) naming the `which` model's layer.
void require_window_covers_trees(const model::ModelConfig& c, int steps, const char* which);

}  // namespace pagoda::engine::spec_batch
