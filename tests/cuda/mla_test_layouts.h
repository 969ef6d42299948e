#pragma once
// The DeepSeek MLA configs of tools/make_checkpoint.py's tiny layouts (deepseek-v2-tiny: no q
// LoRA, no RoPE scaling; deepseek-v3-tiny: q LoRA, YaRN with both mscales, v != nope, experts
// declared but every layer dense), as their config.json texts, for the GPU engine tests.
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "pagoda/model/config.h"

namespace pagoda {

struct MlaLayout {
  std::string name;
  const char* json;
};

inline const MlaLayout kMlaLayouts[] = {
    {"deepseek_v2_tiny", R"({
      "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
      "vocab_size": 4096, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3,
      "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": null,
      "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
      "rope_theta": 10000.0, "rope_scaling": null, "max_position_embeddings": 4096,
      "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "hidden_act": "silu",
      "attention_bias": false, "n_routed_experts": null, "first_k_dense_replace": 0,
      "moe_layer_freq": 1, "bos_token_id": 4000, "eos_token_id": 4001})"},
    {"deepseek_v3_tiny", R"({
      "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
      "vocab_size": 4096, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3,
      "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 96,
      "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 24,
      "rope_theta": 10000.0,
      "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                       "beta_fast": 32, "beta_slow": 1, "mscale": 0.8, "mscale_all_dim": 0.6},
      "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
      "hidden_act": "silu", "attention_bias": false, "n_routed_experts": 8,
      "n_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
      "first_k_dense_replace": 3, "moe_layer_freq": 1, "num_nextn_predict_layers": 0,
      "topk_method": "noaux_tc", "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5,
      "scoring_func": "sigmoid", "norm_topk_prob": true, "bos_token_id": 4000,
      "eos_token_id": 4001})"},
};

inline void PrintTo(const MlaLayout& l, std::ostream* os) {
  *os << l.name;
}

/// The layout's ModelConfig, parsed as a checkpoint's config.json is.
inline model::ModelConfig mla_layout_config(const MlaLayout& l) {
  return model::config_from_hf_json(nlohmann::json::parse(l.json));
}

}  // namespace pagoda
