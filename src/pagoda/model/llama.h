#pragma once
/// LlamaModel: a Llama-family decoder whose attention runs through an AttentionBackend over the
/// paged KV cache (ARCHITECTURE §1):
///
///   x = embed[ids]
///   per layer: h = rms_norm(x); q, k, v = h·Wqkvᵀ (+ b_qkv when config.qkv_bias); rope(q, k);
///              o = backend.forward(q, k, v, layer, batch)   (writes K/V at out_cache_loc);
///              x += o·Woᵀ; h = rms_norm(x); x += (silu(h·Wgᵀ) * h·Wuᵀ)·Wdᵀ
///   logits = soft_cap(rms_norm(x[rows])·W_lmᵀ)
///
/// f32 compute on the host (OpenBLAS). The device path (cuBLAS GEMMs + the same backend calls)
/// plugs in behind the dense ops in ops.h; this class only sequences them.
/// Not thread-safe (owns scratch buffers); one engine thread uses it.

#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/attention/backend.h"
#include "pagoda/attention/forward_batch.h"
#include "pagoda/attention/layer.h"
#include "pagoda/attention/registry.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/model/config.h"
#include "pagoda/model/ops.h"
#include "pagoda/model/weights.h"

namespace pagoda::model {

class LlamaModel {
 public:
  /// Validates config and weights (Error(kInvalidArgument) naming the mismatch) and packs the
  /// weights for the forward pass (q/k/v and gate/up fused). `weights` is copied.
  LlamaModel(ModelConfig config, const ModelWeights& weights);

  const ModelConfig& config() const { return config_; }
  /// The per-layer attention parameters handed to the backend (layer_id = index).
  const std::vector<attention::AttentionLayer>& attention_layers() const { return layers_; }
  /// What a backend must support to run this model (f32 q and KV).
  attention::BackendRequirements backend_requirements(int page_size) const;
  /// A KV pool shape for this model: f32, num_layers, num_kv_heads, head_dim.
  kv::KvPoolConfig kv_pool_config(int32_t num_pages, int32_t page_size) const;

  /// Runs every layer for `batch`. The caller has already called
  /// backend.init_forward_metadata(batch) and written the rows of the ReqToTokenTable.
  /// input_ids: [batch.num_tokens()] token ids (< vocab_size, checked: Error(kOutOfRange));
  /// logit_rows: which query rows to compute logits for (each in [0, num_tokens));
  /// logits: [logit_rows.size(), vocab_size] f32, written. A kIdle batch writes nothing.
  void forward(const attention::ForwardBatch& batch, std::span<const int32_t> input_ids,
               attention::AttentionBackend& backend, std::span<const int32_t> logit_rows,
               std::span<float> logits);

 public:
  /// One layer's weights as the forward pass uses them (f32, HF [out, in] layout).
  struct PackedLayer {
    std::vector<float> input_norm;
    std::vector<float> qkv_proj;  ///< [(Hq + 2 Hkv) * D, hidden]
    /// [(Hq + 2 Hkv) * D] (q, k, v biases), added after the qkv GEMM; empty when the config
    /// has no q/k/v bias. A device implementation must add it too (or refuse the model).
    std::vector<float> qkv_bias;
    std::vector<float> o_proj;
    std::vector<float> post_norm;
    std::vector<float> gate_up;   ///< [2 * intermediate, hidden]
    std::vector<float> down_proj;
  };
  /// Read access for device implementations (model/cuda uploads these once).
  const std::vector<PackedLayer>& packed_layers() const { return packed_; }
  const std::vector<float>& embed_weights() const { return embed_; }
  /// The output projection [vocab, hidden] (the embedding when tied).
  const std::vector<float>& lm_head_weights() const { return lm_head_.empty() ? embed_ : lm_head_; }
  const std::vector<float>& final_norm_weights() const { return final_norm_; }
  const Rope& rope() const { return rope_; }

 private:

  ModelConfig config_;
  std::vector<float> embed_;
  std::vector<float> lm_head_;  ///< empty when tied (embed_ is used)
  std::vector<float> final_norm_;
  std::vector<PackedLayer> packed_;
  std::vector<attention::AttentionLayer> layers_;
  Rope rope_;
  // Scratch, resized per forward.
  std::vector<float> x_, h_, qkv_, q_, k_, v_, attn_, mlp_, act_, sel_;
};

}  // namespace pagoda::model
