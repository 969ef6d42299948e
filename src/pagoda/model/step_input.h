#pragma once
/// ModelRunner: turns one scheduled step into a ForwardBatch, plans it once
/// (backend.init_forward_metadata) and runs the model's layers through the Decoder on the CPU ops
/// (f32), the one layer loop the workers use too (ARCHITECTURE §1).
///
/// The scheduler owns memory: before run() it has allocated out_cache_loc and written every
/// request's ReqToTokenTable row for positions [0, prefix_len + tokens.size()). The runner only
/// describes the step (positions, seq_lens, prefix / extend lengths per mode) and computes.
///
/// A host-side convenience for tests and tools that drive one model and one backend directly;
/// serving goes through ModelWorker (worker.h, llama_worker.h), which owns the device state.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "pagoda/attention/backend.h"
#include "pagoda/attention/forward_batch.h"
#include "pagoda/model/decoder.h"
#include "pagoda/model/llama.h"
#include "pagoda/model/llama_worker.h"
#include "pagoda/model/model_ops.h"
#include "pagoda/platform/platform.h"

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

class ModelRunner {
 public:
  /// `model` and `backend` (a host backend: its pool on the CPU) must outlive the runner; both
  /// are used by one thread. The model's weights are used in place (no copy).
  ModelRunner(LlamaModel& model, attention::AttentionBackend& backend);
  ~ModelRunner();

  /// Runs the step. Returns logits [num sequences with want_logits, vocab], in sequence order,
  /// valid until the next run(). Throws Error on bad input (nothing computed): a token id
  /// outside the vocabulary is kOutOfRange.
  std::span<const float> run(const StepInput& in);
  /// The batch of the last run() (for tests and statistics).
  const attention::ForwardBatch& last_batch() const { return batch_; }
  LlamaModel& model() { return *model_; }
  attention::AttentionBackend& backend() { return *backend_; }

 private:
  LlamaModel* model_;
  attention::AttentionBackend* backend_;
  attention::ForwardBatch batch_;
  std::vector<int32_t> input_ids_;
  std::vector<int32_t> logit_rows_;
  std::vector<float> logits_;
  std::unique_ptr<platform::Platform> platform_;
  std::unique_ptr<ModelOps> ops_;
  std::unique_ptr<Decoder> decoder_;
  Activations acts_;
};

}  // namespace pagoda::model
