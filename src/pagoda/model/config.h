#pragma once
/// ModelConfig: the hyper-parameters of a Llama-family decoder (Llama 2/3/3.1/3.2, Qwen2/2.5 with
/// q/k/v biases, Mistral with a sliding window, Gemma 2 and Gemma 3 text: interleaved local /
/// global layers, soft caps, GeGLU, sandwich norms, q/k norms, scaled embeddings). Filled from a
/// Hugging Face config.json (strictly: see config_from_hf_json) or from builtin_tiny_config().
/// DeepSeek-V2 / V3 (dense MLP layers only) use multi-head latent attention: ModelConfig::mla.
/// A plain value; validate() checks it.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "pagoda/core/dtype.h"

namespace pagoda::model {

/// The Hugging Face architecture a config came from (it decides the config defaults and the
/// `architectures` entry save_hf_checkpoint writes). The computation is the same decoder for all;
/// the differences are data: qkv_bias, layer_window, rope.
enum class ModelFamily : uint8_t {
  kLlama,       ///< LlamaForCausalLM (model_type "llama")
  kMistral,     ///< MistralForCausalLM (model_type "mistral")
  kQwen2,       ///< Qwen2ForCausalLM (model_type "qwen2")
  kGemma2,      ///< Gemma2ForCausalLM (model_type "gemma2")
  kGemma3,      ///< Gemma3ForCausalLM (model_type "gemma3_text": the text-only Gemma 3)
  kDeepseekV2,  ///< DeepseekV2ForCausalLM (model_type "deepseek_v2"): MLA, dense MLP only
  kDeepseekV3,  ///< DeepseekV3ForCausalLM (model_type "deepseek_v3"): MLA, dense MLP only
  kDeepseekV32,  ///< DeepseekV32ForCausalLM (model_type "deepseek_v32"): MLA + DSA, dense MLP
  kBamba,  ///< BambaForCausalLM (model_type "bamba"): Mamba2 layers beside attention layers
};

/// "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Gemma2ForCausalLM",
/// "Gemma3ForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM",
/// "DeepseekV32ForCausalLM", "BambaForCausalLM".
std::string_view hf_architecture_name(ModelFamily f);
/// config.json's model_type: "llama", "mistral", "qwen2", "gemma2", "gemma3_text",
/// "deepseek_v2", "deepseek_v3", "deepseek_v32", "bamba".
std::string_view hf_model_type(ModelFamily f);
/// Gemma 2 or Gemma 3.
bool is_gemma_family(ModelFamily f);
/// DeepSeek-V2, V3 or V3.2.
bool is_deepseek_family(ModelFamily f);

/// Upper bounds config validation enforces before anything is allocated (generous: ~16x the
/// largest open models), so products of sizes stay far from int64 overflow.
inline constexpr int64_t kMaxModelDim = int64_t{1} << 20;  ///< hidden, intermediate
inline constexpr int64_t kMaxVocabSize = int64_t{1} << 24;
inline constexpr int64_t kMaxLayers = 4096;
inline constexpr int64_t kMaxHeads = 4096;  ///< q or kv heads
inline constexpr int64_t kMaxHeadDim = 4096;
inline constexpr int64_t kMaxPositions = int64_t{1} << 30;       ///< max_position_embeddings
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 40;  ///< one weight matrix

/// RoPE frequency scaling (HF `rope_scaling`).
enum class RopeScalingKind : uint8_t {
  kNone,
  kLinear,  ///< inv_freq / factor (positions interpolated)
  kLlama3,  ///< Llama 3.1 piecewise low/high-frequency scaling
  kYarn,    ///< YaRN as DeepSeek-V2/V3 apply it (ramp between interpolated and original)
};

struct RopeConfig {
  double theta = 10000.0;
  RopeScalingKind scaling = RopeScalingKind::kNone;
  double factor = 1.0;                   ///< linear and llama3
  double low_freq_factor = 1.0;          ///< llama3
  double high_freq_factor = 4.0;         ///< llama3
  int64_t original_max_position = 8192;  ///< llama3 / yarn original_max_position_embeddings
  double beta_fast = 32.0;               ///< yarn: rotations at the high-frequency end
  double beta_slow = 1.0;                ///< yarn: rotations at the low-frequency end
  double mscale = 1.0;                   ///< yarn: cos/sin scale get_mscale(factor, mscale) / ...
  double mscale_all_dim = 0.0;           ///< ... get_mscale(factor, mscale_all_dim); softmax scale
};

/// YaRN's magnitude correction: 1 for factor <= 1, else 0.1 · m · ln(factor) + 1 (DeepSeek's
/// yarn_get_mscale).
double yarn_get_mscale(double factor, double m);

/// Multi-head latent attention (DeepSeek-V2/V3). kv_lora_rank 0 = not an MLA model. Per layer:
/// q = [q_a_norm(h·W_qaᵀ)]·W_qbᵀ (q LoRA, q_lora_rank > 0) or h·W_qᵀ, [Hq, nope + rope];
/// [c, k_pe] = h·W_kvaᵀ; latent = rms_norm(c)·w_kva_norm (kv_lora_rank); k_pe is one RoPE head
/// shared by all q heads; kv_b_proj [Hq·(nope + v), kv_lora_rank] expands the latent to each
/// head's k_nope and v. RoPE on the rope parts is DeepSeek's interleaved pairs (2i, 2i + 1).
struct MlaConfig {
  int q_lora_rank = 0;  ///< 0 = no q LoRA (q_proj)
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
};

/// DeepSeek sparse attention (DeepSeek-V3.2's lightning indexer; model/dsa_indexer.h), on every
/// layer when index_topk > 0 (needs MLA with q LoRA). Per layer, with qa the normed q LoRA
/// latent and h the layer's normed hidden state:
///   q_idx = qa·W_qbᵀ [index_n_heads, index_head_dim]; k_idx = LayerNorm(h·W_kᵀ) [index_head_dim];
///   RoPE (NeoX half-split, the model's frequencies) on the first qk_rope_head_dim of each;
///   w = h·W_wᵀ · n_heads^-½ · index_head_dim^-½;  score(t, s) = Σ_h w_h · ReLU(q_idx_h · k_idx_s)
/// over the causally visible tokens s; attention then sees only the index_topk best.
struct DsaConfig {
  int index_n_heads = 0;
  int index_head_dim = 0;
  int index_topk = 0;  ///< 0 = dense MLA
};

/// The Mamba2 (SSD) layers of a hybrid model (Bamba's mamba_* fields; model/mamba2_mixer.h
/// computes one). num_heads 0 = no linear layers.
struct MambaConfig {
  int num_heads = 0;    ///< mamba_n_heads
  int head_dim = 0;     ///< mamba_d_head; num_heads · head_dim = d_inner = mamba_expand · hidden
  int state_size = 0;   ///< mamba_d_state
  int num_groups = 1;   ///< mamba_n_groups (divides num_heads)
  int conv_kernel = 4;  ///< mamba_d_conv
  int chunk_size = 256; ///< mamba_chunk_size
  bool conv_bias = true;   ///< mamba_conv_bias: conv1d.bias present
  bool proj_bias = false;  ///< mamba_proj_bias: in_proj.bias and out_proj.bias present
  double dt_min = 0.0;     ///< time_step_limit[0] (Δ is clamped to [dt_min, dt_max])
  double dt_max = 0.0;     ///< time_step_limit[1]; +inf = no upper bound

