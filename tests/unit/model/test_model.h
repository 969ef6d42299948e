#pragma once
// The small model the unit tests run: fast under ASan, head_dim 64 (every backend supports it).

#include "pagoda/model/config.h"

namespace pagoda::testing {

inline model::ModelConfig test_model_config() {
  model::ModelConfig c = model::builtin_tiny_config();
  c.vocab_size = 300;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.num_layers = 2;
  c.num_q_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.max_position_embeddings = 512;
  c.name = "test-tiny";
  return c;
}

/// test_model_config() shaped like Qwen2/2.5: q/k/v biases, tied embeddings, theta 1e6,
/// eps 1e-6.
inline model::ModelConfig qwen2_test_config() {
  model::ModelConfig c = test_model_config();
  c.family = model::ModelFamily::kQwen2;
  c.qkv_bias = true;
  c.tie_word_embeddings = true;
  c.rope.theta = 1e6;
  c.rms_norm_eps = 1e-6f;
  c.name = "test-qwen2";
  return c;
}

/// A small DeepSeek-V3-style config: q LoRA, YaRN with both mscales != 1, v != nope.
inline model::ModelConfig mla_test_config(bool q_lora) {
  model::ModelConfig c;
  c.family = model::ModelFamily::kDeepseekV3;
  c.vocab_size = 320;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.num_layers = 2;
  c.num_q_heads = 4;
  c.num_kv_heads = 4;
  c.mla = model::MlaConfig{.q_lora_rank = q_lora ? 48 : 0,
                           .kv_lora_rank = 32,
                           .qk_nope_head_dim = 16,
                           .qk_rope_head_dim = 8,
                           .v_head_dim = 12};
  c.head_dim = 24;
  c.rope = model::RopeConfig{.theta = 10000.0,
                             .scaling = model::RopeScalingKind::kYarn,
                             .factor = 4.0,
                             .original_max_position = 32,
                             .mscale = 0.8,
                             .mscale_all_dim = 0.6};
  c.bos_token_id = 256;
  c.eos_token_id = 257;
  c.name = "mla-test";
  return c;
}

}  // namespace pagoda::testing
