// SpecWorker (spec_worker.h): the speculative round — draft (n-gram, draft model or EAGLE head)
// → one kTargetVerify forward of every sequence's tree → accept → commit the KV → emit — and the
// plain steps the drafter follows. Also SpecConfig's parsing and validation.
#include "pagoda/engine/spec_worker.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"
#include "pagoda/engine/spec_batch.h"
#include "pagoda/kv/state_pool.h"
#include "pagoda/model/host_sampling.h"
#include "pagoda/spec/spec_kv.h"
#include "pagoda/spec/tree_builder.h"

namespace pagoda::engine {

using attention::ForwardMode;

namespace {

/// A hybrid target's state slots for one round's draft nodes (Mamba2Seq::node_slots), given back
/// when the round ends whatever happens (a freed slot is zeroed).
class NodeStates {
 public:
  explicit NodeStates(kv::StatePool* pool) : pool_(pool) {}
  ~NodeStates() {
    for (int32_t slot : slots_) pool_->free(slot);
  }
  NodeStates(const NodeStates&) = delete;
  NodeStates& operator=(const NodeStates&) = delete;
  /// Takes n free slots (none without a pool); false when the pool has fewer free.
  bool take(size_t n) {
    if (pool_ == nullptr) return true;
    if (static_cast<size_t>(pool_->num_free()) < n) return false;
    while (slots_.size() < n) slots_.push_back(pool_->alloc());
    return true;
  }
  const std::vector<int32_t>& slots() const { return slots_; }
  kv::StatePool* pool() const { return pool_; }

