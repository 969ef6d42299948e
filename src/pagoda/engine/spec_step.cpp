// The engine's speculative loop (docs/design/spec.md): draft (n-gram or a draft ModelWorker) →
// one kTargetVerify forward of every running request's tree → accept → commit the KV → emit.
#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"
#include "pagoda/engine/engine.h"
#include "pagoda/model/host_sampling.h"
#include "pagoda/model/llama_worker.h"
#include "pagoda/model/model_runner.h"
#include "pagoda/spec/draft_tree.h"
#include "pagoda/spec/spec_kv.h"
#include "pagoda/spec/tree_builder.h"

namespace pagoda::engine {

using attention::ForwardMode;

const char* spec_mode_name(SpecMode mode) {
  switch (mode) {
    case SpecMode::kNone: return "none";
    case SpecMode::kNgram: return "ngram";
    case SpecMode::kDraft: return "draft";
    case SpecMode::kEagle: return "eagle";
  }
  return "?";
}

SpecMode parse_spec_mode(const std::string& name) {
  for (SpecMode m : {SpecMode::kNone, SpecMode::kNgram, SpecMode::kDraft, SpecMode::kEagle})
    if (name == spec_mode_name(m)) return m;
  throw_error(ErrorCode::kInvalidArgument,
              "unknown spec mode '{}' (choose none, ngram, draft or eagle)", name);
}

void SpecConfig::validate() const {
  if (mode == SpecMode::kNone) return;
  PAGODA_REQUIRE(steps >= 1 && steps <= 64, kInvalidArgument,
                 "spec steps must be in [1, 64] (got {})", steps);
  PAGODA_REQUIRE(topk >= 1 && topk <= 16, kInvalidArgument, "spec topk must be in [1, 16] (got {})",
                 topk);
  PAGODA_REQUIRE(num_draft_tokens >= 2 && num_draft_tokens <= 256, kInvalidArgument,
                 "spec num_draft_tokens must be in [2, 256] (got {})", num_draft_tokens);
  PAGODA_REQUIRE(std::isfinite(min_accepted) && min_accepted >= 0.0, kInvalidArgument,
                 "spec min_accepted must be finite and >= 0 (got {})", min_accepted);
  PAGODA_REQUIRE(backoff_steps >= 1, kInvalidArgument, "spec backoff_steps must be >= 1 (got {})",
                 backoff_steps);
  PAGODA_REQUIRE(graph_tokens >= 0, kInvalidArgument, "spec graph_tokens must be >= 0 (got {})",
                 graph_tokens);
  PAGODA_REQUIRE(mode != SpecMode::kEagle || eagle_head != nullptr, kInvalidArgument,
                 "spec mode eagle needs an EAGLE head (spec eagle_head, --draft-model DIR)");
  ngram.validate();
}

int32_t SpecConfig::worker_graph_tokens(int32_t max_running) const {
  // kEagle: every target forward asks for hidden states and runs eagerly (no graphs to size).
  if (mode == SpecMode::kNone || mode == SpecMode::kEagle || graph_tokens <= 0) return 0;
  const int64_t tree = std::max(num_draft_tokens, spec::TreeBuilder::max_beam_nodes(topk, steps));
  return static_cast<int32_t>(std::min<int64_t>(graph_tokens, int64_t{max_running} * tree));
}

namespace {

/// Salt of the verify-sampling random stream (distinct from the worker's sampling stream).
constexpr uint64_t kSpecSalt = 0x5bd1e9955bd1e995ull;
/// Random draws reserved per emitted token index (a round draws at most tree size + depth).
constexpr int64_t kDrawsPerToken = 1024;

/// The kTargetVerify batch of `trees` (one per request, all of one size n) forwarding nodes
/// first..n−1: node i of request b at row position lens[b] + i (slot node_slots[b * (n − first)
/// + i − first]) and RoPE position lens[b] + depth(i). Nodes before `first` are not forwarded:
/// their K/V is already at row positions lens[b] .. lens[b] + first − 1 (a drafter's earlier
/// steps), and the mask lets each forwarded node see its ancestors among them.
model::WorkerBatch tree_batch(const std::vector<Req*>& reqs,
                              const std::vector<spec::DraftTree>& trees,
                              std::span<const int32_t> lens, std::span<const SlotIndex> node_slots,
                              const SpecConfig& sc, int32_t first = 0) {
  model::WorkerBatch b;
  attention::ForwardBatch& f = b.forward;
  const int32_t n = trees.front().size();
  const int32_t m = n - first;
  PAGODA_CHECK(first >= 0 && m >= 1);
  f.mode = ForwardMode::kTargetVerify;
  f.batch_size = static_cast<int>(reqs.size());
  f.spec.topk = sc.topk;
  f.spec.num_steps = sc.steps;
  f.spec.num_draft_tokens = m;
  f.out_cache_loc.assign(node_slots.begin(), node_slots.end());
  PAGODA_CHECK_EQ(f.out_cache_loc.size(), reqs.size() * static_cast<size_t>(m));
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Req& r = *reqs[i];
    const spec::DraftTree& t = trees[i];
    PAGODA_CHECK_EQ(t.size(), n);
    const int32_t len = lens[i];
    f.req_pool_indices.push_back(r.cache.req_slot.value());
    f.seq_lens.push_back(len + first);
    f.extend_prefix_lens.push_back(len + first);
    f.extend_seq_lens.push_back(m);
    const std::vector<int32_t> depth = t.depths();
    for (int32_t j = first; j < n; ++j) f.positions.push_back(len + depth[static_cast<size_t>(j)]);
    b.input_ids.insert(b.input_ids.end(), t.tokens.begin() + first, t.tokens.end());
    spec::append_verify_mask(t, len, f.spec.tree_mask, first);
    b.sample_step.push_back(r.num_output());
  }
  return b;
}

/// The slots of draft nodes first..n−1 of every request ([b * extra + first, b * extra + n) of
/// `slots`).
std::vector<SlotIndex> tree_slots(size_t nreq, std::span<const SlotIndex> slots, int32_t extra,
                                  int32_t n, int32_t first = 0) {
  std::vector<SlotIndex> out;
  out.reserve(nreq * static_cast<size_t>(n - first));
  for (size_t b = 0; b < nreq; ++b) {
    const auto mine = slots.subspan(b * static_cast<size_t>(extra) + static_cast<size_t>(first),
                                    static_cast<size_t>(n - first));
    out.insert(out.end(), mine.begin(), mine.end());
  }
  return out;
}

std::vector<int32_t> kv_lens(const std::vector<Req*>& reqs) {
  std::vector<int32_t> lens;
  for (const Req* r : reqs) lens.push_back(static_cast<int32_t>(r->kv_len));
  return lens;
}

/// A greedy decode batch: request i computes token ids[i] at position prefix[i] into slot
/// slots[i] (already in its req→token row), one logit row each.
model::WorkerBatch one_token_batch(const std::vector<Req*>& reqs, std::vector<int32_t> ids,
                                   std::span<const int32_t> prefix,
                                   std::span<const SlotIndex> slots) {
  const size_t n = reqs.size();
  model::WorkerBatch db;
  db.input_ids = std::move(ids);
  model::StepInput in{.mode = ForwardMode::kDecode,
                      .seqs = {},
                      .out_cache_loc = std::vector<int32_t>(slots.begin(), slots.end())};
  for (size_t i = 0; i < n; ++i) {
    in.seqs.push_back(model::StepSequence{.req_slot = reqs[i]->cache.req_slot.value(),
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

/// Runs `steps` draft forwards on the draft worker and returns the verify trees (SGLang's EAGLE
/// construction, spec::TreeBuilder). Step 0 forwards the root; step s >= 1 only the beam's
/// frontier (topk nodes), whose ancestors' K/V the earlier steps left at the draft slots in the
/// request's row (beam nodes keep their indices, so node j stays at slot j).
std::vector<spec::DraftTree> draft_trees(model::ModelWorker& worker, const std::vector<Req*>& reqs,
                                         std::span<const SlotIndex> slots, int32_t extra,
                                         const SpecConfig& sc, int64_t vocab) {
  std::vector<spec::TreeBuilder> builders;
  for (const Req* r : reqs) builders.emplace_back(r->cache.tokens.back(), sc.topk, sc.steps);
  std::vector<spec::DraftTree> beams(reqs.size());
  std::vector<spec::Candidate> children;
  const std::vector<int32_t> lens = kv_lens(reqs);
  while (!builders.front().done()) {
    for (size_t b = 0; b < reqs.size(); ++b) beams[b] = builders[b].beam_tree();
    const int32_t n = beams.front().size();
    const int32_t nf = builders.front().frontier_size();
    model::WorkerBatch batch = tree_batch(
        reqs, beams, lens, tree_slots(reqs.size(), slots, extra, n, n - nf), sc, n - nf);
    batch.logit_rows.assign(reqs.size(), nf);
    batch.sampling.assign(reqs.size(), model::SamplingParams{});  // greedy: argmax rows
    batch.top_k = sc.topk > 1 ? sc.topk : 0;  // device top-k, or whole rows where there is none
    const model::WorkerOutput o = worker.run(batch);
    const auto k = static_cast<size_t>(sc.topk);
    for (size_t b = 0; b < reqs.size(); ++b) {
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
/// K/V the previous round left pending — Req::draft_kv_pending — or rewrites the same K/V, so
/// every request has the same shape and the batch replays one verify graph); step s ≥ 1 is a
/// decode batch of node s at position kv_len + s (slot s of the request's draft slots, already in
/// its row), which replays the draft worker's decode graph. The chain is the one TreeBuilder
/// builds for topk 1 (same expansion, same finish), so the trees equal draft_trees'.
std::vector<spec::DraftTree> draft_chain(model::ModelWorker& worker, const std::vector<Req*>& reqs,
                                         const kv::ReqToTokenTable& table,
                                         std::span<const SlotIndex> slots, int32_t extra,
                                         const SpecConfig& sc) {
  const size_t nreq = reqs.size();
  std::vector<spec::TreeBuilder> builders;
  for (const Req* r : reqs) builders.emplace_back(r->cache.tokens.back(), 1, sc.steps);
  std::vector<spec::Candidate> child(1);
  auto expand = [&](const model::WorkerOutput& o) {
    for (size_t b = 0; b < nreq; ++b) {
      child[0] = spec::Candidate{o.tokens[b], 0.f};
      builders[b].expand(child);
    }
  };
  {  // step 0: [token at kv_len − 1, root]
    std::vector<spec::DraftTree> pairs(nreq);
    std::vector<int32_t> lens;
    std::vector<SlotIndex> node_slots;
    for (size_t b = 0; b < nreq; ++b) {
      Req& r = *reqs[b];
      PAGODA_CHECK(r.kv_len >= 1);
      const auto prev = static_cast<size_t>(r.kv_len - 1);
      pairs[b].tokens = {r.cache.tokens[prev], r.cache.tokens.back()};
      pairs[b].parents = {-1, 0};
      lens.push_back(static_cast<int32_t>(r.kv_len - 1));
      node_slots.push_back(table.read(r.cache.req_slot, r.kv_len - 1, 1)[0]);
      node_slots.push_back(slots[b * static_cast<size_t>(extra)]);
    }
    model::WorkerBatch batch = tree_batch(reqs, pairs, lens, node_slots, sc);
    batch.logit_rows.assign(nreq, 1);
    batch.sampling.assign(nreq, model::SamplingParams{});
    expand(worker.run(batch));
    for (Req* r : reqs) r->draft_kv_pending = false;
  }
  std::vector<int32_t> ids(nreq), prefix(nreq);
  std::vector<SlotIndex> node_slots(nreq);
  for (int32_t s = 1; !builders.front().done(); ++s) {
    for (size_t b = 0; b < nreq; ++b) {
      ids[b] = builders[b].beam_tree().tokens.back();
      prefix[b] = static_cast<int32_t>(reqs[b]->kv_len + s);
      node_slots[b] = slots[b * static_cast<size_t>(extra) + static_cast<size_t>(s)];
    }
    expand(worker.run(one_token_batch(reqs, ids, prefix, node_slots)));
  }
  std::vector<spec::DraftTree> trees;
  for (const auto& b : builders) trees.push_back(b.finish(sc.num_draft_tokens));
  return trees;
}

/// A round's trees are at most `steps` deep; every sliding window must reach back past them
/// (a tree row's window then starts in the cached prefix: the CUDA kernels' rule, exact there,
/// docs/design/spec.md §3; the host backends would be exact anyway).
void require_window_covers_trees(const model::ModelConfig& c, int steps, const char* which) {
  for (int l = 0; l < c.num_layers; ++l) {
    PAGODA_REQUIRE(c.window_of(l) < 0 || c.window_of(l) >= steps, kInvalidArgument,
                   "spec steps {} exceed the sliding window {} of the {} model's layer {}", steps,
                   c.window_of(l), which, l);
  }
}

}  // namespace

void Engine::init_spec(DType dtype, int32_t num_pages) {
  const SpecConfig& sc = config_.spec;
  ngram_ = spec::NgramDrafter(sc.ngram);
  spec_pause_len_ = sc.backoff_steps;
  PAGODA_REQUIRE(sc.mode == SpecMode::kNone || sc.topk <= model_->config().vocab_size,
                 kInvalidArgument, "spec topk {} exceeds the vocabulary of {}", sc.topk,
                 model_->config().vocab_size);
  if (sc.mode != SpecMode::kNone) require_window_covers_trees(model_->config(), sc.steps, "target");
  if (sc.mode == SpecMode::kEagle) init_eagle(dtype, num_pages);
  if (sc.mode != SpecMode::kDraft) return;
  const model::LlamaModel& draft = sc.draft_model != nullptr ? *sc.draft_model : *model_;
  PAGODA_REQUIRE(draft.config().vocab_size == model_->config().vocab_size, kInvalidArgument,
                 "draft model vocabulary {} differs from the target's {}",
                 draft.config().vocab_size, model_->config().vocab_size);
  require_window_covers_trees(draft.config(), sc.steps, "draft");
  // Same page size, pages and req→token table: a slot names the same token in both pools.
  draft_worker_ = std::make_unique<model::LlamaWorker>(
      draft, make_model_ops(*platform_, dtype),
      model::WorkerConfig{.page_size = config_.page_size,
                          .num_pages = num_pages,
                          .kv_dtype = config_.kv_dtype.value_or(dtype),
                          .backend = config_.backend,
                          .mixed_batches = config_.scheduler.mixed_batches,
                          .cuda_graph = config_.cuda_graph,
                          .max_batch_size = config_.scheduler.max_running_requests,
                          .verify_graph_tokens =
                              sc.worker_graph_tokens(config_.scheduler.max_running_requests)},
      *table_);
}

bool Engine::spec_ready() {
  if (config_.spec.mode == SpecMode::kNone || logits_observer_ || scheduler_->wants_prefill() ||
      scheduler_->running().empty())
    return false;
  if (spec_pause_ > 0) {
    --spec_pause_;
    return false;
  }
  return true;
}

void Engine::flush_draft_kv(const std::vector<Req*>& reqs) {
  if (draft_worker_ == nullptr) return;
  std::vector<Req*> todo;
  std::vector<int32_t> ids, prefix;
  std::vector<SlotIndex> slots;
  for (Req* r : reqs) {
    if (!r->draft_kv_pending || r->kv_len < 1) continue;
    r->draft_kv_pending = false;
    todo.push_back(r);
    ids.push_back(r->cache.tokens[static_cast<size_t>(r->kv_len - 1)]);
    prefix.push_back(static_cast<int32_t>(r->kv_len - 1));
    slots.push_back(table_->read(r->cache.req_slot, r->kv_len - 1, 1)[0]);
  }
  if (!todo.empty()) draft_worker_->run(one_token_batch(todo, std::move(ids), prefix, slots));
}

void Engine::draft_extend(const std::vector<Req*>& reqs, const std::vector<int64_t>& old_len,
                          const std::vector<std::vector<int32_t>>& kv_nodes,
                          std::span<const SlotIndex> slots, int32_t extra) {
  // The draft pool must hold the draft model's K/V of every kept token at its final slot. A tree
  // (topk > 1) was forwarded at tree slots, and the kept path moved, so every kept token is
  // extended (topk-1 chains skip this: spec_step / draft_chain).
  model::StepInput in{.mode = ForwardMode::kExtend, .seqs = {}, .out_cache_loc = {}};
  model::WorkerBatch db;
  for (size_t b = 0; b < reqs.size(); ++b) {
    const Req& r = *reqs[b];
    const int64_t keep = static_cast<int64_t>(kv_nodes[b].size());
    if (keep == 0) continue;
    const size_t begin = static_cast<size_t>(old_len[b]);
    in.seqs.push_back(model::StepSequence{
        .req_slot = r.cache.req_slot.value(),
        .prefix_len = static_cast<int32_t>(begin),
        .tokens = std::span<const int32_t>(r.cache.tokens)
                      .subspan(begin, static_cast<size_t>(keep)),
        .want_logits = true});
    const auto mine =
        slots.subspan(b * static_cast<size_t>(extra), static_cast<size_t>(keep));
    in.out_cache_loc.insert(in.out_cache_loc.end(), mine.begin(), mine.end());
    db.input_ids.insert(db.input_ids.end(), in.seqs.back().tokens.begin(),
                        in.seqs.back().tokens.end());
  }
  if (in.seqs.empty()) return;
  const size_t n = in.seqs.size();
  // One token per request (only the root kept): a decode batch, which replays the draft worker's
  // decode graph instead of an eager extend forward.
  if (in.out_cache_loc.size() == n) in.mode = ForwardMode::kDecode;
  db.forward = model::build_forward_batch(in);
  db.logit_rows.assign(n, 1);
  db.sampling.assign(n, model::SamplingParams{});
  db.sample_step.assign(n, 0);
  draft_worker_->run(db);
}

bool Engine::spec_step(StepOutput& out) {
  const SpecConfig& sc = config_.spec;
  const std::vector<Req*> reqs = scheduler_->running();
  const size_t bs = reqs.size();
  const int64_t vocab = model_->config().vocab_size;
  std::vector<spec::DraftTree> trees;
  int32_t extra = 0;
  if (sc.mode == SpecMode::kNgram) {
    int32_t size = 1;
    for (const Req* r : reqs) {
      trees.push_back(ngram_.propose(r->cache.tokens, sc.topk, sc.steps, sc.num_draft_tokens));
      size = std::max(size, trees.back().size());
    }
    if (size == 1) return false;  // nothing to verify: a plain decode step is cheaper
    for (auto& t : trees) spec::pad_tree(t, size);
    extra = size;
  } else {
    const int32_t candidates = 1 + sc.topk + (sc.steps - 1) * sc.topk * sc.topk;
    extra = std::max(std::min(sc.num_draft_tokens, candidates),
                     spec::TreeBuilder::max_beam_nodes(sc.topk, sc.steps));
  }
  // Does the round fit: the rows (context) and the pool (evicting the tree if needed)?
  std::vector<spec::SpecSeqKv> seqs;
  const int64_t page = config_.page_size;
  int64_t need = 0;
  for (const Req* r : reqs) {
    if (r->kv_len + extra > max_context_len_) return false;
    seqs.push_back(spec::SpecSeqKv{r->cache.req_slot, static_cast<int32_t>(r->kv_len)});
    need += ((r->kv_len + extra + page - 1) / page - (r->kv_len + page - 1) / page) * page;
  }
  if (!scheduler_->reserve_tokens(need)) return false;  // the normal step retracts if it must
  const kv::AllocatorState backup = allocator_->backup_state();
  const auto slots = spec::alloc_draft_slots(*allocator_, *table_, seqs, extra);
  if (!slots) return false;

  std::vector<spec::AcceptResult> accepts(bs);
  int32_t tree_size = 0;
  std::vector<float> verify_hidden;  // kEagle: the target's features of every tree node
  try {
    const double t_draft = now();
    if (sc.mode == SpecMode::kDraft) {
      auto replays = [&] {
        const model::WorkerStats w = draft_worker_->stats();
        return std::array<int64_t, 2>{w.steps, w.graph_steps + w.spec_graph_steps};
      };
      const auto before = replays();
      trees = sc.topk == 1 ? draft_chain(*draft_worker_, reqs, *table_, *slots, extra, sc)
                           : draft_trees(*draft_worker_, reqs, *slots, extra, sc, vocab);
      const auto after = replays();
      stats_.draft_forwards += after[0] - before[0];
      stats_.draft_graph_steps += after[1] - before[1];
    }
    if (sc.mode == SpecMode::kEagle) trees = eagle_trees(reqs, *slots, extra);
    stats_.spec_time.draft_s += now() - t_draft;
    tree_size = trees.front().size();
    model::WorkerBatch vb = tree_batch(reqs, trees, kv_lens(reqs),
                                       tree_slots(bs, *slots, extra, tree_size), sc);
    vb.logit_rows.assign(bs, tree_size);
    if (eagle_ != nullptr) vb.hidden_layers = eagle_feature_layers();
    for (const Req* r : reqs) {
      vb.sampling.push_back(r->sampling);
      vb.return_logits = vb.return_logits || !r->sampling.is_greedy();
    }
    const double t_verify = now();
    model::WorkerOutput o = worker_->run(vb);
    verify_hidden = std::move(o.hidden);
    const double t_accept = now();
    stats_.spec_time.verify_s += t_accept - t_verify;
    std::vector<double> probs;
    for (size_t b = 0; b < bs; ++b) {
      const Req& r = *reqs[b];
      const size_t row0 = b * static_cast<size_t>(tree_size);
      if (r.sampling.is_greedy()) {
        accepts[b] = spec::greedy_accept(
            trees[b], std::span<const int32_t>(o.tokens).subspan(row0, tree_size));
        continue;
      }
      const model::SampleRow params{.temperature = r.sampling.temperature,
                                    .top_k = r.sampling.top_k,
                                    .top_p = r.sampling.top_p,
                                    .min_p = r.sampling.min_p,
                                    .seed = r.sampling.seed,
                                    .step = 0};
      int64_t draw = int64_t{r.num_output()} * kDrawsPerToken;
      accepts[b] = spec::sample_accept(
          trees[b],
          [&](int32_t node) {
            model::sampling_probs(
                std::span<const float>(o.logits).subspan(
                    (row0 + static_cast<size_t>(node)) * static_cast<size_t>(vocab),
                    static_cast<size_t>(vocab)),
                params, probs);
            return std::span<const double>(probs);
          },
          [&] { return model::counter_uniform(r.sampling.seed ^ kSpecSalt, draw++); });
    }
    stats_.spec_time.accept_s += now() - t_accept;
  } catch (...) {
    allocator_->restore_state(backup);  // the draft slots go back; the rows are unchanged below kv_len
    throw;
  }

  // Emit (stopping at a finish) and decide which K/V each request keeps.
  std::vector<std::vector<int32_t>> kv_nodes(bs);
  std::vector<int64_t> old_len(bs);
  std::vector<uint8_t> finished(bs, 0);
  const double t = now();
  int64_t accepted_round = 0;
  for (size_t b = 0; b < bs; ++b) {
    Req* r = reqs[b];
    const spec::AcceptResult& a = accepts[b];
    old_len[b] = r->kv_len;
    for (size_t j = 0; j < a.tokens.size(); ++j) {
      kv_nodes[b].push_back(j == 0 ? 0 : a.nodes[j - 1]);
      const int32_t token = a.tokens[j];
      r->cache.tokens.push_back(token);
      ++stats_.generated_tokens;
      if (r->out.first_token_s < 0) r->out.first_token_s = t;
      out.tokens.emplace_back(r->id, token);
      if (check_finished(*r, token)) {
        finished[b] = 1;
        break;
      }
    }
    accepted_round += static_cast<int64_t>(a.nodes.size());
    stats_.spec.draft_tokens += tree_size - 1;
    stats_.spec.accepted += static_cast<int64_t>(a.nodes.size());
    stats_.spec.emitted += static_cast<int64_t>(kv_nodes[b].size());
  }
  const spec::KvMoves moves =
      spec::commit_draft_slots(*allocator_, seqs, *slots, extra, kv_nodes);
  worker_->move_kv(moves.src, moves.dst);
  for (size_t b = 0; b < bs; ++b)
    scheduler_->complete_spec(reqs[b], static_cast<int64_t>(kv_nodes[b].size()));
  const double t_extend = now();
  stats_.spec_time.commit_s += t_extend - t;
  if (draft_worker_ != nullptr && sc.topk == 1) {
    // A chain's nodes 0 .. steps − 1 were forwarded at the slots they keep; a longer kept chain
    // leaves its last token to the next round's first draft forward (draft_chain), unless the
    // request finishes now (its tokens reach the prefix cache: write them first).
    std::vector<Req*> done;
    for (size_t b = 0; b < bs; ++b) {
      reqs[b]->draft_kv_pending = static_cast<int64_t>(kv_nodes[b].size()) > sc.steps;
      if (finished[b] != 0) done.push_back(reqs[b]);
    }
    flush_draft_kv(done);
  } else if (draft_worker_ != nullptr) {
    draft_extend(reqs, old_len, kv_nodes, *slots, extra);
  }
  if (eagle_ != nullptr)
    eagle_extend(reqs, old_len, kv_nodes, *slots, extra, verify_hidden, tree_size);
  stats_.spec_time.extend_s += now() - t_extend;
  for (size_t b = 0; b < bs; ++b) {
    if (!finished[b]) continue;
    scheduler_->finish(reqs[b]);
    reqs[b]->out.finish_s = t;
    out.finished.push_back(reqs[b]->id);
  }
  out.mode = ForwardMode::kTargetVerify;
  out.num_seqs = static_cast<int32_t>(bs);
  out.num_tokens = static_cast<int64_t>(bs) * tree_size;
  ++stats_.steps;
  ++stats_.spec_steps;
  ++stats_.spec.rounds;
  stats_.spec.verified += static_cast<int64_t>(bs);
  stats_.computed_tokens += out.num_tokens;
  // Switch-off: pause speculation while it does not pay.
  const double acc = static_cast<double>(accepted_round) / static_cast<double>(bs);
  spec_mean_accepted_ = 0.5 * spec_mean_accepted_ + 0.5 * acc;
  if (spec_mean_accepted_ < sc.min_accepted) {
    spec_pause_ = spec_pause_len_;
    spec_pause_len_ = std::min(2 * spec_pause_len_, 512);
    spec_mean_accepted_ = sc.min_accepted;
  } else if (acc >= sc.min_accepted) {
    spec_pause_len_ = sc.backoff_steps;
  }
  if (config_.check_integrity) check_integrity();
  return true;
}

}  // namespace pagoda::engine
