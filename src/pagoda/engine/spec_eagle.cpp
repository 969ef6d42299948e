// SpecMode::kEagle (docs/design/spec.md §2): an EAGLE head (model::EagleRunner) follows every
// target step with its own K/V, drafts each round's trees from its recurrence, and re-extends
// the kept positions with the target's features from the verify forward.
//
// Positions: the head's entry at position p is (token x_{p+1}, target feature f_p), so its KV
// covers exactly the target's kv_len positions, at the same slots. A round's root x_n (kv_len n)
// starts from the head's output at position n − 1 (SpecWorker::EagleState of its row); a tree node
// at depth d ≥ 1 is fed (its token, the hidden state of the head output that proposed it) at
// position n + d − 1.
#include <algorithm>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"
#include "pagoda/engine/spec_worker.h"
#include "pagoda/model/step_input.h"
#include "pagoda/spec/tree_builder.h"

namespace pagoda::engine {

using attention::ForwardMode;

namespace {

/// The top-k candidates (target ids) of one draft-vocabulary logits row.
void head_candidates(const model::EagleHead& head, std::span<const float> logits, int32_t k,
                     std::vector<spec::Candidate>& out) {
  const size_t first = out.size();
  spec::top_candidates(logits, k, out);
  for (size_t i = first; i < out.size(); ++i) out[i].token = head.to_target(out[i].token);
}

/// Records the head's output row `row` as a request row's next-draft state.
void set_state(SpecWorker::EagleState& state, const model::EagleHead& head,
               const model::EagleOutput& o, size_t row, size_t logit_row, int32_t topk) {
  const size_t h = static_cast<size_t>(head.config().hidden_size);
  const size_t vd = static_cast<size_t>(head.config().draft_vocab_size);
  state.hidden.assign(o.hidden.begin() + static_cast<ptrdiff_t>(row * h),
                      o.hidden.begin() + static_cast<ptrdiff_t>((row + 1) * h));
  std::vector<spec::Candidate> c;
  head_candidates(head, std::span<const float>(o.logits).subspan(logit_row * vd, vd), topk, c);
  state.next.clear();
  for (const spec::Candidate& x : c) state.next.emplace_back(x.token, x.logprob);
}

}  // namespace

void SpecWorker::init_eagle(const model::WorkerConfig& worker,
                            const std::function<std::unique_ptr<model::ModelOps>()>& make_ops) {
  const SpecConfig& sc = config_;
  const model::EagleHead& head = *sc.eagle_head;
  PAGODA_REQUIRE(&head.target() == model_ ||
                     (head.config().hidden_size == model_->config().hidden_size &&
                      head.config().vocab_size == model_->config().vocab_size &&
                      head.target().config().num_layers == model_->config().num_layers),
                 kInvalidArgument, "the EAGLE head was built for another target model");
  PAGODA_REQUIRE(sc.topk <= head.config().draft_vocab_size, kInvalidArgument,
                 "spec topk {} exceeds the EAGLE head's draft vocabulary of {}", sc.topk,
                 head.config().draft_vocab_size);
  // Same page size, pages and req→token table as the target: a slot names the same position.
  eagle_ = std::make_unique<model::EagleRunner>(
      head, make_ops(),
      model::EagleRunnerConfig{.page_size = worker.page_size,
                               .num_pages = worker.num_pages,
                               .kv_dtype = worker.kv_dtype,
                               .backend = worker.backend,
                               .mixed_batches = worker.mixed_batches},
      *memory_.table);
  eagle_state_.resize(static_cast<size_t>(memory_.table->max_reqs()) + 1);
}

void SpecWorker::eagle_after_step(const model::WorkerBatch& batch,
                                  const model::WorkerOutput& result) {
  const model::EagleHead& head = eagle_->head();
  const attention::ForwardBatch& f = batch.forward;
  const auto bs = static_cast<size_t>(f.batch_size);
  PAGODA_REQUIRE(batch.context.size() == bs, kInvalidArgument,
                 "an EAGLE step needs every sequence's context ({} of {})", batch.context.size(),
                 bs);
  model::EagleInput in;
  in.forward = f;
  in.features = result.hidden;
  in.from_target = true;
  std::vector<std::pair<size_t, size_t>> sampled;  // (request row, query row of its last token)
  size_t row = 0, sample_row = 0;
  const bool decode = f.mode == ForwardMode::kDecode;
  for (size_t b = 0; b < bs; ++b) {
    const std::span<const int32_t> tokens = batch.context[b];
    const auto p = static_cast<size_t>(decode ? f.seq_lens[b] - 1 : f.extend_prefix_lens[b]);
    const auto n = static_cast<size_t>(decode ? 1 : f.extend_seq_lens[b]);
    // Position p + i gets token x_{p+i+1}: the chunk shifted by one, then the sampled token (or,
    // for a non-final chunk, the next prompt token).
    in.input_ids.insert(in.input_ids.end(), tokens.begin() + static_cast<ptrdiff_t>(p + 1),
                        tokens.begin() + static_cast<ptrdiff_t>(p + n));
    if (batch.logit_rows[b] > 0) {
      in.input_ids.push_back(result.tokens[sample_row++]);
      sampled.emplace_back(static_cast<size_t>(f.req_pool_indices[b]), row + n - 1);
      in.logit_rows.push_back(static_cast<int32_t>(row + n - 1));
    } else {
      in.input_ids.push_back(tokens[p + n]);
    }
    row += n;
  }
  const model::EagleOutput o = eagle_->run(in);
  for (size_t i = 0; i < sampled.size(); ++i)
    set_state(eagle_state_[sampled[i].first], head, o, sampled[i].second, i, config_.topk);
}

std::vector<spec::DraftTree> SpecWorker::eagle_trees(const std::vector<Seq>& reqs,
                                                     std::span<const SlotIndex> slots,
                                                     int32_t extra) {
  const SpecConfig& sc = config_;
  const model::EagleHead& head = eagle_->head();
  const size_t h = static_cast<size_t>(head.config().hidden_size);
  const size_t vd = static_cast<size_t>(head.config().draft_vocab_size);
  const size_t bs = reqs.size();
  std::vector<spec::TreeBuilder> builders;
  // hidden[b][i]: the head output that proposed beam node i's children (node 0: the round's
  // starting state; node i >= 1: the head's output when fed node i).
  std::vector<std::vector<std::vector<float>>> hidden(bs);
  std::vector<spec::Candidate> children;
  for (size_t b = 0; b < bs; ++b) {
    const Seq& r = reqs[b];
    const EagleState& state = eagle_state_[static_cast<size_t>(r.row.value())];
    PAGODA_REQUIRE(state.hidden.size() == h && static_cast<int32_t>(state.next.size()) == sc.topk,
                   kInternal, "request row {} has no EAGLE state (the head missed a step)",
                   r.row.value());
    builders.emplace_back(r.context.back(), sc.topk, sc.steps);
    hidden[b].push_back(state.hidden);
    children.clear();
    for (const auto& [tok, lp] : state.next) children.push_back(spec::Candidate{tok, lp});
    builders[b].expand(children);  // step 0: the state's own candidates, no forward
  }
  while (!builders.front().done()) {
    const spec::DraftTree& first = builders.front().beam_tree();
    const int32_t m = first.size() - 1;  // forwarded nodes per request (the root's entry exists)
    const int32_t nf = builders.front().frontier_size();
    model::EagleInput in;
    in.from_target = false;
    attention::ForwardBatch& f = in.forward;
    f.mode = ForwardMode::kTargetVerify;
    f.batch_size = static_cast<int>(bs);
    f.spec.topk = sc.topk;
    f.spec.num_steps = sc.steps;
    f.spec.num_draft_tokens = m;
    for (size_t b = 0; b < bs; ++b) {
      const Seq& r = reqs[b];
      const spec::DraftTree& t = builders[b].beam_tree();
      PAGODA_CHECK_EQ(t.size(), m + 1);
      const int32_t len = r.kv_len;
      f.req_pool_indices.push_back(r.row.value());
      f.seq_lens.push_back(len);
      f.extend_prefix_lens.push_back(len);
      f.extend_seq_lens.push_back(m);
      const std::vector<int32_t> depth = t.depths();
      hidden[b].resize(static_cast<size_t>(m + 1));
      for (int32_t i = 1; i <= m; ++i) {
        f.positions.push_back(len + depth[static_cast<size_t>(i)] - 1);
        f.out_cache_loc.push_back(slots[b * static_cast<size_t>(extra) + static_cast<size_t>(i - 1)]);
        in.input_ids.push_back(t.tokens[static_cast<size_t>(i)]);
        const auto& g = hidden[b][static_cast<size_t>(t.parents[static_cast<size_t>(i)])];
        in.features.insert(in.features.end(), g.begin(), g.end());
        // Mask row: the whole prefix, then the node itself and its ancestors below the root.
        for (int32_t j = 0; j < len; ++j) f.spec.tree_mask.push_back(1);
        const size_t base = f.spec.tree_mask.size();
        f.spec.tree_mask.resize(base + static_cast<size_t>(m), 0);
        for (int32_t a = i; a > 0; a = t.parents[static_cast<size_t>(a)])
          f.spec.tree_mask[base + static_cast<size_t>(a - 1)] = 1;
      }
      for (int32_t k = 0; k < nf; ++k)
        in.logit_rows.push_back(static_cast<int32_t>(b) * m + m - nf + k);
    }
    const model::EagleOutput o = eagle_->run(in);
    for (size_t b = 0; b < bs; ++b) {
      for (int32_t i = 1; i <= m; ++i) {
        const size_t row = b * static_cast<size_t>(m) + static_cast<size_t>(i - 1);
        hidden[b][static_cast<size_t>(i)].assign(o.hidden.begin() + static_cast<ptrdiff_t>(row * h),
                                                 o.hidden.begin() + static_cast<ptrdiff_t>((row + 1) * h));
      }
      children.clear();
      for (int32_t k = 0; k < nf; ++k)
        head_candidates(head,
                        std::span<const float>(o.logits).subspan(
                            (b * static_cast<size_t>(nf) + static_cast<size_t>(k)) * vd, vd),
                        sc.topk, children);
      builders[b].expand(children);
    }
  }
  std::vector<spec::DraftTree> trees;
  for (const auto& b : builders) trees.push_back(b.finish(sc.num_draft_tokens));
  return trees;
}

void SpecWorker::eagle_extend(const std::vector<Seq>& reqs,
                              const std::vector<std::vector<int32_t>>& kv_nodes,
                              const std::vector<std::vector<int32_t>>& tails,
                              std::span<const SlotIndex> slots, int32_t extra,
                              const std::vector<float>& verify_hidden, int32_t tree_size) {
  const model::EagleHead& head = eagle_->head();
  const size_t fd = static_cast<size_t>(head.feature_dim());
  model::StepInput si{.mode = ForwardMode::kExtend, .seqs = {}, .out_cache_loc = {}};
  model::EagleInput in;
  in.from_target = true;
  for (size_t b = 0; b < reqs.size(); ++b) {
    const Seq& r = reqs[b];
    const size_t keep = kv_nodes[b].size();
    // Positions n .. n + keep − 1 (n = kv_len) get tokens x_{n+1} .. x_{n+keep} (the emitted
    // tokens) and the verify features of the kept nodes (the root, then the accepted path).
    const auto tokens = std::span<const int32_t>(tails[b]).subspan(1, keep);
    si.seqs.push_back(model::StepSequence{.req_slot = r.row.value(),
                                          .prefix_len = r.kv_len,
                                          .tokens = tokens,
                                          .want_logits = true});
    const auto mine = slots.subspan(b * static_cast<size_t>(extra), keep);
    si.out_cache_loc.insert(si.out_cache_loc.end(), mine.begin(), mine.end());
    in.input_ids.insert(in.input_ids.end(), tokens.begin(), tokens.end());
    for (int32_t node : kv_nodes[b]) {
      const size_t row = b * static_cast<size_t>(tree_size) + static_cast<size_t>(node);
      in.features.insert(in.features.end(), verify_hidden.begin() + static_cast<ptrdiff_t>(row * fd),
                         verify_hidden.begin() + static_cast<ptrdiff_t>((row + 1) * fd));
    }
    in.logit_rows.push_back(static_cast<int32_t>(in.input_ids.size() - 1));
  }
  in.forward = model::build_forward_batch(si);
  const model::EagleOutput o = eagle_->run(in);
  for (size_t b = 0; b < reqs.size(); ++b)
    set_state(eagle_state_[static_cast<size_t>(reqs[b].row.value())], head, o,
              static_cast<size_t>(in.logit_rows[b]), b, config_.topk);
}

}  // namespace pagoda::engine
