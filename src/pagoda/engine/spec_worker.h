#pragma once
/// SpecWorker: speculative decoding as a ModelWorker (ARCHITECTURE §1; docs/design/spec.md).
///
/// It wraps the target worker (a LlamaWorker, or tensor parallelism's TpLeaderWorker: verify
/// batches and K/V moves then reach every rank) and a drafter: n-gram (spec::NgramDrafter), a
/// draft model (its own LlamaWorker, whole on the engine's platform) or an EAGLE head
/// (model::EagleRunner). It owns the draft state: the drafter's K/V pool (same page size, pages
/// and req→token table as the target, so a slot names the same position in every pool), the
/// topk-1 chains' pending draft K/V and the EAGLE state of each request row.
///
/// run(batch):
///   * a kDecode batch with WorkerBatch::allow_multi_token, outside a switch-off pause, becomes
///     one speculative round when it pays and fits: draft trees → draft slots after each root
///     (the root's slot is the batch's; SpecMemory allocates the rest, rolled back on error) →
///     one kTargetVerify forward of the target → accept (greedy walk or exact sampling) →
///     commit (K/V moves, the pages past the kept tokens freed) → the drafter's follow-up. The
///     output holds each sequence's emitted tokens (WorkerOutput::counts; emission stops at its
///     stop token or max_emit, and only emitted tokens keep K/V), mode kTargetVerify. The
///     caller then adds counts[b] to the request's kv_len.
///   * every other batch runs on the target unchanged; the drafter follows it (the draft model
///     runs the same batch, the EAGLE head extends the step's positions).
///
/// Thread rules: one thread (the engine's).

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "pagoda/engine/spec_config.h"
#include "pagoda/kv/page_allocator.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/model/eagle_runner.h"
#include "pagoda/model/llama.h"
#include "pagoda/model/llama_worker.h"
#include "pagoda/model/worker.h"
#include "pagoda/spec/draft_tree.h"
#include "pagoda/spec/ngram.h"
#include "pagoda/spec/verify.h"

namespace pagoda::engine {

/// Wall time of the speculative rounds by phase, seconds (each forward waits for its ids, so a
/// phase's time includes its device time); plain_forward_s is the plain steps' worker time
/// (target + draft worker), to compare a round against.
struct SpecTimes {
  double draft_s = 0;    ///< draft forwards (draft model) or n-gram proposals
  double verify_s = 0;   ///< the target's verify forward
  double accept_s = 0;   ///< acceptance walk / rejection sampling on the host
  double commit_s = 0;   ///< commit_draft_slots, move_kv (enqueued)
  double extend_s = 0;   ///< the drafter's follow-up (draft extend, EAGLE extend)
  double plain_forward_s = 0;
  /// Field-wise difference (the time of a window between two snapshots).
  SpecTimes& operator-=(const SpecTimes& o) {
    draft_s -= o.draft_s;
    verify_s -= o.verify_s;
    accept_s -= o.accept_s;
    commit_s -= o.commit_s;
    extend_s -= o.extend_s;
    plain_forward_s -= o.plain_forward_s;
    return *this;
  }
};

/// Counters of a SpecWorker (cumulative).
struct SpecStats {
  spec::AcceptStats accept;       ///< rounds (each one verify forward), drafted, accepted
  int64_t draft_forwards = 0;     ///< draft-model forwards of the rounds (draft steps)
  int64_t draft_graph_steps = 0;  ///< those served by a graph replay (verify or decode graph)
  SpecTimes time;
};

/// The memory a round needs beyond the batch's own slots (the engine's bookkeeping).
struct SpecMemory {
  kv::PageAllocator* allocator = nullptr;
  kv::ReqToTokenTable* table = nullptr;
  /// Frees `tokens` tokens (evicting the prefix cache); true when they are free.
  std::function<bool(int64_t)> reserve_tokens;
};

class SpecWorker final : public model::ModelWorker {
 public:
  /// `target` computes the target model `model`; a draft model or EAGLE head (config.mode) is
  /// built with `make_ops()` over `worker` (the target's worker settings) and `memory.table`.
  /// Throws Error(kInvalidArgument) for a topk above the vocabulary, steps beyond a sliding
  /// window of the target or draft model, a draft model of another vocabulary or an EAGLE head
  /// built for another target. `model`, the config's models and `memory` must outlive this.
  SpecWorker(std::unique_ptr<model::ModelWorker> target, const model::LlamaModel& model,
             const SpecConfig& config, const model::WorkerConfig& worker,
             const std::function<std::unique_ptr<model::ModelOps>()>& make_ops,
             SpecMemory memory);
  ~SpecWorker() override;
  SpecWorker(const SpecWorker&) = delete;
  SpecWorker& operator=(const SpecWorker&) = delete;

