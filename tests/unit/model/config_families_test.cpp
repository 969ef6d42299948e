// config_from_hf_json on real-shaped config.json texts of each supported family, the strictness
// rules (unknown keys, unsupported values), and hostile inputs (wrong types, negative and absurd
// sizes, overflowing products), including a seeded mutation loop that must only ever produce a
// valid config or a pagoda::Error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "config_test_util.h"
#include "pagoda/core/error.h"
#include "pagoda/model/config.h"

namespace pagoda::model {
namespace {

using nlohmann::json;

// Llama-3.1-8B-Instruct's config.json (transformers 4.43).
constexpr const char* kLlama31_8B = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})";

// Llama-3.2-1B (transformers 4.45): tied embeddings, explicit head_dim, llama3 factor 32.
constexpr const char* kLlama32_1B = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";

// Llama-2-7b-hf.
constexpr const char* kLlama2_7B = R"({
  "_name_or_path": "meta-llama/Llama-2-7b-hf", "architectures": ["LlamaForCausalLM"],
  "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "tie_word_embeddings": false, "torch_dtype": "float16", "transformers_version": "4.31.0.dev0",
  "use_cache": true, "vocab_size": 32000})";

// Qwen2.5-0.5B-Instruct.
constexpr const char* kQwen25_05B = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

// Mistral-7B-v0.1 (sliding window 4096) and v0.3 (sliding_window null).
constexpr const char* kMistral01 = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0",
  "use_cache": true, "vocab_size": 32000})";

constexpr const char* kMistral03 = R"({
  "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.42.0.dev0",
  "use_cache": true, "vocab_size": 32768})";

// A transformers 5 style config (rope_parameters, dtype, layer_types).
constexpr const char* kQwen2V5 = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "dtype": "float32", "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 64,
  "initializer_range": 0.02, "intermediate_size": 128,
  "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
  "max_position_embeddings": 512, "max_window_layers": 1, "model_type": "qwen2",
  "num_attention_heads": 4, "num_hidden_layers": 3, "num_key_value_heads": 2,
  "pad_token_id": null, "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
  "sliding_window": 8, "tie_word_embeddings": true, "transformers_version": "5.0.0",
  "use_cache": true, "use_sliding_window": true, "vocab_size": 300})";

// gemma-2-2b's config.json (transformers 4.42).
constexpr const char* kGemma2_2B = R"({
  "architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
  "eos_token_id": 1, "final_logit_softcapping": 30.0, "head_dim": 256,
  "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 2304, "initializer_range": 0.02, "intermediate_size": 9216,
  "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
  "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0,
  "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
  "sliding_window": 4096, "torch_dtype": "float32", "transformers_version": "4.42.4",
  "use_cache": true, "vocab_size": 256000})";

// gemma-3-1b-it's config.json (transformers 4.50).
constexpr const char* kGemma3_1B = R"({
  "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid",
  "eos_token_id": [1, 106], "final_logit_softcapping": null, "head_dim": 256,
  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
  "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
  "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
  "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
  "rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
  "transformers_version": "4.50.0.dev0", "use_cache": true, "vocab_size": 262144})";

// A Gemma 3 text config as transformers 5 writes it (rope_parameters per layer type).
constexpr const char* kGemma3V5 = R"({
  "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 300,
  "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
  "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
  "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
  "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0,
                                         "rope_theta": 1000000.0},
                      "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
  "sliding_window": 16, "sliding_window_pattern": 2, "_sliding_window_pattern": 2,
  "use_bidirectional_attention": false, "dtype": "bfloat16"})";

using testing::expect_error;

/// Parses `base` with `key` set to `value` (a JSON text; "DELETE" removes the key).
ModelConfig parse_with(const char* base, const std::string& key, const std::string& value) {
  return config_from_hf_json(testing::edited(base, key, value));
}

TEST(ConfigFamilies, Llama31WithLlama3Scaling) {
  const ModelConfig c = config_from_hf_json(json::parse(kLlama31_8B));
  EXPECT_EQ(c.family, ModelFamily::kLlama);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.eos_token_id, 128001);
  EXPECT_EQ(c.rope.scaling, RopeScalingKind::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope.original_max_position, 8192);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.weights_dtype, DType::kBF16);
  EXPECT_FALSE(c.has_sliding_window());
  EXPECT_GT(c.num_parameters(), 8'000'000'000);
}

