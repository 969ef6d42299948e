#pragma once
/// LlamaModel: a Llama-family decoder's definition on the host: the validated config, the f32
/// weights packed for the forward pass (q/k/v and gate/up fused, the q/k/v bias when the family
/// has one), the per-layer attention parameters and the RoPE table. It computes nothing itself:
/// the one layer loop is Decoder (decoder.h), run by a ModelWorker (llama_worker.h).
/// Immutable after construction; safe to share between threads.

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
};

}  // namespace pagoda::model
