#include "pagoda/model/worker_codec.h"

#include "pagoda/core/error.h"

namespace pagoda::model {

namespace {
constexpr uint32_t kMagic = 0x42574750;  // "PGWB"
}

void encode_worker_batch(const WorkerBatch& b, dist::WireWriter& w) {
  const attention::ForwardBatch& f = b.forward;
  w.put(kMagic);
  w.put(static_cast<uint8_t>(f.mode));
  w.put<int32_t>(f.batch_size);
  w.put_vec(f.req_pool_indices);
  w.put_vec(f.seq_lens);
  w.put_vec(f.extend_prefix_lens);
  w.put_vec(f.extend_seq_lens);
  w.put_vec(f.positions);
  w.put_vec(f.out_cache_loc);
  w.put<int32_t>(f.spec.topk);
  w.put<int32_t>(f.spec.num_steps);
  w.put<int32_t>(f.spec.num_draft_tokens);
  w.put_vec(f.spec.tree_mask);
  w.put<int32_t>(f.spec.draft_step);
  w.put_vec(f.spec.draft_slots);
  w.put_vec(b.input_ids);
  w.put_vec(b.logit_rows);
  w.put_vec(b.sampling);
  w.put_vec(b.sample_step);
  w.put_vec(b.logit_adjust);
  w.put_vec(b.mask_rows);
  w.put_vec(b.token_mask);
  w.put<uint8_t>(b.return_logits ? 1 : 0);
  w.put<int32_t>(b.top_k);
}

void decode_worker_batch(dist::WireReader& r, WorkerBatch& b) {
  PAGODA_REQUIRE(r.get<uint32_t>() == kMagic, kInvalidArgument,
                 "not a WorkerBatch message (bad magic)");
  attention::ForwardBatch& f = b.forward;
  const uint8_t mode = r.get<uint8_t>();
  PAGODA_REQUIRE(mode <= static_cast<uint8_t>(attention::ForwardMode::kIdle), kInvalidArgument,
                 "WorkerBatch message: unknown forward mode {}", mode);
  f.mode = static_cast<attention::ForwardMode>(mode);
  f.batch_size = r.get<int32_t>();
  r.get_vec(f.req_pool_indices);
  r.get_vec(f.seq_lens);
  r.get_vec(f.extend_prefix_lens);
  r.get_vec(f.extend_seq_lens);
  r.get_vec(f.positions);
  r.get_vec(f.out_cache_loc);
  f.spec.topk = r.get<int32_t>();
  f.spec.num_steps = r.get<int32_t>();
  f.spec.num_draft_tokens = r.get<int32_t>();
  r.get_vec(f.spec.tree_mask);
  f.spec.draft_step = r.get<int32_t>();
  r.get_vec(f.spec.draft_slots);
  r.get_vec(b.input_ids);
  r.get_vec(b.logit_rows);
  r.get_vec(b.sampling);
  r.get_vec(b.sample_step);
  r.get_vec(b.logit_adjust);
  r.get_vec(b.mask_rows);
  r.get_vec(b.token_mask);
  b.return_logits = r.get<uint8_t>() != 0;
  b.top_k = r.get<int32_t>();
  const size_t bs = static_cast<size_t>(f.batch_size);
  PAGODA_REQUIRE(f.batch_size >= 0 && f.req_pool_indices.size() == bs && f.seq_lens.size() == bs,
                 kInvalidArgument, "WorkerBatch message: {} rows / {} lengths for {} sequences",
                 f.req_pool_indices.size(), f.seq_lens.size(), f.batch_size);
}

}  // namespace pagoda::model
