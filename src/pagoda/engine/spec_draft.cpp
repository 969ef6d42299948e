// SpecMode::kDraft (docs/design/spec.md §2): a draft model's worker drafts each round's trees
// (topk > 1: beam frontiers as kTargetVerify batches; topk 1: a chain of decode batches), follows
// every plain step with the same batch, and keeps its K/V of the kept tokens after a round.
// Also the round's batch builders (spec_batch.h).
#include <algorithm>
#include <array>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"
#include "pagoda/engine/spec_batch.h"
#include "pagoda/model/llama_worker.h"
#include "pagoda/model/step_input.h"
#include "pagoda/spec/tree_builder.h"

namespace pagoda::engine {

using attention::ForwardMode;
using Seq = SpecWorker::Seq;

namespace spec_batch {

model::WorkerBatch tree_batch(const std::vector<Seq>& seqs,
                              const std::vector<spec::DraftTree>& trees,
                              std::span<const int32_t> lens, std::span<const SlotIndex> node_slots,
                              const SpecConfig& sc, int32_t first) {
  model::WorkerBatch b;
  attention::ForwardBatch& f = b.forward;
  const int32_t n = trees.front().size();
  const int32_t m = n - first;
  PAGODA_CHECK(first >= 0 && m >= 1);
  f.mode = ForwardMode::kTargetVerify;
  f.batch_size = static_cast<int>(seqs.size());
  f.spec.topk = sc.topk;
  f.spec.num_steps = sc.steps;
  f.spec.num_draft_tokens = m;
  f.out_cache_loc.assign(node_slots.begin(), node_slots.end());
  PAGODA_CHECK_EQ(f.out_cache_loc.size(), seqs.size() * static_cast<size_t>(m));
  for (size_t i = 0; i < seqs.size(); ++i) {
    const spec::DraftTree& t = trees[i];
    PAGODA_CHECK_EQ(t.size(), n);
    const int32_t len = lens[i];
    f.req_pool_indices.push_back(seqs[i].row.value());
    f.seq_lens.push_back(len + first);
    f.extend_prefix_lens.push_back(len + first);
    f.extend_seq_lens.push_back(m);
    const std::vector<int32_t> depth = t.depths();
    for (int32_t j = first; j < n; ++j) f.positions.push_back(len + depth[static_cast<size_t>(j)]);
    b.input_ids.insert(b.input_ids.end(), t.tokens.begin() + first, t.tokens.end());
    spec::append_verify_mask(t, len, f.spec.tree_mask, first);
    b.sample_step.push_back(seqs[i].sample_step);
  }
  return b;
}

std::vector<SlotIndex> tree_slots(size_t nseq, std::span<const SlotIndex> slots, int32_t extra,
                                  int32_t n, int32_t first) {
  std::vector<SlotIndex> out;
  out.reserve(nseq * static_cast<size_t>(n - first));
  for (size_t b = 0; b < nseq; ++b) {
    const auto mine = slots.subspan(b * static_cast<size_t>(extra) + static_cast<size_t>(first),
                                    static_cast<size_t>(n - first));
    out.insert(out.end(), mine.begin(), mine.end());
  }
  return out;
}

std::vector<int32_t> kv_lens(const std::vector<Seq>& seqs) {
  std::vector<int32_t> lens;
  for (const Seq& s : seqs) lens.push_back(s.kv_len);
  return lens;
}

model::WorkerBatch one_token_batch(std::span<const int32_t> rows, std::vector<int32_t> ids,
                                   std::span<const int32_t> prefix,
                                   std::span<const SlotIndex> slots) {
  const size_t n = rows.size();
  model::WorkerBatch db;
  db.input_ids = std::move(ids);
  model::StepInput in{.mode = ForwardMode::kDecode,
                      .seqs = {},
                      .out_cache_loc = std::vector<int32_t>(slots.begin(), slots.end())};
  for (size_t i = 0; i < n; ++i) {
    in.seqs.push_back(model::StepSequence{.req_slot = rows[i],
                                          .prefix_len = prefix[i],
                                          .tokens = std::span<const int32_t>(db.input_ids).subspan(i, 1),
                                          .want_logits = true});
  }
  db.forward = model::build_forward_batch(in);
  db.logit_rows.assign(n, 1);
  db.sampling.assign(n, model::SamplingParams{});
  db.sample_step.assign(n, 0);
  return db;
}

void require_window_covers_trees(const model::ModelConfig& c, int steps, const char* which) {
  for (int l = 0; l < c.num_layers; ++l) {
    PAGODA_REQUIRE(c.window_of(l) < 0 || c.window_of(l) >= steps, kInvalidArgument,
                   "spec steps {} exceed the sliding window {} of the {} model's layer {}", steps,
                   c.window_of(l), which, l);
  }
}

}  // namespace spec_batch

namespace {

using spec_batch::tree_batch;
using spec_batch::tree_slots;

/// Runs `steps` draft forwards on the draft worker and returns the verify trees (SGLang's EAGLE
/// construction, spec::TreeBuilder). Step 0 forwards the root; step s >= 1 only the beam's
/// frontier (topk nodes), whose ancestors' K/V the earlier steps left at the draft slots in the
/// row (beam nodes keep their indices, so node j stays at slot j).
std::vector<spec::DraftTree> draft_trees(model::ModelWorker& worker, const std::vector<Seq>& seqs,
                                         std::span<const SlotIndex> slots, int32_t extra,
                                         const SpecConfig& sc, int64_t vocab) {
  std::vector<spec::TreeBuilder> builders;
  for (const Seq& s : seqs) builders.emplace_back(s.context.back(), sc.topk, sc.steps);
  std::vector<spec::DraftTree> beams(seqs.size());
  std::vector<spec::Candidate> children;
  const std::vector<int32_t> lens = spec_batch::kv_lens(seqs);
  while (!builders.front().done()) {
    for (size_t b = 0; b < seqs.size(); ++b) beams[b] = builders[b].beam_tree();
    const int32_t n = beams.front().size();
    const int32_t nf = builders.front().frontier_size();
    model::WorkerBatch batch = tree_batch(
        seqs, beams, lens, tree_slots(seqs.size(), slots, extra, n, n - nf), sc, n - nf);
    batch.logit_rows.assign(seqs.size(), nf);
    batch.sampling.assign(seqs.size(), model::SamplingParams{});  // greedy: argmax rows
    batch.top_k = sc.topk > 1 ? sc.topk : 0;  // device top-k, or whole rows where there is none
    const model::WorkerOutput o = worker.run(batch);
    const auto k = static_cast<size_t>(sc.topk);
    for (size_t b = 0; b < seqs.size(); ++b) {
      children.clear();
      for (int32_t f = 0; f < nf; ++f) {
        const size_t row = b * static_cast<size_t>(nf) + static_cast<size_t>(f);
        if (sc.topk == 1) {
          children.push_back(spec::Candidate{o.tokens[row], 0.f});
        } else if (!o.top_ids.empty()) {
          for (size_t t = 0; t < k; ++t)
            children.push_back(spec::Candidate{o.top_ids[row * k + t], o.top_logprobs[row * k + t]});
        } else {
          spec::top_candidates(std::span<const float>(o.logits).subspan(row * static_cast<size_t>(vocab),
                                                                  static_cast<size_t>(vocab)),
                         sc.topk, children);
        }
      }
      builders[b].expand(children);
    }
  }
  std::vector<spec::DraftTree> trees;
  for (const auto& b : builders) trees.push_back(b.finish(sc.num_draft_tokens));
  return trees;
}

/// The topk-1 draft (a chain) in `steps` forwards that each compute one new node: step 0 is a
/// two-token chain [token kv_len − 1, root] at positions kv_len − 1, kv_len (it writes the draft
/// K/V the previous round left pending, or rewrites the same K/V, so every sequence has the same
/// shape and the batch replays one verify graph); step s ≥ 1 is a decode batch of node s at
/// position kv_len + s (slot s of the sequence's draft slots, already in its row), which replays
/// the draft worker's decode graph. The chain is the one TreeBuilder builds for topk 1 (same
/// expansion, same finish), so the trees equal draft_trees'.
std::vector<spec::DraftTree> draft_chain(model::ModelWorker& worker, const std::vector<Seq>& seqs,
                                         const kv::ReqToTokenTable& table,
                                         std::span<const SlotIndex> slots, int32_t extra,
                                         const SpecConfig& sc) {
  const size_t nseq = seqs.size();
  std::vector<spec::TreeBuilder> builders;
  for (const Seq& s : seqs) builders.emplace_back(s.context.back(), 1, sc.steps);
  std::vector<spec::Candidate> child(1);
  auto expand = [&](const model::WorkerOutput& o) {
    for (size_t b = 0; b < nseq; ++b) {
      child[0] = spec::Candidate{o.tokens[b], 0.f};
      builders[b].expand(child);
    }
  };
  {  // step 0: [token at kv_len − 1, root]
    std::vector<spec::DraftTree> pairs(nseq);
    std::vector<int32_t> lens;
    std::vector<SlotIndex> node_slots;
    for (size_t b = 0; b < nseq; ++b) {
      const Seq& s = seqs[b];
      PAGODA_CHECK(s.kv_len >= 1);
      pairs[b].tokens = {s.context[static_cast<size_t>(s.kv_len - 1)], s.context.back()};
      pairs[b].parents = {-1, 0};
      lens.push_back(s.kv_len - 1);
      node_slots.push_back(table.read(s.row, s.kv_len - 1, 1)[0]);
      node_slots.push_back(slots[b * static_cast<size_t>(extra)]);
    }
    model::WorkerBatch batch = tree_batch(seqs, pairs, lens, node_slots, sc);
    batch.logit_rows.assign(nseq, 1);
    batch.sampling.assign(nseq, model::SamplingParams{});
    expand(worker.run(batch));
  }
  std::vector<int32_t> rows(nseq), ids(nseq), prefix(nseq);
  std::vector<SlotIndex> node_slots(nseq);
  for (size_t b = 0; b < nseq; ++b) rows[b] = seqs[b].row.value();
  for (int32_t s = 1; !builders.front().done(); ++s) {
    for (size_t b = 0; b < nseq; ++b) {
      ids[b] = builders[b].beam_tree().tokens.back();
      prefix[b] = seqs[b].kv_len + s;
      node_slots[b] = slots[b * static_cast<size_t>(extra) + static_cast<size_t>(s)];
    }
    expand(worker.run(spec_batch::one_token_batch(rows, ids, prefix, node_slots)));
  }
  std::vector<spec::DraftTree> trees;
  for (const auto& b : builders) trees.push_back(b.finish(sc.num_draft_tokens));
  return trees;
}

}  // namespace

void SpecWorker::init_draft(const model::WorkerConfig& worker,
                            const std::function<std::unique_ptr<model::ModelOps>()>& make_ops) {
  const model::LlamaModel& draft = config_.draft_model != nullptr ? *config_.draft_model : *model_;
  PAGODA_REQUIRE(draft.config().vocab_size == model_->config().vocab_size, kInvalidArgument,
                 "draft model vocabulary {} differs from the target's {}",
                 draft.config().vocab_size, model_->config().vocab_size);
  spec_batch::require_window_covers_trees(draft.config(), config_.steps, "draft");
  // Same page size, pages and req→token table: a slot names the same token in both pools.
  draft_ = std::make_unique<model::LlamaWorker>(draft, make_ops(), worker, *memory_.table);
  draft_pending_.assign(static_cast<size_t>(memory_.table->max_reqs()) + 1, 0);
}

std::vector<spec::DraftTree> SpecWorker::draft_model_trees(const std::vector<Seq>& seqs,
                                                           std::span<const SlotIndex> slots,
                                                           int32_t extra) {
  auto replays = [&] {
    const model::WorkerStats w = draft_->stats();
    return std::array<int64_t, 2>{w.steps, w.graph_steps + w.spec_graph_steps};
  };
  const auto before = replays();
  std::vector<spec::DraftTree> trees;
  if (config_.topk == 1) {
    trees = draft_chain(*draft_, seqs, *memory_.table, slots, extra, config_);
    for (const Seq& s : seqs) draft_pending_[static_cast<size_t>(s.row.value())] = 0;
  } else {
    trees = draft_trees(*draft_, seqs, slots, extra, config_, model_->config().vocab_size);
  }
  const auto after = replays();
  stats_.draft_forwards += after[0] - before[0];
  stats_.draft_graph_steps += after[1] - before[1];
  return trees;
}

void SpecWorker::flush_draft_kv(const std::vector<Seq>& seqs) {
  std::vector<int32_t> rows, ids, prefix;
  std::vector<SlotIndex> slots;
  for (const Seq& s : seqs) {
    uint8_t& pending = draft_pending_[static_cast<size_t>(s.row.value())];
    if (pending == 0 || s.kv_len < 1) continue;
    pending = 0;
    rows.push_back(s.row.value());
    ids.push_back(s.context[static_cast<size_t>(s.kv_len - 1)]);
    prefix.push_back(s.kv_len - 1);
    slots.push_back(memory_.table->read(s.row, s.kv_len - 1, 1)[0]);
  }
  if (!rows.empty())
    draft_->run(spec_batch::one_token_batch(rows, std::move(ids), prefix, slots));
}

void SpecWorker::flush_before_plain(const model::WorkerBatch& batch) {
  const attention::ForwardBatch& f = batch.forward;
  std::vector<Seq> todo;
  for (int b = 0; b < f.batch_size; ++b) {
    const auto row = static_cast<size_t>(f.req_pool_indices[static_cast<size_t>(b)]);
    if (draft_pending_[row] == 0) continue;
    const int32_t prefix = f.mode == ForwardMode::kDecode
                               ? f.seq_lens[static_cast<size_t>(b)] - 1
                               : f.extend_prefix_lens[static_cast<size_t>(b)];
    const int32_t n = f.mode == ForwardMode::kDecode ? 1 : f.extend_seq_lens[static_cast<size_t>(b)];
    // A one-token step continues the row (the pending K/V is written first); a longer extend
    // is a new fill, whose tokens the draft worker computes with the batch.
    if (n == 1 && prefix >= 1 && !batch.context.empty()) {
      todo.push_back(Seq{.row = ReqSlot{static_cast<int32_t>(row)},
                         .kv_len = prefix,
                         .context = batch.context[static_cast<size_t>(b)]});
    } else {
      draft_pending_[row] = 0;
    }
  }
  flush_draft_kv(todo);
}

void SpecWorker::draft_after_round(const std::vector<Seq>& seqs,
                                   const std::vector<std::vector<int32_t>>& kv_nodes,
                                   const std::vector<std::vector<int32_t>>& tails,
                                   std::span<const SlotIndex> slots, int32_t extra,
                                   const std::vector<uint8_t>& finished) {
  if (config_.topk == 1) {
    // A chain's nodes 0 .. steps − 1 were forwarded at the slots they keep; a longer kept chain
    // leaves its last token to the next round's first draft forward (draft_chain), unless the
    // sequence finishes now (its tokens reach the prefix cache: write them first).
    std::vector<int32_t> rows, ids, prefix;
    std::vector<SlotIndex> node_slots;
    for (size_t b = 0; b < seqs.size(); ++b) {
      const auto keep = static_cast<int32_t>(kv_nodes[b].size());
      const bool pending = keep > config_.steps;
      draft_pending_[static_cast<size_t>(seqs[b].row.value())] = pending && finished[b] == 0;
      if (!pending || finished[b] == 0) continue;
      const int32_t pos = seqs[b].kv_len + keep - 1;  // tails[b][j] sits at kv_len + j
      rows.push_back(seqs[b].row.value());
      ids.push_back(tails[b][static_cast<size_t>(keep - 1)]);
      prefix.push_back(pos);
      node_slots.push_back(memory_.table->read(seqs[b].row, pos, 1)[0]);
    }
    if (!rows.empty())
      draft_->run(spec_batch::one_token_batch(rows, std::move(ids), prefix, node_slots));
    return;
  }
  // The draft pool must hold the draft model's K/V of every kept token at its final slot. A tree
  // (topk > 1) was forwarded at tree slots, and the kept path moved, so every kept token is
  // extended.
  model::StepInput in{.mode = ForwardMode::kExtend, .seqs = {}, .out_cache_loc = {}};
  model::WorkerBatch db;
  for (size_t b = 0; b < seqs.size(); ++b) {
    const size_t keep = kv_nodes[b].size();
    if (keep == 0) continue;
    in.seqs.push_back(model::StepSequence{
        .req_slot = seqs[b].row.value(),
        .prefix_len = seqs[b].kv_len,
        .tokens = std::span<const int32_t>(tails[b]).first(keep),
        .want_logits = true});
    const auto mine = slots.subspan(b * static_cast<size_t>(extra), keep);
    in.out_cache_loc.insert(in.out_cache_loc.end(), mine.begin(), mine.end());
    db.input_ids.insert(db.input_ids.end(), in.seqs.back().tokens.begin(),
                        in.seqs.back().tokens.end());
  }
  if (in.seqs.empty()) return;
  const size_t n = in.seqs.size();
  // One token per sequence (only the root kept): a decode batch, which replays the draft
  // worker's decode graph instead of an eager extend forward.
  if (in.out_cache_loc.size() == n) in.mode = ForwardMode::kDecode;
  db.forward = model::build_forward_batch(in);
  db.logit_rows.assign(n, 1);
  db.sampling.assign(n, model::SamplingParams{});
  db.sample_step.assign(n, 0);
  draft_->run(db);
}

}  // namespace pagoda::engine