  int d_inner() const { return num_heads * head_dim; }
  int conv_dim() const { return d_inner() + 2 * num_groups * state_size; }
};

/// The MLP's gate activation: out = act(gate) * up.
enum class Activation : uint8_t {
  kSilu,      ///< SwiGLU (HF "silu")
  kGeluTanh,  ///< GeGLU with the tanh approximation (HF "gelu_pytorch_tanh")
};

struct ModelConfig {
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float rms_norm_eps = 1e-5f;
  RopeConfig rope;
  int max_position_embeddings = 4096;
  bool tie_word_embeddings = false;
  /// Per-layer attention window in FlashInfer convention (a query sees W + 1 keys: HF
  /// sliding_window - 1); -1 = full attention. Empty = every layer full. Size num_layers otherwise.
  std::vector<int> layer_window;
  float attn_logit_softcap = 0.f;   ///< tanh soft cap on attention scores; 0 disables
  float final_logit_softcap = 0.f;  ///< tanh soft cap on the LM-head logits; 0 disables
  int bos_token_id = -1;            ///< -1 = none
  int eos_token_id = -1;            ///< -1 = none
  std::string name = "custom";      ///< for display ("builtin-tiny", the checkpoint folder, ...)
  ModelFamily family = ModelFamily::kLlama;
  /// q/k/v projections carry a bias (Qwen2, or Llama with attention_bias: true): LayerWeights
  /// q_bias/k_bias/v_bias are [Hq * D], [Hkv * D], [Hkv * D] and q = h·Wqᵀ + b_q (same for k, v).
  bool qkv_bias = false;
  /// The checkpoint's declared weight dtype (config.json torch_dtype / dtype): kF32, kF16 or
  /// kBF16. kF32 when the key is absent (HF's default) and for the built-in model. Weights are
  /// converted to f32 on load whatever this says; it is the default compute dtype to pick.
  DType weights_dtype = DType::kF32;

