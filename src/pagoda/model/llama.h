#pragma once
/// LlamaModel: a Llama-family decoder's definition on the host: the validated config, the
/// weights (f32, or bf16 for the dense GEMM matrices a checkpoint kept in bf16) packed for the
/// forward pass (q/k/v and gate/up fused, the q/k/v bias when the family
/// has one, Gemma's norm scales as 1 + w; DeepSeek's kv_b_proj split per head into the absorbed
/// W_UK / W_UV), the per-layer attention parameters (MLA: the absorbed form, Dqk = kv_lora +
/// rope, Dv = kv_lora, one latent KV head) and the RoPE tables (a second one for Gemma 3's local
/// layers; MLA: qk_rope_head_dim wide). A partial RoPE (config.rotary_dim < head_dim: Bamba)
/// runs as the full-width NeoX RoPE: q/k projection rows are reordered per head so that its
/// pairs are the NeoX pairs (j, j + head_dim/2), whose frequencies past rotary_dim/2 are 0
/// (q·k is unchanged, and the KV pool keeps k in that order). Bamba's Mamba2 layers keep their
/// mixer weights (PackedLayer::ssm_*) and no attention weights; the KV pool then holds the
/// attention layers only (pool_layer). It computes nothing itself: the one layer
/// loop is Decoder (decoder.h), run by a ModelWorker (llama_worker.h). Immutable after
/// construction; safe to share between threads.

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
  /// weights for the forward pass (q/k/v and gate/up fused). Pass `std::move(weights)` where the
  /// caller is done with them: the large matrices are then moved, and each layer's q/k/v and
  /// gate/up freed once fused, so loading holds about one copy of the model instead of two
  /// (an lvalue is copied first).
  LlamaModel(ModelConfig config, ModelWeights weights);

  const ModelConfig& config() const { return config_; }
  /// The per-layer attention parameters handed to the backend (layer_id = index).
  const std::vector<attention::AttentionLayer>& attention_layers() const { return layers_; }
  /// What a backend must support to run this model (f32 q and KV; absorbed MLA for DeepSeek).
  attention::BackendRequirements backend_requirements(int page_size) const;
  /// Which layers a KV pool stores: all of them (one pool), or with the SWA pool (two pools split
  /// by layer kind) the full-attention layers or the layers with a window.
  enum class PoolLayers : uint8_t { kAll, kFull, kWindow };
  /// A KV pool shape for this model: f32, num_kv_heads, head_dim, and the number of layers
  /// `which` names; MLA: one latent row of kv_lora_rank + qk_rope_head_dim per token ([normed
  /// latent | roped k_pe]).
  kv::KvPoolConfig kv_pool_config(int32_t num_pages, int32_t page_size,
                                  PoolLayers which = PoolLayers::kAll) const;
  /// Layer l's index in the pool that stores it: l with one pool; with Mamba2 layers (hybrid
  /// models) its rank among the attention layers (a Mamba2 layer has none: kInvalidArgument);
  /// with pools split by kind
  /// (`split`), its rank among the layers of its kind (full-attention layers 0, 1, ... in the
  /// full pool, window layers 0, 1, ... in the SWA pool).
  LayerId pool_layer(int l, bool split) const;


 public:
  /// The dense GEMM matrices a layer keeps in bf16 (bits) when the weights came with them
  /// (LayerWeights::bf16, each fused group only when all its parts were bf16); each one filled
  /// replaces PackedLayer's f32 field of the same name, which is then empty.
  struct Bf16Packed {
    std::vector<uint16_t> qkv_proj, o_proj, gate_up, down_proj;
  };
  /// One layer's weights as the forward pass uses them (f32 but for `bf16`, HF [out, in] layout).
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
    // Gemma (empty otherwise; see LayerWeights), scales already 1 + w.
    std::vector<float> attn_out_norm;
    std::vector<float> mlp_out_norm;
    std::vector<float> q_norm;
    std::vector<float> k_norm;
    // MLA (config.is_mla(); qkv_proj and qkv_bias are empty then). q_proj is the projection to
    // [Hq·(nope + rope)]: q_b_proj after q_a_proj + q_a_norm with q LoRA, else HF q_proj.
    std::vector<float> q_a_proj;   ///< [q_lora, hidden] (empty without q LoRA)
    std::vector<float> q_a_norm;   ///< [q_lora]
    std::vector<float> q_proj;     ///< [Hq·(nope + rope), q_lora or hidden]
    std::vector<float> kv_a_proj;  ///< [kv_lora + rope, hidden]
    std::vector<float> kv_a_norm;  ///< [kv_lora]
    /// Per head h, W_UKᵀ: [Hq][kv_lora, nope] (kv_b_proj's k_nope rows of head h, transposed):
    /// q_latent_h = q_nope_h·W_UK_h, the absorbed query.
    std::vector<float> w_uk_t;
    /// Per head h, W_UK: [Hq][nope, kv_lora] (kv_b_proj's k_nope rows of head h as they are):
    /// k_nope_h = latent·W_UK_hᵀ, the expanded prefill form's keys.
    std::vector<float> w_uk;
    /// Per head h, W_UV: [Hq][v, kv_lora] (kv_b_proj's v rows of head h): v_h = o_latent_h·W_UVᵀ.
    std::vector<float> w_uv;
    // DSA indexer (config.is_dsa(); LayerWeights' idx_* fields as they are).
    std::vector<float> idx_wq_b, idx_wk, idx_k_norm, idx_k_norm_bias, idx_weights_proj;
    // A Mamba2 layer (config.is_linear_layer; LayerWeights' ssm_* fields as they are, the
    // attention fields empty).
    std::vector<float> ssm_in_proj, ssm_in_bias, ssm_conv, ssm_conv_bias, ssm_dt_bias, ssm_a_log,
        ssm_d, ssm_norm, ssm_out_proj, ssm_out_bias;
    Bf16Packed bf16;
  };
  /// Elements of every weight array the forward uses (packed layers, embedding, LM head, final
  /// norm): a device copy holds this many values in the model dtype (engine pool sizing).
  int64_t weight_elements() const;
  /// Read access for device implementations (model/cuda uploads these once).
  const std::vector<PackedLayer>& packed_layers() const { return packed_; }
  /// The embedding [vocab, hidden] in f32; empty when the model keeps it in bf16 (embed_bf16).
  const std::vector<float>& embed_weights() const { return embed_; }
  /// The embedding as bf16 bits (LoadOptions::keep_bf16 on a BF16 checkpoint); else empty.
  const std::vector<uint16_t>& embed_bf16() const { return embed16_; }
  /// True when any weight is kept in bf16 (a BF16 checkpoint loaded with keep_bf16).
  bool has_bf16_weights() const;
  /// True when the output projection is the embedding (tied).
  bool lm_head_tied() const { return lm_head_.empty() && lm_head16_.empty(); }
  /// The output projection [vocab, hidden] in f32 (the embedding when tied); empty in bf16.
  const std::vector<float>& lm_head_weights() const { return lm_head_tied() ? embed_ : lm_head_; }
  /// The output projection as bf16 bits (the embedding's when tied); else empty.
  const std::vector<uint16_t>& lm_head_bf16() const {
    return lm_head_tied() ? embed16_ : lm_head16_;
  }
  /// The final norm's scale (1 + w for Gemma, as every packed norm weight).
  const std::vector<float>& final_norm_weights() const { return final_norm_; }
  const Rope& rope() const { return rope_; }
  /// The RoPE of layer `l` (Gemma 3's sliding layers have their own base; config.rope_of).
  const Rope& rope_of(int l) const {
    return config_.local_rope.theta > 0.0 && config_.window_of(l) >= 0 ? local_rope_ : rope_;
  }
  /// The sliding layers' RoPE (config.local_rope; equal to rope() when that is unset).
  const Rope& local_rope() const { return local_rope_; }

 private:
  /// Fills p's MLA fields from w (kv_b_proj split per head into W_UKᵀ and W_UV).
  void pack_mla(const LayerWeights& w, PackedLayer& p) const;

  ModelConfig config_;
  std::vector<float> embed_;
  std::vector<float> lm_head_;                 ///< empty when tied (embed_ is used) or in bf16
  std::vector<uint16_t> embed16_, lm_head16_;  ///< the bf16 forms (see embed_bf16())
  std::vector<float> final_norm_;
  std::vector<PackedLayer> packed_;
  std::vector<attention::AttentionLayer> layers_;
  Rope rope_;
  Rope local_rope_;  ///< a copy of rope_ unless config.local_rope is set
};

}  // namespace pagoda::model