 private:
  kv::StatePool* pool_;
  std::vector<int32_t> slots_;
};

}  // namespace

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

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

SpecWorker::SpecWorker(std::unique_ptr<model::ModelWorker> target, const model::LlamaModel& model,
                       const SpecConfig& config, const model::WorkerConfig& worker,
                       const std::function<std::unique_ptr<model::ModelOps>()>& make_ops,
                       SpecMemory memory)
    : target_(std::move(target)),
      model_(&model),
      config_(config),
      memory_(std::move(memory)),
      ngram_(config.ngram),
      pause_len_(config.backoff_steps) {
  PAGODA_REQUIRE(config.mode != SpecMode::kNone, kInvalidArgument,
                 "a SpecWorker needs a speculative mode (got none)");
  PAGODA_CHECK(target_ != nullptr && memory_.allocator != nullptr && memory_.table != nullptr &&
               memory_.reserve_tokens);
  PAGODA_REQUIRE(config.topk <= model.config().vocab_size, kInvalidArgument,
                 "spec topk {} exceeds the vocabulary of {}", config.topk,
                 model.config().vocab_size);
  spec_batch::require_window_covers_trees(model.config(), config.steps, "target");
  if (config.mode == SpecMode::kEagle) init_eagle(worker, make_ops);
  if (config.mode == SpecMode::kDraft) init_draft(worker, make_ops);
}

SpecWorker::~SpecWorker() = default;

model::WorkerOutput SpecWorker::run(const model::WorkerBatch& batch) {
  model::WorkerOutput out;
  if (may_speculate(batch) && round(batch, out)) return out;
  return run_plain(batch);
}

bool SpecWorker::may_speculate(const model::WorkerBatch& batch) {
  const size_t bs = static_cast<size_t>(batch.batch_size());
  if (!batch.allow_multi_token || batch.forward.mode != ForwardMode::kDecode || bs == 0 ||
      batch.context.size() != bs || batch.max_emit.size() != bs || batch.stop_token.size() != bs)
    return false;
  if (pause_ > 0) {
    --pause_;
    return false;
  }
  return true;
}

model::WorkerOutput SpecWorker::run_plain(const model::WorkerBatch& batch) {
  if (draft_ != nullptr) flush_before_plain(batch);
  const double t0 = now_s();
  model::WorkerOutput result;
  if (eagle_ != nullptr) {  // the head is fed the target's features of every step
    model::WorkerBatch b = batch;
    b.hidden_layers = eagle_->head().feature_layers();
    result = target_->run(b);
  } else {
    result = target_->run(batch);
  }
  if (draft_ != nullptr) draft_->run(batch);  // the draft's KV follows every step
  stats_.time.plain_forward_s += now_s() - t0;
  if (eagle_ != nullptr) eagle_after_step(batch, result);  // so does the EAGLE head's
  return result;
}

bool SpecWorker::round(const model::WorkerBatch& batch, model::WorkerOutput& out) {
  const SpecConfig& sc = config_;
  const attention::ForwardBatch& f = batch.forward;
  const size_t bs = static_cast<size_t>(f.batch_size);
  const int64_t vocab = model_->config().vocab_size;
  std::vector<Seq> seqs(bs);
  for (size_t b = 0; b < bs; ++b) {
    seqs[b] = Seq{.row = ReqSlot{f.req_pool_indices[b]},
                  .kv_len = f.seq_lens[b] - 1,
                  .context = batch.context[b],
                  .sampling = batch.sampling[b],
                  .sample_step = batch.sample_step[b],
                  .max_emit = batch.max_emit[b],
                  .stop_token = batch.stop_token[b]};
    PAGODA_CHECK(seqs[b].context.size() == static_cast<size_t>(seqs[b].kv_len) + 1 &&
                 seqs[b].context.back() == batch.input_ids[b]);
  }
  std::vector<spec::DraftTree> trees;
  int32_t extra = 0;
  if (sc.mode == SpecMode::kNgram) {
    int32_t size = 1;
    for (const Seq& s : seqs) {
      trees.push_back(ngram_.propose(s.context, sc.topk, sc.steps, sc.num_draft_tokens));
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
  // A hybrid target's verify writes every node's Mamba2 state to a slot of its own (the
  // requests' states stay until the round keeps its last accepted node's): none free, no round.
  NodeStates node_states(target_->state_pool());
  if (!node_states.take(bs * static_cast<size_t>(extra))) return false;
  // Does the round fit: the rows (context) and the pool (evicting the tree if needed)? The
  // root's slot (position kv_len) is the batch's; the other extra − 1 follow it.
  kv::PageAllocator& allocator = *memory_.allocator;
  kv::ReqToTokenTable& table = *memory_.table;
  std::vector<spec::SpecSeqKv> kv, after_root;
  const int64_t page = allocator.page_size();
  int64_t need = 0;
  for (const Seq& s : seqs) {
    if (s.kv_len + extra > table.max_context_len()) return false;
    kv.push_back(spec::SpecSeqKv{s.row, s.kv_len});
    after_root.push_back(spec::SpecSeqKv{s.row, s.kv_len + 1});
    need += ((s.kv_len + extra + page - 1) / page - (s.kv_len + 1 + page - 1) / page) * page;
  }
  if (!memory_.reserve_tokens(need)) return false;  // a plain decode step instead
  const kv::AllocatorState backup = allocator.backup_state();
  const auto more = spec::alloc_draft_slots(allocator, table, after_root, extra - 1);
  if (!more) return false;
  std::vector<SlotIndex> slots;  // [bs * extra]: the root's, then the draft slots
  slots.reserve(bs * static_cast<size_t>(extra));
  for (size_t b = 0; b < bs; ++b) {
    slots.push_back(f.out_cache_loc[b]);
    const auto mine = std::span<const SlotIndex>(*more).subspan(
        b * static_cast<size_t>(extra - 1), static_cast<size_t>(extra - 1));
    slots.insert(slots.end(), mine.begin(), mine.end());
  }

  std::vector<spec::AcceptResult> accepts(bs);
  int32_t tree_size = 0;
  std::vector<float> verify_hidden;  // kEagle: the target's features of every tree node
  try {
    const double t_draft = now_s();
    if (sc.mode == SpecMode::kDraft) trees = draft_model_trees(seqs, slots, extra);
    if (sc.mode == SpecMode::kEagle) trees = eagle_trees(seqs, slots, extra);
    stats_.time.draft_s += now_s() - t_draft;
    tree_size = trees.front().size();
    model::WorkerBatch vb =
        spec_batch::tree_batch(seqs, trees, spec_batch::kv_lens(seqs),
                               spec_batch::tree_slots(bs, slots, extra, tree_size), sc);
    vb.logit_rows.assign(bs, tree_size);
    if (eagle_ != nullptr) vb.hidden_layers = eagle_->head().feature_layers();
    if (node_states.pool() != nullptr) {
      vb.state_slots = batch.state_slots;
      vb.state_node_slots.assign(node_states.slots().begin(),
                                 node_states.slots().begin() +
                                     static_cast<int64_t>(bs) * tree_size);
      for (const spec::DraftTree& tree : trees)
        vb.state_node_parents.insert(vb.state_node_parents.end(), tree.parents.begin(),
                                     tree.parents.end());
    }
    for (const Seq& s : seqs) {
      vb.sampling.push_back(s.sampling);
      vb.return_logits = vb.return_logits || !s.sampling.is_greedy();
    }
    const double t_verify = now_s();
    model::WorkerOutput o = target_->run(vb);
    verify_hidden = std::move(o.hidden);
    const double t_accept = now_s();
    stats_.time.verify_s += t_accept - t_verify;
    std::vector<double> probs;
    for (size_t b = 0; b < bs; ++b) {
      const Seq& s = seqs[b];
      const size_t row0 = b * static_cast<size_t>(tree_size);
      if (s.sampling.is_greedy()) {
        accepts[b] = spec::greedy_accept(
            trees[b], std::span<const int32_t>(o.tokens).subspan(row0, tree_size));
        continue;
      }
      const model::SampleRow params{.temperature = s.sampling.temperature,
                                    .top_k = s.sampling.top_k,
                                    .top_p = s.sampling.top_p,
                                    .min_p = s.sampling.min_p,
                                    .seed = s.sampling.seed,
                                    .step = 0};
      int64_t draw = s.sample_step * kDrawsPerToken;
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
          [&] { return model::counter_uniform(s.sampling.seed ^ kSpecSalt, draw++); });
    }
    stats_.time.accept_s += now_s() - t_accept;
  } catch (...) {
    allocator.restore_state(backup);  // the draft slots go back; the rows are unchanged below kv_len
    throw;
  }

  // Emit (stopping where a sequence finishes) and decide which K/V each sequence keeps.
  std::vector<std::vector<int32_t>> kv_nodes(bs), tails(bs);  // tails: the root, then emitted
  std::vector<uint8_t> finished(bs, 0);
  const double t = now_s();
  int64_t accepted_round = 0;
  spec::AcceptStats& st = stats_.accept;
  for (size_t b = 0; b < bs; ++b) {
    const Seq& s = seqs[b];
    const spec::AcceptResult& a = accepts[b];
    tails[b].push_back(s.context.back());
    for (size_t j = 0; j < a.tokens.size(); ++j) {
      kv_nodes[b].push_back(j == 0 ? 0 : a.nodes[j - 1]);
      const int32_t token = a.tokens[j];
      out.tokens.push_back(token);
      tails[b].push_back(token);
      if (token == s.stop_token || static_cast<int32_t>(j) + 1 >= s.max_emit) {
        finished[b] = 1;
        break;
      }
    }
    out.counts.push_back(static_cast<int32_t>(kv_nodes[b].size()));
    accepted_round += static_cast<int64_t>(a.nodes.size());
    st.draft_tokens += tree_size - 1;
    st.accepted += static_cast<int64_t>(a.nodes.size());
    st.emitted += static_cast<int64_t>(kv_nodes[b].size());
  }
  if (node_states.pool() != nullptr)  // each request keeps its last kept node's state
    for (size_t b = 0; b < bs; ++b)
      node_states.pool()->copy_slot(
          node_states.slots()[b * static_cast<size_t>(tree_size) +
                              static_cast<size_t>(kv_nodes[b].back())],
          batch.state_slots[b]);
  const spec::KvMoves moves = spec::commit_draft_slots(allocator, kv, slots, extra, kv_nodes);
  target_->move_kv(moves.src, moves.dst);
  const double t_extend = now_s();
  stats_.time.commit_s += t_extend - t;
  if (draft_ != nullptr) draft_after_round(seqs, kv_nodes, tails, slots, extra, finished);
  if (eagle_ != nullptr) eagle_extend(seqs, kv_nodes, tails, slots, extra, verify_hidden, tree_size);
  stats_.time.extend_s += now_s() - t_extend;
  out.mode = ForwardMode::kTargetVerify;
  out.num_tokens = static_cast<int64_t>(bs) * tree_size;
  ++st.rounds;
  st.verified += static_cast<int64_t>(bs);
  update_pause(static_cast<double>(accepted_round) / static_cast<double>(bs));
  return true;
}

void SpecWorker::update_pause(double acc) {
  // Switch-off: pause speculation while it does not pay.
  const SpecConfig& sc = config_;
  mean_accepted_ = 0.5 * mean_accepted_ + 0.5 * acc;
  if (mean_accepted_ < sc.min_accepted) {
    pause_ = pause_len_;
    pause_len_ = std::min(2 * pause_len_, 512);
    mean_accepted_ = sc.min_accepted;
  } else if (acc >= sc.min_accepted) {
    pause_len_ = sc.backoff_steps;
  }
}

}  // namespace pagoda::engine