TEST(ConfigFamilies, Llama32AndLlama2) {
  const ModelConfig a = config_from_hf_json(json::parse(kLlama32_1B));
  EXPECT_TRUE(a.tie_word_embeddings);
  EXPECT_EQ(a.head_dim, 64);
  EXPECT_DOUBLE_EQ(a.rope.factor, 32.0);
  const ModelConfig b = config_from_hf_json(json::parse(kLlama2_7B));
  EXPECT_EQ(b.rope.scaling, RopeScalingKind::kNone);
  EXPECT_DOUBLE_EQ(b.rope.theta, 10000.0);
  EXPECT_EQ(b.num_kv_heads, 32);
  EXPECT_EQ(b.weights_dtype, DType::kF16);
  // Llama 2 long-context fine-tunes use linear scaling.
  const ModelConfig l =
      parse_with(kLlama2_7B, "rope_scaling", R"({"type": "linear", "factor": 4})");
  EXPECT_EQ(l.rope.scaling, RopeScalingKind::kLinear);
  // Llama with attention_bias: true has q/k/v biases.
  EXPECT_TRUE(parse_with(kLlama2_7B, "attention_bias", "true").qkv_bias);
}

TEST(ConfigFamilies, Qwen25HasBiasAndNoWindowByDefault) {
  const ModelConfig c = config_from_hf_json(json::parse(kQwen25_05B));
  EXPECT_EQ(c.family, ModelFamily::kQwen2);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_FALSE(c.has_sliding_window());  // use_sliding_window false
  EXPECT_EQ(c.bos_token_id, 151643);
  // With use_sliding_window the layers from max_window_layers on slide.
  const ModelConfig w = parse_with(kQwen25_05B, "use_sliding_window", "true");
  EXPECT_EQ(w.window_of(20), -1);
  EXPECT_EQ(w.window_of(21), 32767);
  EXPECT_EQ(w.window_of(23), 32767);
  // Without architectures, model_type names the family.
  EXPECT_TRUE(parse_with(kQwen25_05B, "architectures", "DELETE").qkv_bias);
}

TEST(ConfigFamilies, Transformers5Qwen2) {
  const ModelConfig c = config_from_hf_json(json::parse(kQwen2V5));
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.weights_dtype, DType::kF32);
  EXPECT_EQ(c.window_of(0), -1);
  EXPECT_EQ(c.window_of(1), 7);
  EXPECT_EQ(c.window_of(2), 7);
  // layer_types and max_window_layers must agree (old and new transformers read different keys).
  expect_error([] { parse_with(kQwen2V5, "max_window_layers", "2"); }, ErrorCode::kUnsupported,
               "max_window_layers");
  // sliding_window null with use_sliding_window: no window (transformers 5 writes this).
  EXPECT_FALSE(parse_with(kQwen2V5, "sliding_window", "null").has_sliding_window());
}

TEST(ConfigFamilies, MistralWindow) {
  const ModelConfig a = config_from_hf_json(json::parse(kMistral01));
  EXPECT_EQ(a.family, ModelFamily::kMistral);
  EXPECT_FALSE(a.qkv_bias);
  ASSERT_EQ(a.layer_window.size(), 32u);
  for (int l = 0; l < 32; ++l) EXPECT_EQ(a.window_of(l), 4095);
  const ModelConfig b = config_from_hf_json(json::parse(kMistral03));
  EXPECT_FALSE(b.has_sliding_window());
  EXPECT_DOUBLE_EQ(b.rope.theta, 1e6);
  // Absent: transformers' default window of 4096.
  EXPECT_EQ(parse_with(kMistral03, "sliding_window", "DELETE").window_of(0), 4095);
  expect_error([] { parse_with(kMistral01, "attention_bias", "true"); }, ErrorCode::kUnsupported,
               "attention_bias");
  expect_error([] { parse_with(kMistral01, "layer_types", R"(["full_attention"])"); },
               ErrorCode::kUnsupported, "layer_types");
}

