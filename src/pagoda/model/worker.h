#pragma once
/// The Scheduler → ModelWorker seam (ARCHITECTURE §1).
///
/// The scheduler does all memory work (allocation, req→token rows, prefix matching) and emits a
/// WorkerBatch, a plain value; ModelWorker::run computes it and returns the sampled ids. The
/// worker owns everything on the device: the KV pool, the attention backend(s), the model's
/// weights, activations, CUDA graphs and sampling. With tensor parallelism rank 0 broadcasts the
/// WorkerBatch to every rank's worker; a speculative loop composes a draft and a target worker.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "pagoda/attention/forward_batch.h"
#include "pagoda/core/ids.h"
#include "pagoda/model/model_ops.h"
#include "pagoda/model/sampler.h"

namespace pagoda::kv {
class KvPool;
class StatePool;
}

namespace pagoda::model {

/// One step for the worker. Sequence b's query tokens are rows [Σ_{j<b} n_j, Σ_{j≤b} n_j) of
/// input_ids (n_j = extend_seq_lens[j] in extend modes, 1 in decode).
struct WorkerBatch {
  /// Mode, lengths, positions, out_cache_loc, spec info (the req→token rows are already written).
  attention::ForwardBatch forward;
  /// [num_tokens] token ids of the query rows (each < vocab_size).
  std::vector<int32_t> input_ids;
  /// [bs] how many logit rows sequence b needs: its last `logit_rows[b]` query tokens (0 for a
  /// non-final prefill chunk, 1 normally, the draft-tree size for verify).
  std::vector<int32_t> logit_rows;
  /// [bs] sampling parameters of each sequence.
  std::vector<SamplingParams> sampling;
  /// [bs] index of the first token sampled for sequence b within its request (the RNG counter:
  /// row i of sequence b uses step sample_step[b] + i). Makes sampling independent of batching.
  std::vector<int64_t> sample_step;
  /// Logit changes applied before sampling (logit_bias and penalties; logit_processing.h),
  /// `row` indexing the Σ logit_rows logit rows. Empty = none (no cost). A batch that has some
  /// runs eagerly (no graph replay).
  std::vector<LogitAdjust> logit_adjust;
  /// Structured output's token masks (engine/token_constraint.h), applied after logit_adjust:
  /// the logit rows that are limited (strictly ascending, each < Σ logit_rows) and their
  /// allowed-token bitmasks packed in that order, W = token_mask_words(vocab) words each: row
  /// mask_rows[i] keeps token t iff bit t % 32 of token_mask[i * W + t / 32] is set, every other
  /// logit becomes -inf (ModelOps::mask_logits). Bits at or past vocab are ignored; each mask
  /// must allow a token below vocab. Empty = none. Masked batches replay graphs like others.
  std::vector<int32_t> mask_rows;
  std::vector<uint32_t> token_mask;
  /// Also return the f32 logits of every logit row (tests, tools, verify).
  bool return_logits = false;
  /// EAGLE heads: also return the outputs (residual stream after the layer, f32) of these
  /// layers for every query row, in this order (WorkerOutput::hidden). Empty = none (no cost).
  /// A batch that asks runs eagerly (no graph replay).
  std::vector<int32_t> hidden_layers;
  /// Also return each logit row's top_k (ids, log-probabilities), top_k in [0, 16] (0 = none):
  /// computed on the device where the ops can (ModelOps::top_k_logprobs); otherwise the worker
  /// returns the whole rows in `logits` instead and leaves top_ids empty.
  int32_t top_k = 0;
  /// Several tokens per sequence: whether this step may emit more than one token per logit row
  /// (a speculative worker, engine/spec_worker.h, then runs a round; every other worker ignores
  /// this and the three fields below, which tensor parallelism does not send to followers).
  /// The engine allows it on decode steps when no logits observer is installed and no waiting
  /// request could be admitted instead.
  bool allow_multi_token = false;
  /// [bs] each sequence's whole token history (prompt ++ output so far; its query tokens are
  /// the last ones). Valid for the run() call only.
  std::vector<std::span<const int32_t>> context;
  /// [bs] the most tokens sequence b may receive this step before it finishes (its
  /// max_new_tokens and context budgets); >= 1.
  std::vector<int32_t> max_emit;
  /// [bs] the token that finishes sequence b when emitted (EOS), -1 = none.
  std::vector<int32_t> stop_token;
  /// Hybrid models (ModelWorker::state_pool() non-null): [bs] each sequence's slot in that pool,
  /// held by its request (its Mamba2 layers' state, read and advanced by this step's tokens).
  /// Empty for every other model.
  std::vector<int32_t> state_slots;
  /// Hybrid models, kTargetVerify only: [Σ extend_seq_lens] a held state slot per draft-tree
  /// node and each node's parent within its sequence (-1 for the root), sequences in order
  /// (Mamba2Seq::node_slots / node_parents). The step writes every node's state there and
  /// leaves state_slots unchanged; the caller copies the last accepted node's into its slot.
  std::vector<int32_t> state_node_slots;
  std::vector<int32_t> state_node_parents;

