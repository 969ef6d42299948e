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

}  // namespace pagoda::testing