TEST(ConfigFamilies, Gemma2) {
  const ModelConfig c = config_from_hf_json(json::parse(kGemma2_2B));
  EXPECT_EQ(c.family, ModelFamily::kGemma2);
  EXPECT_EQ(c.activation, Activation::kGeluTanh);
  EXPECT_TRUE(c.norm_weight_offset);
  EXPECT_TRUE(c.sandwich_norms);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FLOAT_EQ(c.embed_scale, 48.f);  // sqrt(2304)
  EXPECT_FLOAT_EQ(c.attn_logit_softcap, 50.f);
  EXPECT_FLOAT_EQ(c.final_logit_softcap, 30.f);
  EXPECT_FLOAT_EQ(c.attention_scaling(), 1.f / 16.f);
  for (int l = 0; l < 26; ++l) EXPECT_EQ(c.window_of(l), l % 2 == 0 ? 4095 : -1) << l;
  EXPECT_EQ(c.local_rope.theta, 0.0);  // one RoPE for every layer
  // Absent caps take Gemma 2's defaults; null switches them off.
  EXPECT_FLOAT_EQ(parse_with(kGemma2_2B, "attn_logit_softcapping", "DELETE").attn_logit_softcap,
                  50.f);
  EXPECT_EQ(parse_with(kGemma2_2B, "final_logit_softcapping", "null").final_logit_softcap, 0.f);
  EXPECT_FLOAT_EQ(parse_with(kGemma2_2B, "query_pre_attn_scalar", "224").attention_scaling(),
                  static_cast<float>(1.0 / std::sqrt(224.0)));
}

TEST(ConfigFamilies, Gemma3Text) {
  const ModelConfig c = config_from_hf_json(json::parse(kGemma3_1B));
  EXPECT_EQ(c.family, ModelFamily::kGemma3);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.sandwich_norms);
  EXPECT_EQ(c.attn_logit_softcap, 0.f);
  EXPECT_EQ(c.final_logit_softcap, 0.f);
  EXPECT_EQ(c.eos_token_id, 1);
  EXPECT_EQ(c.num_kv_heads, 1);
  EXPECT_EQ(c.weights_dtype, DType::kBF16);
  for (int l = 0; l < 26; ++l) EXPECT_EQ(c.window_of(l), (l + 1) % 6 == 0 ? -1 : 511) << l;
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_DOUBLE_EQ(c.local_rope.theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.rope_of(0).theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.rope_of(5).theta, 1e6);
  // rope_scaling applies to the global layers only.
  const ModelConfig s =
      parse_with(kGemma3_1B, "rope_scaling", R"({"rope_type": "linear", "factor": 8.0})");
  EXPECT_EQ(s.rope.scaling, RopeScalingKind::kLinear);
  EXPECT_EQ(s.local_rope.scaling, RopeScalingKind::kNone);
  // Another pattern, and layer_types agreeing with it.
  const ModelConfig p = parse_with(kGemma3_1B, "sliding_window_pattern", "2");
  EXPECT_EQ(p.window_of(0), 511);
  EXPECT_EQ(p.window_of(1), -1);
  // transformers 5: rope_parameters per layer type, layer_types explicit.
  const ModelConfig v = config_from_hf_json(json::parse(kGemma3V5));
  EXPECT_EQ(v.window_of(0), 15);
  EXPECT_EQ(v.window_of(1), -1);
  EXPECT_DOUBLE_EQ(v.rope.theta, 1e6);
  EXPECT_EQ(v.rope.scaling, RopeScalingKind::kLinear);
  EXPECT_DOUBLE_EQ(v.rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(v.local_rope.theta, 10000.0);
  EXPECT_EQ(v.head_dim, 32);
  EXPECT_FLOAT_EQ(v.attention_scaling(), 1.f / 16.f);  // query_pre_attn_scalar default 256
  expect_error([] { parse_with(kGemma3V5, "_sliding_window_pattern", "3"); },
               ErrorCode::kUnsupported, "_sliding_window_pattern");
}

TEST(ConfigStrict, GemmaPatternsNameTheField) {
  expect_error([] { parse_with(kGemma3_1B, "layer_types", R"(["full_attention"])"); },
               ErrorCode::kInvalidArgument, "layer_types");
  // layer_types that disagree with sliding_window_pattern.
  json j = json::parse(kGemma3_1B);
  j["num_hidden_layers"] = 2;
  j["layer_types"] = {"sliding_attention", "sliding_attention"};
  j["sliding_window_pattern"] = 2;
  expect_error([&] { config_from_hf_json(j); }, ErrorCode::kUnsupported, "sliding_window_pattern");
  // Harmless Gemma metadata.
  EXPECT_NO_THROW(parse_with(kGemma3_1B, "cache_implementation", R"("hybrid")"));
}

