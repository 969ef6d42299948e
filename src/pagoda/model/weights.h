#pragma once
/// ModelWeights: the parameters of a Llama-family decoder in Hugging Face layout, f32 but for
/// the dense GEMM matrices a checkpoint loaded with LoadOptions::keep_bf16 keeps in bf16
/// (LayerWeights::bf16). Every linear weight is row-major [out_features, in_features]
/// (y = x · Wᵀ). Host memory, owned.

#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/model/config.h"

namespace pagoda::model {

/// A dense layer's GEMM matrices as bf16 bits, from a BF16 checkpoint loaded with
/// LoadOptions::keep_bf16 (safetensors.h): each one filled here replaces the f32 field of the same
/// name in LayerWeights, which is then empty. Attention layers of Llama-family models only (MLA
/// and Mamba2 mixer weights stay f32); empty otherwise.
struct Bf16Matrices {
  std::vector<uint16_t> q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
};

struct LayerWeights {
  std::vector<float> input_norm;  ///< [hidden]
  std::vector<float> q_proj;      ///< [Hq * D, hidden]
  std::vector<float> k_proj;      ///< [Hkv * D, hidden]
  std::vector<float> v_proj;      ///< [Hkv * D, hidden]
  std::vector<float> q_bias;      ///< [Hq * D] when config.qkv_bias, else empty
  std::vector<float> k_bias;      ///< [Hkv * D] when config.qkv_bias, else empty
  std::vector<float> v_bias;      ///< [Hkv * D] when config.qkv_bias, else empty
  std::vector<float> o_proj;      ///< [hidden, Hq * D]
  std::vector<float> post_norm;   ///< [hidden]
  std::vector<float> gate_proj;   ///< [intermediate, hidden]
  std::vector<float> up_proj;     ///< [intermediate, hidden]
  std::vector<float> down_proj;   ///< [hidden, intermediate]
  // Gemma (empty otherwise). post_norm above is Gemma's pre_feedforward_layernorm.
  std::vector<float> attn_out_norm;  ///< [hidden] when config.sandwich_norms (HF Gemma's
                                     ///< post_attention_layernorm, on the attention output)
  std::vector<float> mlp_out_norm;   ///< [hidden] when config.sandwich_norms
                                     ///< (post_feedforward_layernorm)
  std::vector<float> q_norm;         ///< [head_dim] when config.qk_norm
  std::vector<float> k_norm;         ///< [head_dim] when config.qk_norm
  // DeepSeek MLA (config.is_mla(); empty otherwise, and k_proj / v_proj are empty). q_proj is
  // [Hq·(nope + rope), hidden] without q LoRA, empty with it. o_proj is [hidden, Hq·v].
  std::vector<float> q_a_proj;   ///< [q_lora, hidden] (q LoRA)
  std::vector<float> q_a_norm;   ///< [q_lora] (q LoRA)
  std::vector<float> q_b_proj;   ///< [Hq·(nope + rope), q_lora] (q LoRA)
  std::vector<float> kv_a_proj;  ///< [kv_lora + rope, hidden] (kv_a_proj_with_mqa)
  std::vector<float> kv_a_norm;  ///< [kv_lora] (kv_a_layernorm)
  std::vector<float> kv_b_proj;  ///< [Hq·(nope + v), kv_lora]: per head k_nope rows, then v
  // DeepSeek-V3.2's indexer (config.is_dsa(); empty otherwise; HF self_attn.indexer.*), with
  // In = index_n_heads, Id = index_head_dim.
  std::vector<float> idx_wq_b;          ///< [In·Id, q_lora] (indexer.wq_b)
  std::vector<float> idx_wk;            ///< [Id, hidden] (indexer.wk)
  std::vector<float> idx_k_norm;        ///< [Id] (indexer.k_norm.weight, a LayerNorm)
  std::vector<float> idx_k_norm_bias;   ///< [Id] (indexer.k_norm.bias)
  std::vector<float> idx_weights_proj;  ///< [In, hidden] (indexer.weights_proj)
  // A Mamba2 layer (config.is_linear_layer(l); q/k/v/o_proj empty then; HF mamba.*), with
  // P = d_inner + conv_dim + n_heads the in_proj rows. post_norm is Bamba's pre_ff_layernorm.
  std::vector<float> ssm_in_proj;    ///< [P, hidden] (in_proj: z, xBC, dt)
  std::vector<float> ssm_in_bias;    ///< [P] when mamba.proj_bias
  std::vector<float> ssm_conv;       ///< [conv_dim, d_conv] (conv1d.weight [conv_dim, 1, K])
  std::vector<float> ssm_conv_bias;  ///< [conv_dim] when mamba.conv_bias
  std::vector<float> ssm_dt_bias;    ///< [n_heads]
  std::vector<float> ssm_a_log;      ///< [n_heads] (A_log)
  std::vector<float> ssm_d;          ///< [n_heads] (D)
  std::vector<float> ssm_norm;       ///< [d_inner] (the gated RMSNorm's weight)
  std::vector<float> ssm_out_proj;   ///< [hidden, d_inner]
  std::vector<float> ssm_out_bias;   ///< [hidden] when mamba.proj_bias
  Bf16Matrices bf16;                 ///< the bf16 form of q/k/v/o and gate/up/down (see above)
};

struct ModelWeights {
  std::vector<float> embed;  ///< [vocab, hidden]; empty when embed_bf16 holds it
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  ///< [hidden]
  std::vector<float> lm_head;     ///< [vocab, hidden]; empty when tied to `embed` (or in bf16)
  /// The embedding / LM head as bf16 bits, from a BF16 checkpoint loaded with
  /// LoadOptions::keep_bf16 (the f32 field is then empty; both lm_head forms empty when tied).
  std::vector<uint16_t> embed_bf16, lm_head_bf16;

  /// The LM-head matrix [vocab, hidden] (the embedding when tied).
  const std::vector<float>& lm_head_matrix() const { return lm_head.empty() ? embed : lm_head; }
  /// Throws Error(kInvalidArgument) naming the first tensor whose size does not match `config`
  /// (including a q/k/v bias present when config.qkv_bias is false, or missing when true, a
  /// matrix given both in f32 and in bf16, and a bf16 matrix on an MLA or Mamba2 layer).
  void validate(const ModelConfig& config) const;
};

/// bf16 bits widened to f32 (exact).
std::vector<float> widened_bf16(std::span<const uint16_t> bits);

/// Deterministic random weights from `seed` (same seed, same config → identical bits).
/// Scales keep activations O(1) so logits are well separated: embedding N(0, 1), linear
/// weights N(0, 1/in_features), norm weights 1 + N(0, 0.1²) (N(0, 0.1²) with
/// config.norm_weight_offset, whose norms scale by 1 + w), q/k/v biases (when config.qkv_bias)
/// N(0, 0.5²); MLA projections N(0, 1/in_features), their norms like the others; the DSA
/// indexer (drawn last) linears N(0, 1/in_features), its LayerNorm 1 + N(0, 0.1²) and bias
/// N(0, 0.1²); Mamba2 layers (drawn after that) in/out_proj N(0, 1/in_features), conv
/// N(0, 1/d_conv), biases N(0, 0.1²), dt_bias N(-1, 0.5²), A_log log U(1, 16), D 1 + N(0, 0.1²),
/// the gated norm 1 + N(0, 0.1²). Configs
/// without biases, Gemma norms or MLA draw exactly the numbers they always did.
ModelWeights make_random_weights(const ModelConfig& config, uint64_t seed);

}  // namespace pagoda::model
