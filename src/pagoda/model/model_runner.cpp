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
    : model_(&model), backend_(&backend) {}

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
  logits_.resize(logit_rows_.size() * vocab);
  if (executor_ != nullptr) {
    executor_->run(batch_, input_ids_, logit_rows_, logits_);
    return logits_;
  }
  backend_->init_forward_metadata(batch_);
  model_->forward(batch_, input_ids_, *backend_, logit_rows_, logits_);
  return logits_;
}

std::vector<int> cuda_graph_batch_sizes(int max_bs) {
  PAGODA_REQUIRE(max_bs >= 1, kInvalidArgument, "max_bs must be >= 1 (got {})", max_bs);
  std::vector<int> all = {1, 2, 4, 8, 12};
  for (int b = 16; b <= 256; b += 8) all.push_back(b);
  for (int b = 272; b < 512; b += 16) all.push_back(b);
  for (int b = 512; b <= max_bs; b += 32) all.push_back(b);
  std::vector<int> out;
  for (int b : all)
    if (b <= max_bs) out.push_back(b);
  if (out.empty() || out.back() != max_bs) out.push_back(max_bs);
  return out;
}

void pad_decode_batch(ForwardBatch& batch, int bucket_bs, int fill_seq_len) {
  PAGODA_REQUIRE(batch.mode == ForwardMode::kDecode, kInvalidArgument,
                 "only decode batches are padded (got {})", attention::forward_mode_name(batch.mode));
  PAGODA_REQUIRE(bucket_bs >= batch.batch_size && fill_seq_len >= 1, kInvalidArgument,
                 "bucket {} below batch size {} or fill {} < 1", bucket_bs, batch.batch_size,
                 fill_seq_len);
  const int pad = bucket_bs - batch.batch_size;
  batch.req_pool_indices.insert(batch.req_pool_indices.end(), pad, 0);
  batch.seq_lens.insert(batch.seq_lens.end(), pad, fill_seq_len);
  batch.positions.insert(batch.positions.end(), pad, fill_seq_len - 1);
  batch.out_cache_loc.insert(batch.out_cache_loc.end(), pad, 0);
  batch.batch_size = bucket_bs;
}

}  // namespace pagoda::model