TEST(ConfigStrict, UnsupportedFeaturesNameTheField) {
  struct Case {
    const char* base;
    std::string key, value, needle;
  };
  const Case cases[] = {
      {kLlama31_8B, "architectures", R"(["GemmaForCausalLM"])", "GemmaForCausalLM"},
      {kLlama31_8B, "model_type", R"("qwen2")", "model_type"},
      {kLlama31_8B, "mlp_bias", "true", "mlp_bias"},
      {kLlama31_8B, "hidden_act", R"("gelu")", "hidden_act"},
      {kLlama31_8B, "pretraining_tp", "2", "pretraining_tp"},
      {kLlama31_8B, "quantization_config", R"({"quant_method": "awq"})", "quantization_config"},
      {kLlama31_8B, "some_new_knob", "1", "some_new_knob"},
      {kLlama31_8B, "rope_scaling", R"({"type": "dynamic", "factor": 2.0})", "dynamic"},
      {kLlama31_8B, "rope_scaling", R"({"rope_type": "yarn", "factor": 4.0})", "yarn"},
      {kLlama31_8B, "rope_scaling", R"({"rope_type": "llama3", "mscale": 1.0})", "mscale"},
      {kLlama31_8B, "partial_rotary_factor", "0.5", "partial_rotary_factor"},
      {kLlama31_8B, "sliding_window", "4096", "sliding_window"},
      {kLlama31_8B, "torch_dtype", R"("float8_e4m3fn")", "torch_dtype"},
      {kQwen25_05B, "attention_bias", "false", "attention_bias"},
      {kQwen25_05B, "head_dim", "128", "head_dim"},
      {kQwen25_05B, "use_mrope", "true", "use_mrope"},
      {kGemma3_1B, "model_type", R"("gemma3")", "model_type"},
      {kGemma3_1B, "hidden_activation", R"("gelu")", "hidden_activation"},
      {kGemma2_2B, "hidden_act", R"("silu")", "hidden_act"},
      {kGemma3_1B, "use_bidirectional_attention", "true", "use_bidirectional_attention"},
      {kGemma2_2B, "use_bidirectional_attention", "true", "use_bidirectional_attention"},
      {kGemma3_1B, "attention_bias", "true", "attention_bias"},
      {kGemma3_1B, "sliding_window", "null", "sliding_window"},
      {kGemma2_2B, "use_sliding_window", "true", "use_sliding_window"},
      {kGemma2_2B, "mlp_bias", "false", "mlp_bias"},
      {kGemma2_2B, "sliding_window_pattern", "2", "sliding_window_pattern"},
      {kGemma2_2B, "rope_local_base_freq", "10000", "rope_local_base_freq"},
      {kGemma3_1B, "rope_scaling", R"({"rope_type": "yarn", "factor": 4.0})", "yarn"},
      {kLlama31_8B, "query_pre_attn_scalar", "128", "query_pre_attn_scalar"},
      {kLlama31_8B, "hidden_activation", R"("silu")", "hidden_activation"},
      {kQwen25_05B, "rope_local_base_freq", "10000", "rope_local_base_freq"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key + " = " + c.value);
    expect_error([&] { parse_with(c.base, c.key, c.value); }, ErrorCode::kUnsupported, c.needle);
  }
  // Harmless metadata is accepted whatever its value.
  EXPECT_NO_THROW(parse_with(kLlama31_8B, "pad_token_id", "7"));
  EXPECT_NO_THROW(parse_with(kLlama31_8B, "attention_dropout", "0.1"));
}