  int batch_size() const { return forward.batch_size; }
  /// Σ logit_rows.
  int64_t num_logit_rows() const;
};

/// What one step produced.
struct WorkerOutput {
  /// [Σ logit_rows] sampled ids, in batch order (sequence b's rows in query order).
  std::vector<int32_t> tokens;
  /// [Σ logit_rows, vocab] f32 when WorkerBatch::return_logits (or top_k without device top-k),
  /// else empty.
  std::vector<float> logits;
  /// [num_tokens, hidden_layers.size() × hidden] f32 when WorkerBatch::hidden_layers, else empty.
  std::vector<float> hidden;
  /// [Σ logit_rows, top_k] when WorkerBatch::top_k > 0 and the device computed them, else empty.
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
  /// Several tokens per sequence (WorkerBatch::allow_multi_token): [bs] how many entries of
  /// `tokens` belong to sequence b (in batch order; >= 1, at most max_emit[b]; only the last
  /// one may be stop_token[b]). Empty: one token per logit row.
  std::vector<int32_t> counts;
  /// The mode the step ran in when the worker chose another than the batch's (kTargetVerify
  /// for a speculative round) and the query tokens it computed then; kIdle = the batch's mode
  /// and tokens.
  attention::ForwardMode mode = attention::ForwardMode::kIdle;
  int64_t num_tokens = 0;
};

/// Counters of a worker (cumulative).
struct WorkerStats {
  int64_t steps = 0;
  int64_t graph_steps = 0;   ///< decode steps served by a CUDA-graph replay
  int64_t spec_graph_steps = 0;  ///< kTargetVerify steps (verify / draft) served by a replay
  int num_spec_graphs = 0;   ///< captured kTargetVerify graphs
  int64_t padded_rows = 0;   ///< dummy rows added by graph padding
  int num_graphs = 0;        ///< captured decode buckets
  bool device = false;       ///< computes on a GPU
  int64_t kv_bytes = 0;      ///< bytes the KV pool allocated (KvPool::total_bytes)
  int64_t swa_kv_bytes = 0;  ///< bytes the SWA pool allocated (0 without one)
};

class ModelWorker {
 public:
  virtual ~ModelWorker() = default;
  /// Runs the step and returns the sampled ids (and logits on request). Throws Error on bad
  /// input (kInvalidArgument / kOutOfRange, nothing computed) or a device failure (kInternal).
  virtual WorkerOutput run(const WorkerBatch& batch) = 0;
  /// run() in two halves, for a caller that runs the step on another thread while its own
  /// thread writes host state for the next step (the overlap scheduler, engine/overlap_loop.h,
  /// whose scheduler writes the request table while the step thread runs the step before).
  /// stage() runs on the caller's thread when the step is launched, before that state changes
  /// again, and copies out what the step needs from it (opaque bytes); run_staged() then runs
  /// the step with them on any thread. run(b) computes what run_staged(b, stage(b)) does.
  /// Default: nothing to stage (a worker that reads only device state and the batch);
  /// run_staged = run. A tensor-parallel leader (engine/tp.h) stages the table entries its
  /// followers have not seen yet.
  virtual std::vector<std::byte> stage(const WorkerBatch& batch);
  virtual WorkerOutput run_staged(const WorkerBatch& batch, std::span<const std::byte> staged);
  /// The KV pool the scheduler's slots index.
  virtual kv::KvPool& kv_pool() = 0;
  /// The recurrent-state pool of a hybrid model's Mamba2 layers (one slot per running request,
  /// WorkerBatch::state_slots; the scheduler allocates and frees them), or nullptr when the
  /// model has none.
  virtual kv::StatePool* state_pool() { return nullptr; }
  /// Moves the K/V of slot src[i] to slot dst[i] in every layer (speculative commit; the
  /// contract of KvPool::move_kv: overlap-safe, kOutOfRange for a bad slot, nothing changed).
  /// Default: KvPool::move_kv (host copies); the CUDA LlamaWorker runs one kernel pair instead.
  virtual void move_kv(std::span<const SlotIndex> src, std::span<const SlotIndex> dst);
  /// The attention backend's name.
  virtual std::string backend_name() const = 0;
  virtual WorkerStats stats() const = 0;
};

}  // namespace pagoda::model
