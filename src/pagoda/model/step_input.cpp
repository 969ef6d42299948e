#include "pagoda/model/model_runner.h"

#include <algorithm>

#include "pagoda/core/error.h"

namespace pagoda::model {

using attention::ForwardBatch;
using attention::ForwardMode;

ForwardBatch build_forward_batch(const StepInput& in) {
  PAGODA_REQUIRE(in.mode == ForwardMode::kExtend || in.mode == ForwardMode::kDecode ||
                     in.mode == ForwardMode::kMixed,
                 kInvalidArgument, "the model runner runs extend, decode or mixed steps, not {}",
                 attention::forward_mode_name(in.mode));
  ForwardBatch b;
  b.mode = in.mode;
  b.batch_size = static_cast<int>(in.seqs.size());
  const bool extend = in.mode != ForwardMode::kDecode;
  size_t total = 0;
  for (const StepSequence& s : in.seqs) {
    PAGODA_REQUIRE(!s.tokens.empty(), kInvalidArgument, "a step sequence has no tokens");
    PAGODA_REQUIRE(extend || s.tokens.size() == 1, kInvalidArgument,
                   "a decode sequence has {} tokens", s.tokens.size());
    PAGODA_REQUIRE(s.prefix_len >= 0 && s.req_slot >= 1, kInvalidArgument,
                   "bad sequence (row {}, prefix {})", s.req_slot, s.prefix_len);
    total += s.tokens.size();
  }
  PAGODA_REQUIRE(in.out_cache_loc.size() == total, kInvalidArgument,
                 "out_cache_loc has {} slots for {} tokens", in.out_cache_loc.size(), total);
  b.req_pool_indices.reserve(in.seqs.size());
  b.seq_lens.reserve(in.seqs.size());
  b.positions.reserve(total);
  for (const StepSequence& s : in.seqs) {
    const int32_t n = static_cast<int32_t>(s.tokens.size());
    b.req_pool_indices.push_back(s.req_slot);
    b.seq_lens.push_back(s.prefix_len + n);
    if (extend) {
      b.extend_prefix_lens.push_back(s.prefix_len);
      b.extend_seq_lens.push_back(n);
    }
    for (int32_t i = 0; i < n; ++i) b.positions.push_back(s.prefix_len + i);
  }
  b.out_cache_loc = in.out_cache_loc;
  return b;
}

ModelRunner::ModelRunner(LlamaModel& model, attention::AttentionBackend& backend)
    : model_(&model),
      backend_(&backend),
      platform_(platform::make_cpu_platform()),
      ops_(make_cpu_ops(*platform_, DType::kF32)),
      decoder_(std::make_unique<Decoder>(model, *ops_)) {}

ModelRunner::~ModelRunner() = default;

std::span<const float> ModelRunner::run(const StepInput& in) {
  batch_ = build_forward_batch(in);
  input_ids_.clear();
  logit_rows_.clear();
  int32_t row = 0;
  for (const StepSequence& s : in.seqs) {
    input_ids_.insert(input_ids_.end(), s.tokens.begin(), s.tokens.end());
    row += static_cast<int32_t>(s.tokens.size());
    if (s.want_logits) logit_rows_.push_back(row - 1);
  }
  const int64_t vocab = model_->config().vocab_size;
  for (int32_t id : input_ids_)
    PAGODA_REQUIRE(id >= 0 && id < vocab, kOutOfRange, "token id {} outside [0, {})", id, vocab);
  const int64_t t = batch_.num_tokens();
  const int64_t rows = static_cast<int64_t>(logit_rows_.size());
  // CPU ops: the activations are host memory, staged directly.
  decoder_->reserve(acts_, t, std::max<int64_t>(rows, 1));
  std::copy(input_ids_.begin(), input_ids_.end(), acts_.ids());
  std::copy(batch_.positions.begin(), batch_.positions.end(), acts_.positions());
  std::copy(logit_rows_.begin(), logit_rows_.end(), acts_.logit_rows());
  backend_->init_forward_metadata(batch_);
  decoder_->forward(acts_, batch_, *backend_, t, rows);
  logits_.assign(acts_.logits_f32(), acts_.logits_f32() + rows * vocab);
  return logits_;
}

}  // namespace pagoda::model