TEST(ConfigHostile, BadNumbersNameTheField) {
  struct Case {
    std::string key, value, needle;
  };
  const Case cases[] = {
      {"num_hidden_layers", "-1", "num_hidden_layers"},
      {"num_hidden_layers", "0", "num_hidden_layers"},
      {"num_hidden_layers", "1000000000", "num_hidden_layers"},
      {"num_hidden_layers", R"("32")", "num_hidden_layers"},
      {"num_hidden_layers", "32.0", "num_hidden_layers"},
      {"num_hidden_layers", "32.5", "num_hidden_layers"},
      {"num_hidden_layers", "18446744073709551615", "num_hidden_layers"},
      {"num_hidden_layers", "null", "num_hidden_layers"},
      {"num_hidden_layers", "DELETE", "num_hidden_layers"},
      {"hidden_size", "-4096", "hidden_size"},
      {"hidden_size", "[4096]", "hidden_size"},
      {"vocab_size", "9223372036854775807", "vocab_size"},
      {"num_attention_heads", "-32", "num_attention_heads"},
      {"num_key_value_heads", "7", "num_key_value_heads"},
      {"num_key_value_heads", "0", "num_key_value_heads"},
      {"head_dim", "-64", "head_dim"},
      {"intermediate_size", "true", "intermediate_size"},
      {"rms_norm_eps", "-1e-5", "rms_norm_eps"},
      {"rms_norm_eps", R"("1e-5")", "rms_norm_eps"},
      {"rope_theta", "0", "rope_theta"},
      {"max_position_embeddings", "-5", "max_position_embeddings"},
      {"tie_word_embeddings", "1", "tie_word_embeddings"},
      {"eos_token_id", "[128001, \"x\"]", "eos_token_id"},
      {"eos_token_id", "128256", "eos_token_id"},
      {"bos_token_id", "-7", "bos_token_id"},
      {"rope_scaling", R"({"rope_type": "llama3", "factor": -8.0})", "rope_scaling.factor"},
      {"rope_scaling", R"({"rope_type": "llama3", "original_max_position_embeddings": 1.5})",
       "original_max_position_embeddings"},
      {"rope_scaling", "[1, 2]", "rope_scaling"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key + " = " + c.value);
    expect_error([&] { parse_with(kLlama31_8B, c.key, c.value); }, ErrorCode::kInvalidArgument,
                 c.needle);
  }
  // The issue's crash: negative layers plus a window used to size a vector.
  expect_error([] { parse_with(kMistral01, "num_hidden_layers", "-1"); },
               ErrorCode::kInvalidArgument, "num_hidden_layers");
  expect_error([] { parse_with(kMistral01, "sliding_window", "-3"); }, ErrorCode::kInvalidArgument,
               "sliding_window");
  // Each size is in range, their product is not: vocab 2^24 x hidden 2^20 elements.
  json j = json::parse(kLlama31_8B);
  j["vocab_size"] = int64_t{1} << 24;
  j["hidden_size"] = int64_t{1} << 20;
  j["head_dim"] = 128;
  expect_error([&] { config_from_hf_json(j); }, ErrorCode::kInvalidArgument, "exceed");
  // Not an object at all.
  expect_error([] { config_from_hf_json(json::parse("[1, 2, 3]")); }, ErrorCode::kInvalidArgument,
               "object");
  expect_error([] { config_from_hf_json(json::parse(R"({"vocab_size": 100})")); },
               ErrorCode::kInvalidArgument, "architectures");
}

/// A random JSON value of a random type (numbers from hostile ranges included).
json random_value(std::mt19937_64& rng) {
  switch (rng() % 10) {
    case 0:
      return nullptr;
    case 1:
      return static_cast<int64_t>(rng());  // huge or negative
    case 2:
      return -static_cast<int64_t>(rng() % 100);
    case 3:
      return static_cast<int64_t>(rng() % 70000);
    case 4:
      return static_cast<double>(rng() % 1000) / 7.0;
    case 5:
      return static_cast<uint64_t>(rng());
    case 6:
      return "x" + std::to_string(rng() % 100);
    case 7:
      return (rng() % 2) == 0;
    case 8:
      return json::array({static_cast<int64_t>(rng() % 5), "y"});
    default:
      return json::object({{"rope_type", "llama3"}, {"factor", static_cast<int>(rng() % 9) - 2}});
  }
}

TEST(ConfigHostile, SeededMutationsGiveErrorsNeverCrashes) {
  const uint64_t seed = 20261130;
  std::printf("config mutation seed %llu\n", static_cast<unsigned long long>(seed));
  const char* bases[] = {kLlama31_8B, kQwen25_05B, kMistral01, kQwen2V5};
  const auto [accepted, rejected] = testing::mutate_configs(
      bases, [](std::mt19937_64& rng) { return random_value(rng); }, seed, 3000);
  EXPECT_GT(rejected, 0);
  std::printf("config mutations: %d accepted, %d rejected\n", accepted, rejected);
}

}  // namespace
}  // namespace pagoda::model
