#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/model/config.h"
#include "pagoda/model/ops.h"

namespace pagoda::model {
namespace {

TEST(ModelConfig, BuiltinIsValid) {
  const ModelConfig c = builtin_tiny_config();
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_GE(c.vocab_size, 258);
  EXPECT_GT(c.num_parameters(), 0);
}

TEST(ModelConfig, ParsesHfLlama3) {
  const auto j = nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "vocab_size": 1000, "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 3,
    "num_attention_heads": 8, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "max_position_embeddings": 2048, "tie_word_embeddings": true,
    "bos_token_id": 1, "eos_token_id": [2, 3],
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}})");
  const ModelConfig c = config_from_hf_json(j);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_id, 2);
  EXPECT_EQ(c.rope.scaling, RopeScalingKind::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope.factor, 8.0);
  EXPECT_FALSE(c.has_sliding_window());
}

TEST(ModelConfig, ParsesTransformers5RopeParameters) {
  const auto j = nlohmann::json::parse(R"({
    "model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 2,
    "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1234.0}})");
  const ModelConfig c = config_from_hf_json(j);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1234.0);
  EXPECT_EQ(c.rope.scaling, RopeScalingKind::kLinear);
  EXPECT_DOUBLE_EQ(c.rope.factor, 2.0);
}

TEST(ModelConfig, ParsesSlidingWindowLayerTypes) {
  const auto j = nlohmann::json::parse(R"({
    "model_type": "qwen2", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 2, "sliding_window": 16,
    "use_sliding_window": true,
    "layer_types": ["sliding_attention", "full_attention"]})");
  const ModelConfig c = config_from_hf_json(j);
  EXPECT_EQ(c.window_of(0), 15);
  EXPECT_EQ(c.window_of(1), -1);
}

TEST(ModelConfig, RejectsBadInput) {
  ModelConfig c = builtin_tiny_config();
  c.num_kv_heads = 3;
  EXPECT_THROW(c.validate(), Error);
  auto j = nlohmann::json::parse(R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
    "rope_scaling": {"type": "yarn", "factor": 4.0}})");
  try {
    config_from_hf_json(j);
    FAIL() << "yarn accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
  j = nlohmann::json::parse(R"({"vocab_size": 100})");
  EXPECT_THROW(config_from_hf_json(j), Error);
}

TEST(Rope, LinearScalingDividesFrequencies) {
  RopeConfig base{.theta = 10000.0};
  RopeConfig lin{.theta = 10000.0, .scaling = RopeScalingKind::kLinear, .factor = 4.0};
  const Rope a(base, 64), b(lin, 64);
  for (size_t i = 0; i < a.inv_freq().size(); ++i)
    EXPECT_DOUBLE_EQ(a.inv_freq()[i] / 4.0, b.inv_freq()[i]);
}

TEST(Rope, PositionZeroIsIdentityAndNormIsKept) {
  const Rope r(RopeConfig{}, 8);
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<float> orig = x;
  const int32_t p0 = 0;
  r.apply(x.data(), std::span(&p0, 1), 1);
  EXPECT_EQ(x, orig);
  const int32_t p = 17;
  r.apply(x.data(), std::span(&p, 1), 1);
  double n0 = 0, n1 = 0;
  for (int i = 0; i < 8; ++i) {
    n0 += orig[i] * orig[i];
    n1 += x[i] * x[i];
  }
  EXPECT_NEAR(n0, n1, 1e-3);
  EXPECT_NE(x, orig);
}

}  // namespace
}  // namespace pagoda::model