  // ---- Gemma (2 and 3) ----
  Activation activation = Activation::kSilu;
  /// RMSNorm scales by (1 + w) instead of w (Gemma's checkpoints store w - 1). LlamaModel adds
  /// the 1 when it packs the weights; ModelWeights keep the checkpoint's values.
  bool norm_weight_offset = false;
  /// The embedding rows are multiplied by this before layer 0 (Gemma: sqrt(hidden_size)); the
  /// tied LM head uses the unscaled table.
  float embed_scale = 1.f;
  /// Sandwich norms (Gemma): the attention output and the MLP output are each RMS-normalised
  /// (LayerWeights::attn_out_norm / mlp_out_norm) before they join the residual stream.
  bool sandwich_norms = false;
  /// Per-head RMSNorm of q and k before RoPE (Gemma 3: LayerWeights::q_norm / k_norm, [head_dim]).
  bool qk_norm = false;
  /// Attention scores are scaled by 1 / sqrt(this) (HF query_pre_attn_scalar); 0 = head_dim.
  double query_pre_attn_scalar = 0.0;
  /// RoPE of the sliding-window layers (Gemma 3: theta rope_local_base_freq, no scaling);
  /// theta 0 = the sliding layers use `rope` like the others.
  RopeConfig local_rope{.theta = 0.0};

  // ---- DeepSeek (MLA) ----
  /// kv_lora_rank > 0: every layer is MLA; head_dim is then qk_nope + qk_rope (the q·k width
  /// of the non-absorbed form) and num_kv_heads == num_q_heads.
  MlaConfig mla;
  bool is_mla() const { return mla.kv_lora_rank > 0; }
  /// DeepSeek-V3.2 (DeepseekV32ForCausalLM): DSA over the MLA layers.
  DsaConfig dsa;
  bool is_dsa() const { return dsa.index_topk > 0; }
  /// The rotary width: qk_rope_head_dim for MLA, head_dim otherwise.
  int rope_dim() const { return is_mla() ? mla.qk_rope_head_dim : head_dim; }

  // ---- Hybrid (Bamba: Mamba2 layers beside attention layers) ----
  /// RoPE on the first rotary_dim of each head's head_dim (NeoX pairs (i, i + rotary_dim / 2)
  /// inside them); the rest passes through. 0 = the whole head (every family but Bamba, whose
  /// transformers config fixes partial_rotary_factor 0.5). LlamaModel maps it onto the full-
  /// width NeoX RoPE (llama.h).
  int rotary_dim = 0;
  /// The Mamba2 layers' sizes (mamba.num_heads > 0 when linear_layer has an entry set).
  MambaConfig mamba;
  /// linear_layer[l] != 0: layer l is a Mamba2 layer (no attention, no KV; its state lives in
  /// a kv::StatePool slot per sequence). Empty = every layer attends.
  std::vector<uint8_t> linear_layer;
  bool is_linear_layer(int l) const { return !linear_layer.empty() && linear_layer[l] != 0; }
  /// Some layer is a Mamba2 layer (the model needs a state pool).
  bool has_linear_layers() const;
  /// Layers that attend (and keep KV).
  int num_attention_layers() const;
  int num_linear_layers() const { return num_layers - num_attention_layers(); }

