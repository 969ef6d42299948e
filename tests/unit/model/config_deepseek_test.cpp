// config_from_hf_json on DeepSeek-V2 / V3 / V3.2 config.json texts (config_deepseek.cpp): the MLA
// fields, V3.2's sparse-attention (DSA) fields, YaRN and its softmax mscale, the dense-only rule (any MoE layer is an error naming the
// field), strictness (unknown keys, wrong types, missing fields) and a seeded mutation loop that
// must only ever give a valid config or a pagoda::Error.
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

// DeepSeek-V2-Lite's config.json (its MoE layers: layer 0 dense, 1..26 with 64 experts).
constexpr const char* kV2Lite = R"({
  "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV2Config"},
  "aux_loss_alpha": 0.001, "bos_token_id": 100000, "eos_token_id": 100001,
  "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 10944, "kv_lora_rank": 512,
  "max_position_embeddings": 163840, "model_type": "deepseek_v2", "moe_intermediate_size": 1408,
  "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2,
  "norm_topk_prob": false, "num_attention_heads": 16, "num_experts_per_tok": 6,
  "num_hidden_layers": 27, "num_key_value_heads": 16, "pretraining_tp": 1, "q_lora_rank": null,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                   "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": true,
  "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy",
  "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": true,
  "v_head_dim": 128, "vocab_size": 102400})";

// A DeepSeek-V3-shaped dense config (q LoRA, V3's YaRN; the experts field present but every
// layer dense through first_k_dense_replace).
constexpr const char* kV3Dense = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
  "num_hidden_layers": 4, "num_attention_heads": 128, "num_key_value_heads": 128,
  "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "v_head_dim": 128, "n_routed_experts": 256, "first_k_dense_replace": 4, "moe_layer_freq": 1,
  "n_shared_experts": 1, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
  "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
  "scoring_func": "sigmoid", "norm_topk_prob": true, "ep_size": 1,
  "num_nextn_predict_layers": 0, "max_position_embeddings": 163840, "rms_norm_eps": 1e-06,
  "rope_theta": 10000,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "tie_word_embeddings": false, "hidden_act": "silu", "attention_bias": false,
  "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16"})";

using testing::edited;
using testing::expect_error;

/// kV3Dense as DeepSeek-V3.2 (DeepseekV32ForCausalLM): the indexer's three keys.
std::string v32_dense() {
  json j = json::parse(kV3Dense);
  j["architectures"] = json::array({"DeepseekV32ForCausalLM"});
  j["model_type"] = "deepseek_v32";
  j["index_n_heads"] = 64;
  j["index_head_dim"] = 128;
  j["index_topk"] = 2048;
  return j.dump();
}

TEST(ConfigDeepseek, V32DsaFieldsParseAndAreChecked) {
  const std::string base = v32_dense();
  const ModelConfig c = config_from_hf_json(json::parse(base));
  EXPECT_EQ(c.family, ModelFamily::kDeepseekV32);
  EXPECT_TRUE(c.is_mla());
  EXPECT_TRUE(c.is_dsa());
  EXPECT_EQ(c.dsa.index_n_heads, 64);
  EXPECT_EQ(c.dsa.index_head_dim, 128);
  EXPECT_EQ(c.dsa.index_topk, 2048);
  EXPECT_FALSE(config_from_hf_json(json::parse(kV3Dense)).is_dsa());
  struct Case {
    std::string key, value, needle;
    ErrorCode code;
  };
  const Case cases[] = {
      {"index_topk", "DELETE", "index_topk", ErrorCode::kInvalidArgument},
      {"index_n_heads", "DELETE", "index_n_heads", ErrorCode::kInvalidArgument},
      {"index_topk", "0", "index_topk", ErrorCode::kInvalidArgument},
      {"index_head_dim", "32", "index_head_dim", ErrorCode::kInvalidArgument},  // < rope 64
      {"index_n_heads", "1.5", "index_n_heads", ErrorCode::kInvalidArgument},
      {"q_lora_rank", "null", "q LoRA", ErrorCode::kUnsupported},
      {"model_type", R"("deepseek_v3")", "model_type", ErrorCode::kUnsupported},
      {"some_new_knob", "1", "some_new_knob", ErrorCode::kUnsupported},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.key + " = " + k.value);
    expect_error([&] { config_from_hf_json(edited(base.c_str(), k.key, k.value)); }, k.code,
                 k.needle);
  }
}

