#pragma once
/// ModelRunner: turns one scheduled step into a ForwardBatch, plans it once
/// (backend.init_forward_metadata) and runs the model's layers (ARCHITECTURE §1).
///
/// The scheduler owns memory: before run() it has allocated out_cache_loc and written every
/// request's ReqToTokenTable row for positions [0, prefix_len + tokens.size()). The runner only
/// describes the step (positions, seq_lens, prefix / extend lengths per mode) and computes.
///
/// CUDA graphs (seam): cuda_graph_batch_sizes() gives SGLang's decode buckets and
/// pad_decode_batch() pads a decode batch to a bucket with the dummy row 0 / slot 0 / fill seq_len;
/// a graph runner (CUDA path) captures LlamaModel::forward per bucket over persistent buffers and
/// replays it after init_forward_metadata_replay_cuda_graph. The CPU path runs eagerly.

#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/attention/backend.h"
#include "pagoda/attention/forward_batch.h"
#include "pagoda/model/llama.h"

namespace pagoda::model {

/// One request's part of a step.
struct StepSequence {
  int32_t req_slot = 0;    ///< ReqToTokenTable row (>= 1)
  int32_t prefix_len = 0;  ///< tokens of this request already in the KV cache
  /// Tokens computed this step (>= 1): the extend chunk, or the one token being decoded.
  std::span<const int32_t> tokens;
  /// Whether this request needs next-token logits (false for a non-final prefill chunk).
  bool want_logits = true;
};

struct StepInput {
  /// kExtend (every sequence extends), kDecode (every sequence has 1 token) or kMixed (extends
  /// followed by decodes; a decode sequence is a 1-token extend).
  attention::ForwardMode mode = attention::ForwardMode::kExtend;
  std::vector<StepSequence> seqs;
  /// [Σ tokens] the slots the new tokens' K/V go to, in sequence order.
  std::vector<int32_t> out_cache_loc;
};

/// Builds the ForwardBatch of `in` (positions = prefix_len + i; seq_lens = prefix_len + n;
/// extend lens in extend modes). Throws Error(kInvalidArgument) for an empty sequence, a decode
/// sequence with more than one token, or a wrong out_cache_loc length.
attention::ForwardBatch build_forward_batch(const StepInput& in);

/// A device implementation of one planned step (the CUDA path, model/cuda): it replaces
/// `backend.init_forward_metadata(batch)` + `LlamaModel::forward` and may pad and replay a
/// captured CUDA graph for decode batches. Same contract as LlamaModel::forward for input_ids,
/// logit_rows and logits (host spans); throws Error on bad input or a device failure.
class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  virtual void run(const attention::ForwardBatch& batch, std::span<const int32_t> input_ids,
                   std::span<const int32_t> logit_rows, std::span<float> logits) = 0;
};

class ModelRunner {
 public:
  /// `model` and `backend` must outlive the runner; both are used by one thread.
  ModelRunner(LlamaModel& model, attention::AttentionBackend& backend);

  /// Runs the step. Returns logits [num sequences with want_logits, vocab], in sequence order,
  /// valid until the next run(). Throws Error on bad input (nothing computed).
  std::span<const float> run(const StepInput& in);
  /// The batch of the last run() (for tests and statistics).
  const attention::ForwardBatch& last_batch() const { return batch_; }
  LlamaModel& model() { return *model_; }
  attention::AttentionBackend& backend() { return *backend_; }
  /// Routes every step through `executor` (nullptr: the host path). It must outlive its use.
  void set_executor(StepExecutor* executor) { executor_ = executor; }

 private:
  LlamaModel* model_;
  attention::AttentionBackend* backend_;
  StepExecutor* executor_ = nullptr;
  attention::ForwardBatch batch_;
  std::vector<int32_t> input_ids_;
  std::vector<int32_t> logit_rows_;
  std::vector<float> logits_;
};

/// SGLang's decode CUDA-graph batch sizes without speculative decoding (sglang_spec §7):
/// [1, 2, 4, 8, 12] + 16..256 step 8 + 272..511 step 16 + 512..max step 32, truncated to
/// max_bs, with max_bs appended when missing. Requires max_bs >= 1.
std::vector<int> cuda_graph_batch_sizes(int max_bs);

/// Pads a kDecode batch to `bucket_bs` requests: padded rows use req_to_token row 0, seq_len
/// `fill_seq_len`, position fill_seq_len - 1 and slot 0 (the reserved dummy). Requires
/// bucket_bs >= batch.batch_size and a kDecode batch (Error(kInvalidArgument) otherwise).
void pad_decode_batch(attention::ForwardBatch& batch, int bucket_bs, int fill_seq_len);

}  // namespace pagoda::model