  /// Window of layer `l` (-1 = full attention).
  int window_of(int l) const { return layer_window.empty() ? -1 : layer_window[l]; }
  /// The RoPE of layer `l`: local_rope for sliding layers when it is set, else rope.
  const RopeConfig& rope_of(int l) const {
    return local_rope.theta > 0.0 && window_of(l) >= 0 ? local_rope : rope;
  }
  /// The attention score scale: 1 / sqrt(query_pre_attn_scalar or head_dim); with YaRN and
  /// mscale_all_dim (DeepSeek) times yarn_get_mscale(factor, mscale_all_dim)².
  float attention_scaling() const;
  bool has_sliding_window() const;
  /// Parameters (elements), for display.
  int64_t num_parameters() const;
  /// Throws Error(kInvalidArgument) naming the first bad field (non-positive or absurd sizes
  /// beyond the kMax* bounds, heads not dividing, windows, token ids, dtype).
  void validate() const;

 private:
  void validate_mla() const;
  void validate_mamba() const;
};

/// The built-in tiny model: byte-level vocabulary (256 bytes + BOS 256 + EOS 257, padded to 320),
/// 4 layers, hidden 256, 4 query heads / 2 KV heads of dim 64, SwiGLU 768, untied LM head,
/// theta 10000, max context 4096.
ModelConfig builtin_tiny_config();

/// Parses a Hugging Face config.json object of a LlamaForCausalLM, MistralForCausalLM,
/// Qwen2ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM (gemma3_text) or
/// BambaForCausalLM (config_bamba.cpp: attn_layer_indices, the mamba_* fields, partial RoPE
/// 0.5; anything Bamba does not compute exactly is Error naming the field),
/// DeepseekV2ForCausalLM / DeepseekV3ForCausalLM (config_deepseek.cpp: MLA, YaRN, dense MLP
/// only: any layer with routed experts is Error(kUnsupported) naming the field) checkpoint
/// (`architectures`, else `model_type`, names the family; one of the two must be present).
/// Gemma keys (hidden_activation, query_pre_attn_scalar, rope_local_base_freq,
/// sliding_window_pattern, use_bidirectional_attention, soft caps) are read for those families
/// and refused on the others; keys transformers' Gemma ignores (use_sliding_window, mlp_bias,
/// ...) are refused on Gemma. Gemma 2 slides the even layers, Gemma 3 all but every
/// sliding_window_pattern-th (default 6), unless layer_types says otherwise. Strict: every key must
/// be one it implements (sizes, rope, windows, biases, token ids, soft caps) or known harmless
/// metadata (transformers_version, use_cache, initializer_range, dropout rates, pad_token_id, ...);
/// anything else that could change the computation is Error(kUnsupported) naming the key (e.g.
/// mlp_bias: true, hidden_act other than silu, rope_scaling "dynamic"/"yarn", pretraining_tp != 1,
/// quantization_config). Numbers are type- and range-checked before use: a string, a float where an
/// integer belongs, a negative or absurd size is Error(kInvalidArgument) naming the key. Missing
/// optional keys take the family's HF defaults (Mistral sliding_window 4096, Qwen2
/// use_sliding_window false).
ModelConfig config_from_hf_json(const nlohmann::json& j);

/// A config.json as Python's json module writes it: strict JSON plus its literals Infinity and
/// -Infinity (transformers' BambaConfig saves time_step_limit = (0.0, inf) that way), which
/// nlohmann rejects. Outside strings they are read as ±DBL_MAX, which every bound that takes
/// infinity treats alike (a limit no finite value reaches); NaN stays a parse error. Throws what
/// nlohmann::json::parse throws.
nlohmann::json parse_config_json(std::string_view text);

}  // namespace pagoda::model