TEST(ConfigDeepseek, V2LiteDenseVariantParses) {
  // The real file is MoE from layer 1: refused, naming the field.
  expect_error([] { config_from_hf_json(json::parse(kV2Lite)); }, ErrorCode::kUnsupported,
               "n_routed_experts");
  const ModelConfig c = config_from_hf_json(edited(kV2Lite, "n_routed_experts", "null"));
  EXPECT_EQ(c.family, ModelFamily::kDeepseekV2);
  EXPECT_TRUE(c.is_mla());
  EXPECT_EQ(c.mla.q_lora_rank, 0);
  EXPECT_EQ(c.mla.kv_lora_rank, 512);
  EXPECT_EQ(c.head_dim, 192);
  EXPECT_EQ(c.rope_dim(), 64);
  EXPECT_EQ(c.rope.scaling, RopeScalingKind::kYarn);
  EXPECT_DOUBLE_EQ(c.rope.factor, 40.0);
  EXPECT_EQ(c.rope.original_max_position, 4096);
  // DeepSeek: softmax_scale = 192^-0.5 * (0.1 * 0.707 * ln 40 + 1)^2.
  const double m = 0.1 * 0.707 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c.attention_scaling(), m * m / std::sqrt(192.0), 1e-7);
  EXPECT_EQ(c.weights_dtype, DType::kBF16);
  // first_k_dense_replace covering every layer is dense too.
  EXPECT_NO_THROW(config_from_hf_json(edited(kV2Lite, "first_k_dense_replace", "27")));
  EXPECT_NO_THROW(config_from_hf_json(edited(kV2Lite, "n_routed_experts", "0")));
}

TEST(ConfigDeepseek, V3DenseParses) {
  const ModelConfig c = config_from_hf_json(json::parse(kV3Dense));
  EXPECT_EQ(c.family, ModelFamily::kDeepseekV3);
  EXPECT_EQ(c.mla.q_lora_rank, 1536);
  EXPECT_EQ(c.mla.v_head_dim, 128);
  EXPECT_EQ(c.num_kv_heads, 128);
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c.attention_scaling(), m * m / std::sqrt(192.0), 1e-7);
  // No rope_scaling: plain 1/sqrt(nope + rope).
  EXPECT_FLOAT_EQ(config_from_hf_json(edited(kV3Dense, "rope_scaling", "null")).attention_scaling(),
                  static_cast<float>(1.0 / std::sqrt(192.0)));
  EXPECT_GT(c.num_parameters(), 0);
}

