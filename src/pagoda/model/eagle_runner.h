#pragma once
/// EagleRunner: runs an EagleHead (eagle_head.h) on one device through ModelOps, with the head's
/// own KV pool (one layer, the head's KV heads) that shares the target's page size, page count
/// and ReqToTokenTable: a slot names the same position in the target's pool and the head's.
/// The head's entry at position p holds (token x_{p+1}, target feature f_p): after the target
/// computed positions [a, b) the head extends the same positions with the tokens shifted by one.
///
/// Step (run): host: embedding rows (the head's or the target's table), the fc input (EAGLE-1
/// [e ; f ; 1] with f = the target's final norm of its last-layer output; EAGLE-3 the three layer
/// outputs) converted to the ops' dtype and copied to the device → fc GEMM → the decoder layer
/// (attention through the backend, writing K/V at out_cache_loc) → the output hidden state r (f32)
/// copied back → for the logit rows the final norm (EAGLE-3) on the host → lm_head GEMM (f32
/// logits over the draft vocabulary) copied back. Eager only (no graphs yet).
///
/// Thread rules: one thread. The head, ops' platform and table must outlive the runner.

#include <cstdint>
#include <memory>
#include <vector>

#include "pagoda/attention/registry.h"
#include "pagoda/backends/builtin.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/model/eagle_head.h"
#include "pagoda/model/model_ops.h"

namespace pagoda::model {

/// One forward of the head.
struct EagleInput {
  /// Mode (kExtend / kDecode / kMixed / kTargetVerify), lengths, positions and slots; the rows of
  /// the req→token table are written for every position the batch reads.
  attention::ForwardBatch forward;
  /// [t] the token each query row embeds (target ids, < vocab_size).
  std::vector<int32_t> input_ids;
  /// [t, head.feature_dim()] target layer outputs (from_target) or [t, H] the head's own hidden
  /// states (the drafting recurrence), f32.
  std::vector<float> features;
  bool from_target = true;
  /// Query rows whose logits are wanted (any order, may repeat).
  std::vector<int32_t> logit_rows;
};

struct EagleOutput {
  std::vector<float> hidden;  ///< [t, H] f32: the head's output r per row (next step's input)
  std::vector<float> logits;  ///< [logit_rows, draft_vocab] f32 (draft ids: EagleHead::to_target)
};

struct EagleRunnerConfig {
  int32_t page_size = 16;
  int32_t num_pages = 2048;  ///< as the target worker's (page 0 added on top)
  DType kv_dtype = DType::kF32;
  backends::BackendSelection backend{};
  bool mixed_batches = true;
};

class EagleRunner {
 public:
  /// Builds the pool, backend and device weights. Throws Error naming what is wrong.
  EagleRunner(const EagleHead& head, std::unique_ptr<ModelOps> ops, const EagleRunnerConfig& config,
              kv::ReqToTokenTable& table);
  ~EagleRunner();
  EagleRunner(const EagleRunner&) = delete;
  EagleRunner& operator=(const EagleRunner&) = delete;

  /// Runs one forward. Throws Error(kInvalidArgument / kOutOfRange) for inconsistent sizes or
  /// ids (nothing computed).
  EagleOutput run(const EagleInput& in);
  const EagleHead& head() const { return *head_; }
  kv::KvPool& kv_pool() { return *pool_; }
  /// Moves K/V rows (speculative commit of the head's pool; KvPool::move_kv's contract).
  void move_kv(std::span<const SlotIndex> src, std::span<const SlotIndex> dst);
  int64_t forwards() const { return forwards_; }

 private:
  void reserve(int64_t tokens, int64_t rows);
  /// Host f32 [n] → `dst` (device, ops dtype).
  void upload(void* dst, std::span<const float> host);

  const EagleHead* head_;
  std::unique_ptr<ModelOps> ops_;
  platform::Platform* platform_;
  std::unique_ptr<kv::KvPool> pool_;
  attention::BackendRegistry registry_;
  std::unique_ptr<attention::AttentionBackend> backend_;
  attention::AttentionLayer layer_;
  // Device weights (ops dtype; the CPU ops use the head's host arrays in place).
  const void *fc_ = nullptr, *qkv_ = nullptr, *o_ = nullptr, *post_norm_ = nullptr,
             *gate_up_ = nullptr, *down_ = nullptr, *lm_head_ = nullptr, *ones_ = nullptr,
             *hidden_norm_ = nullptr;
  const float* inv_freq_ = nullptr;
  std::vector<float> ones_host_;
  // Activations (grow-only).
  int64_t cap_tokens_ = 0, cap_rows_ = 0;
  platform::DeviceBuffer in_, x_, h_, cat_, qkv_buf_, q_, k_, v_, o_buf_, mlp_, act_, residual_,
      pos_, sel_, logits_, emb_;
  std::vector<std::vector<uint8_t>> pending_;  ///< host sources of in-flight copies
  int64_t forwards_ = 0;
};

}  // namespace pagoda::model
