#pragma once
/// ModelConfig: the hyper-parameters of a Llama-family decoder (Llama 2/3, Mistral-style sliding
/// window, optional Gemma-2-style soft caps). Filled from a Hugging Face config.json or from
/// builtin_tiny_config(). A plain value; validate() checks it.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace pagoda::model {

/// RoPE frequency scaling (HF `rope_scaling`).
enum class RopeScalingKind : uint8_t {
  kNone,
  kLinear,  ///< inv_freq / factor (positions interpolated)
  kLlama3,  ///< Llama 3.1 piecewise low/high-frequency scaling
};

struct RopeConfig {
  double theta = 10000.0;
  RopeScalingKind scaling = RopeScalingKind::kNone;
  double factor = 1.0;                      ///< linear and llama3
  double low_freq_factor = 1.0;             ///< llama3
  double high_freq_factor = 4.0;            ///< llama3
  int64_t original_max_position = 8192;     ///< llama3 original_max_position_embeddings
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

  /// Window of layer `l` (-1 = full attention).
  int window_of(int l) const { return layer_window.empty() ? -1 : layer_window[l]; }
  bool has_sliding_window() const;
  /// Parameters (elements), for display.
  int64_t num_parameters() const;
  /// Throws Error(kInvalidArgument) naming the first bad field.
  void validate() const;
};

/// The built-in tiny model: byte-level vocabulary (256 bytes + BOS 256 + EOS 257, padded to 320),
/// 4 layers, hidden 256, 4 query heads / 2 KV heads of dim 64, SwiGLU 768, untied LM head,
/// theta 10000, max context 4096.
ModelConfig builtin_tiny_config();

/// Parses a Hugging Face LlamaForCausalLM / MistralForCausalLM config.json object. Missing
/// optional keys take HF defaults. Throws Error(kInvalidArgument / kUnsupported) on bad or
/// unsupported values (e.g. an unknown rope_scaling type).
ModelConfig config_from_hf_json(const nlohmann::json& j);

}  // namespace pagoda::model