TEST(ConfigDeepseek, MoeAndUnsupportedNameTheField) {
  struct Case {
    const char* base;
    std::string key, value, needle;
    ErrorCode code;
  };
  const Case cases[] = {
      {kV3Dense, "first_k_dense_replace", "3", "n_routed_experts", ErrorCode::kUnsupported},
      {kV3Dense, "first_k_dense_replace", "DELETE", "first_k_dense_replace",
       ErrorCode::kUnsupported},
      // moe_layer_freq 2 with first_k_dense_replace 1: layer 2 is MoE.
      {kV3Dense, "first_k_dense_replace", "1", "moe_layer_freq", ErrorCode::kUnsupported},
      {kV3Dense, "n_routed_experts", "DELETE", "n_routed_experts", ErrorCode::kInvalidArgument},
      {kV3Dense, "num_nextn_predict_layers", "1", "num_nextn_predict_layers",
       ErrorCode::kUnsupported},
      {kV3Dense, "quantization_config", R"({"quant_method": "fp8"})", "quantization_config",
       ErrorCode::kUnsupported},
      {kV3Dense, "index_topk", "2048", "index_topk", ErrorCode::kUnsupported},
      {kV3Dense, "some_new_knob", "1", "some_new_knob", ErrorCode::kUnsupported},
      {kV3Dense, "hidden_act", R"("gelu")", "hidden_act", ErrorCode::kUnsupported},
      {kV3Dense, "attention_bias", "true", "attention_bias", ErrorCode::kUnsupported},
      {kV3Dense, "rope_interleave", "false", "rope_interleave", ErrorCode::kUnsupported},
      {kV3Dense, "num_key_value_heads", "1", "num_key_value_heads", ErrorCode::kUnsupported},
      {kV3Dense, "rope_scaling", R"({"type": "linear", "factor": 2.0})", "linear",
       ErrorCode::kUnsupported},
      {kV3Dense, "rope_scaling", R"({"type": "yarn", "factor": 2.0, "extra": 1})",
       "rope_scaling.extra", ErrorCode::kUnsupported},
      {kV3Dense, "rope_scaling", R"({"type": "yarn"})", "rope_scaling.factor",
       ErrorCode::kInvalidArgument},
      {kV3Dense, "model_type", R"("deepseek_v2")", "model_type", ErrorCode::kUnsupported},
      {kV3Dense, "q_lora_rank", "DELETE", "q_lora_rank", ErrorCode::kInvalidArgument},
      {kV3Dense, "q_lora_rank", "0", "q_lora_rank", ErrorCode::kInvalidArgument},
      {kV3Dense, "kv_lora_rank", "DELETE", "kv_lora_rank", ErrorCode::kInvalidArgument},
      {kV3Dense, "qk_nope_head_dim", "DELETE", "qk_nope_head_dim", ErrorCode::kInvalidArgument},
      {kV3Dense, "qk_rope_head_dim", "DELETE", "qk_rope_head_dim", ErrorCode::kInvalidArgument},
      {kV3Dense, "v_head_dim", "DELETE", "v_head_dim", ErrorCode::kInvalidArgument},
      {kV3Dense, "qk_rope_head_dim", "63", "qk_rope_head_dim", ErrorCode::kInvalidArgument},
      {kV3Dense, "kv_lora_rank", "512.0", "kv_lora_rank", ErrorCode::kInvalidArgument},
      {kV3Dense, "v_head_dim", "-1", "v_head_dim", ErrorCode::kInvalidArgument},
      {kV3Dense, "q_lora_rank", R"("1536")", "q_lora_rank", ErrorCode::kInvalidArgument},
      {kV3Dense, "head_dim", "192", "head_dim", ErrorCode::kInvalidArgument},
      {kV3Dense, "qk_head_dim", "128", "qk_head_dim", ErrorCode::kInvalidArgument},
      // Keys of other families are unknown here.
      {kV3Dense, "sliding_window", "4096", "sliding_window", ErrorCode::kUnsupported},
      {kV3Dense, "query_pre_attn_scalar", "128", "query_pre_attn_scalar", ErrorCode::kUnsupported},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key + " = " + c.value);
    json j = edited(c.base, c.key, c.value);
    if (c.key == "first_k_dense_replace" && c.value == "1") j["moe_layer_freq"] = 2;
    expect_error([&] { config_from_hf_json(j); }, c.code, c.needle);
  }
  // transformers' derived copies are accepted when they agree; MoE knobs while no layer is MoE.
  EXPECT_NO_THROW(config_from_hf_json(edited(kV3Dense, "head_dim", "64")));
  EXPECT_NO_THROW(config_from_hf_json(edited(kV3Dense, "qk_head_dim", "192")));
  EXPECT_NO_THROW(config_from_hf_json(edited(kV3Dense, "rope_interleave", "true")));
  EXPECT_NO_THROW(config_from_hf_json(edited(kV3Dense, "topk_method", R"("greedy")")));
}

TEST(ConfigDeepseek, SeededMutationsGiveErrorsNeverCrashes) {
  const uint64_t seed = 20261206;
  std::printf("deepseek config mutation seed %llu\n", static_cast<unsigned long long>(seed));
  const json values[] = {json(nullptr),
                         json(0),
                         json(-3),
                         json(64),
                         json(int64_t{1} << 40),
                         json(1.5),
                         json("x"),
                         json(true),
                         json::array({1, "y"}),
                         json::object({{"type", "yarn"}, {"factor", -2}})};
  // kV2Lite with no experts is dense (the file itself is refused for its MoE layers).
  const std::string v2_dense = [] {
    json j = json::parse(kV2Lite);
    j["n_routed_experts"] = nullptr;
    return j.dump();
  }();
  const std::string v32 = v32_dense();
  const char* bases[] = {kV3Dense, v2_dense.c_str(), v32.c_str()};
  const auto [accepted, rejected] = testing::mutate_configs(
      bases, [&](std::mt19937_64& rng) { return values[rng() % std::size(values)]; }, seed, 2000);
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 0);
  std::printf("deepseek config mutations: %d accepted, %d rejected\n", accepted, rejected);
}

}  // namespace
}  // namespace pagoda::model