  model::WorkerOutput run(const model::WorkerBatch& batch) override;
  kv::KvPool& kv_pool() override { return target_->kv_pool(); }
  /// The target's (a hybrid target's rounds take a slot per draft node for the verify).
  kv::StatePool* state_pool() override { return target_->state_pool(); }
  void move_kv(std::span<const SlotIndex> src, std::span<const SlotIndex> dst) override {
    target_->move_kv(src, dst);
  }
  std::string backend_name() const override { return target_->backend_name(); }
  /// The target's counters.
  model::WorkerStats stats() const override { return target_->stats(); }
  const SpecStats& spec_stats() const { return stats_; }

  /// One sequence of a round (from the decode batch).
  struct Seq {
    ReqSlot row;
    int32_t kv_len = 0;                 ///< tokens with K/V (the root sits at kv_len)
    std::span<const int32_t> context;   ///< tokens [0, kv_len], the root last
    model::SamplingParams sampling;
    int64_t sample_step = 0;            ///< output tokens so far
    int32_t max_emit = 1;
    int32_t stop_token = -1;
  };

  /// The EAGLE head's output at a row's last KV position: its hidden state [H] and top-k
  /// next-token candidates (target ids, best first) — what the next round's first draft step
  /// expands. Set after every step that samples for the row.
  struct EagleState {
    std::vector<float> hidden;
    std::vector<std::pair<int32_t, float>> next;
  };

 private:
  /// The batch on the target, followed by the drafter.
  model::WorkerOutput run_plain(const model::WorkerBatch& batch);
  /// Whether this batch may speculate; counts a switch-off pause down.
  bool may_speculate(const model::WorkerBatch& batch);
  /// One round; false (nothing changed) when it does not pay or fit.
  bool round(const model::WorkerBatch& batch, model::WorkerOutput& out);
  /// Updates the switch-off from a round's accepted draft tokens per request.
  void update_pause(double accepted_per_request);

  // Draft model (spec_draft.cpp).
  void init_draft(const model::WorkerConfig& worker,
                  const std::function<std::unique_ptr<model::ModelOps>()>& make_ops);
  std::vector<spec::DraftTree> draft_model_trees(const std::vector<Seq>& seqs,
                                                 std::span<const SlotIndex> slots, int32_t extra);
  /// The draft model's K/V of the pending token (position kv_len − 1) of each `seqs` row that
  /// has one: one decode forward; clears the flags.
  void flush_draft_kv(const std::vector<Seq>& seqs);
  /// Before a plain batch: flushes the pending rows of its one-token sequences (the others
  /// extend from scratch: their flags clear).
  void flush_before_plain(const model::WorkerBatch& batch);
  /// After a round's commit: the draft model's K/V of the kept tokens (`tails[b]`: root, then
  /// the emitted tokens).
  void draft_after_round(const std::vector<Seq>& seqs,
                         const std::vector<std::vector<int32_t>>& kv_nodes,
                         const std::vector<std::vector<int32_t>>& tails,
                         std::span<const SlotIndex> slots, int32_t extra,
                         const std::vector<uint8_t>& finished);

  // EAGLE head (spec_eagle.cpp).
  void init_eagle(const model::WorkerConfig& worker,
                  const std::function<std::unique_ptr<model::ModelOps>()>& make_ops);
  /// After a plain step: the head extends the step's positions (tokens shifted by one, the
  /// target's features) and records each sampled row's next-draft state.
  void eagle_after_step(const model::WorkerBatch& batch, const model::WorkerOutput& result);
  std::vector<spec::DraftTree> eagle_trees(const std::vector<Seq>& seqs,
                                           std::span<const SlotIndex> slots, int32_t extra);
  /// After a round's commit: the head extends the kept positions with the verify features.
  void eagle_extend(const std::vector<Seq>& seqs, const std::vector<std::vector<int32_t>>& kv_nodes,
                    const std::vector<std::vector<int32_t>>& tails,
                    std::span<const SlotIndex> slots, int32_t extra,
                    const std::vector<float>& verify_hidden, int32_t tree_size);

  std::unique_ptr<model::ModelWorker> target_;
  const model::LlamaModel* model_;
  SpecConfig config_;
  SpecMemory memory_;
  spec::NgramDrafter ngram_;
  std::unique_ptr<model::ModelWorker> draft_;  ///< SpecMode::kDraft
  std::unique_ptr<model::EagleRunner> eagle_;  ///< SpecMode::kEagle
  /// [row] the token at kv_len − 1 has no draft-model K/V yet (a fully accepted topk-1 chain
  /// leaves it to the next round's first draft forward).
  std::vector<uint8_t> draft_pending_;
  std::vector<EagleState> eagle_state_;  ///< [row], kEagle only
  double mean_accepted_ = 1.0;  ///< running mean of accepted draft tokens per request
  int32_t pause_ = 0;           ///< decode steps left without speculation
  int32_t pause_len_ = 0;       ///< length of the next pause
  SpecStats stats_;
};

}  // namespace pagoda::engine
