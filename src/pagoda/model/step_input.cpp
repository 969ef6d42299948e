#include "pagoda/model/step_input.h"

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

}  // namespace pagoda::model
