#pragma once
/// Decoder: the Llama-family layer loop, written once over ModelOps (ARCHITECTURE §1). It owns
/// the model's weights as the ops store them (dtype and device of the ops) and runs
///
///   residual = embed[ids]; h = rms_norm(residual)·w_in                       (layer 0)
///   per layer: qkv = h·Wqkvᵀ (+ bias); q, k = rope(q, k, positions);
///              o = backend.forward(q, k, v, layer, batch)   (writes K/V at out_cache_loc);
///              x = o·Woᵀ; residual += x; h = rms_norm(residual)·w_post;
///              x = (silu(h·Wgᵀ) * h·Wuᵀ)·Wdᵀ; residual += x; h = rms_norm(residual)·w_in(next)
///   logits[r] = soft_cap(rms_norm(residual[rows[r]])·W_lmᵀ)    (f32)
///
/// The residual stream is f32 whatever the weight dtype. forward() only enqueues work on the
/// ops' stream: it is capturable into a CUDA graph when the backend's plan is (the worker
/// captures it per decode bucket).
///
/// Thread rules: one thread; the model and ops must outlive the decoder.

#include <cstdint>
#include <vector>

#include "pagoda/attention/backend.h"
#include "pagoda/attention/forward_batch.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/model/llama.h"
#include "pagoda/model/model_ops.h"
#include "pagoda/platform/platform.h"

namespace pagoda::model {

/// Device activations for up to `tokens` query rows and `rows` logit rows. Grow-only; the
/// graph runner keeps one fixed instance so captured addresses stay valid.
struct Activations {
  int64_t tokens = 0;
  int64_t rows = 0;
  platform::DeviceBuffer residual, x, h, qkv, q, k, v, attn, mlp, act, sel, logits;
  /// Device ints: ids [tokens], positions [tokens], out_cache_loc [tokens], logit row index
  /// [rows], out ids [rows].
  platform::DeviceBuffer ints;
  /// Device sampling parameters [rows].
  platform::DeviceBuffer sample_params;
  int32_t* ids() const { return static_cast<int32_t*>(ints.get()); }
  int32_t* positions() const { return ids() + tokens; }
  int32_t* cache_loc() const { return ids() + 2 * tokens; }
  int32_t* logit_rows() const { return ids() + 3 * tokens; }
  int32_t* out_ids() const { return ids() + 3 * tokens + rows; }
  float* logits_f32() const { return static_cast<float*>(logits.get()); }
  SampleRow* params() const { return static_cast<SampleRow*>(sample_params.get()); }
};

class Decoder {
 public:
  /// Uploads the weights of `model` through `ops` (converted to ops.dtype()). With `kv_pool`
  /// (an MHA pool on the ops' device in the ops' dtype) the new K/V go into the cache from the
  /// RoPE kernel (ModelOps::qkv_rope_store) and the backend runs with SaveKv::kNo; otherwise the
  /// backend appends them.
  Decoder(const LlamaModel& model, ModelOps& ops, const kv::KvPool* kv_pool = nullptr);

  const LlamaModel& model() const { return *model_; }
  ModelOps& ops() const { return *ops_; }
  /// Makes `a` hold at least `tokens` query rows and `rows` logit rows (reallocates; contents
  /// are lost). Synchronizes the stream before freeing old buffers.
  void reserve(Activations& a, int64_t tokens, int64_t rows) const;
  /// Enqueues the forward of `tokens` query rows of `batch` whose ids, positions and slots are
  /// already in a.ids() / a.positions() / a.cache_loc(), computing f32 logits for the `rows` query rows listed in
  /// a.logit_rows(). The backend must have planned `batch` (init_forward_metadata or a graph
  /// replay plan). Never synchronizes.
  void forward(Activations& a, const attention::ForwardBatch& batch,
               attention::AttentionBackend& backend, int64_t tokens, int64_t rows) const;
  /// Enqueues sampling of the `rows` logit rows into a.out_ids() with a.params().
  void sample(Activations& a, int64_t rows) const;

 private:
  struct LayerPtrs {
    const void *input_norm, *qkv, *qkv_bias, *o_proj, *post_norm, *gate_up, *down;
  };
  const LlamaModel* model_;
  ModelOps* ops_;
  std::vector<LayerPtrs> layers_;
  /// Per layer K / V cache base pointers for the fused store (empty: the backend appends).
  std::vector<KvStore> stores_;
  const kv::KvPool* kv_pool_ = nullptr;
  const void* embed_ = nullptr;
  const void* lm_head_ = nullptr;
  const void* final_norm_ = nullptr;
  const float* inv_freq_ = nullptr;
};

}  // namespace pagoda::model
