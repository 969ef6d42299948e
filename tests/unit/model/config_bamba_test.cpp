// config_from_hf_json on Bamba (BambaForCausalLM) config.json texts (config_bamba.cpp): the
// layer kinds from attn_layer_indices, the mamba_* fields and transformers' defaults, the partial
// RoPE transformers fixes at 0.5, every field pagoda does not implement refused by name, and a
// seeded mutation loop that must only ever give a valid config or a pagoda::Error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "config_test_util.h"
#include "test_seed.h"
#include "pagoda/core/error.h"
#include "pagoda/model/config.h"

namespace pagoda::model {
namespace {

using nlohmann::json;
using testing::edited;
using testing::expect_error;

// A Bamba-9B-shaped config as transformers 4.x's save_pretrained writes it (mamba_d_head
// resolved, partial_rotary_factor 0.5, time_step_limit left out: strict JSON has no Infinity).
constexpr const char* kBamba9b = R"({
  "architectures": ["BambaForCausalLM"], "model_type": "bamba", "attention_dropout": 0.0,
  "attn_layer_indices": [9, 18, 27], "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "mamba_chunk_size": 256, "mamba_conv_bias": true, "mamba_d_conv": 4, "mamba_d_head": 64,
  "mamba_d_state": 128, "mamba_expand": 2, "mamba_n_groups": 1, "mamba_n_heads": 128,
  "mamba_proj_bias": false, "max_position_embeddings": 262144, "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "num_logits_to_keep": 1,
  "pad_token_id": 0, "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
  "tie_word_embeddings": false, "time_step_max": 0.1, "time_step_min": 0.001,
  "torch_dtype": "bfloat16", "transformers_version": "4.48.0", "use_cache": true,
  "vocab_size": 128256, "z_loss_coefficient": 0.0})";

TEST(ConfigBamba, ParsesLayerKindsMambaFieldsAndPartialRope) {
  const ModelConfig c = config_from_hf_json(json::parse(kBamba9b));
  EXPECT_EQ(c.family, ModelFamily::kBamba);
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.num_attention_layers(), 3);
  EXPECT_EQ(c.num_linear_layers(), 29);
  for (int l = 0; l < c.num_layers; ++l)
    EXPECT_EQ(c.is_linear_layer(l), l != 9 && l != 18 && l != 27) << l;
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.mamba.num_heads, 128);
  EXPECT_EQ(c.mamba.head_dim, 64);
  EXPECT_EQ(c.mamba.d_inner(), 8192);
  EXPECT_EQ(c.mamba.conv_dim(), 8192 + 2 * 128);
  EXPECT_EQ(c.mamba.state_size, 128);
  EXPECT_TRUE(c.mamba.conv_bias);
  EXPECT_FALSE(c.mamba.proj_bias);
  EXPECT_EQ(c.mamba.dt_min, 0.0);
  EXPECT_TRUE(std::isinf(c.mamba.dt_max));
  EXPECT_EQ(c.weights_dtype, DType::kBF16);
  // "auto" head dim, transformers' defaults, time_step_limit with a null upper bound.
  json j = json::parse(kBamba9b);
  j["mamba_d_head"] = "auto";
  for (const char* k : {"mamba_n_groups", "mamba_d_conv", "mamba_chunk_size", "rms_norm_eps",
                        "num_key_value_heads", "partial_rotary_factor"})
    j.erase(k);
  j["time_step_limit"] = json::array({0.001, nullptr});
  const ModelConfig d = config_from_hf_json(j);
  EXPECT_EQ(d.mamba.head_dim, 64);
  EXPECT_EQ(d.mamba.num_groups, 1);
  EXPECT_EQ(d.mamba.conv_kernel, 4);
  EXPECT_EQ(d.mamba.chunk_size, 256);
  EXPECT_EQ(d.num_kv_heads, 8);
  EXPECT_FLOAT_EQ(d.rms_norm_eps, 1e-5f);
  EXPECT_DOUBLE_EQ(d.mamba.dt_min, 0.001);
  EXPECT_TRUE(std::isinf(d.mamba.dt_max));
  // transformers 5: the rope inside rope_parameters; layers_block_type that agrees.
  j = json::parse(kBamba9b);
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e5}};
  json kinds = json::array();
  for (int l = 0; l < 32; ++l) kinds.push_back(l % 9 == 0 && l > 0 ? "attention" : "mamba");
  j["layers_block_type"] = kinds;
  EXPECT_DOUBLE_EQ(config_from_hf_json(j).rope.theta, 5e5);
}

TEST(ConfigBamba, RefusesWhatItDoesNotImplementNamingTheField) {
  const auto refused = [](const std::string& key, const std::string& value, ErrorCode code,
                          const std::string& needle) {
    SCOPED_TRACE(key + " = " + value);
    expect_error([&] { config_from_hf_json(edited(kBamba9b, key, value)); }, code, needle);
  };
  using enum ErrorCode;
  refused("use_mamba_kernels", "true", kUnsupported, "use_mamba_kernels");
  refused("attn_rotary_emb", "64", kUnsupported, "attn_rotary_emb");
  refused("partial_rotary_factor", "1.0", kUnsupported, "partial_rotary_factor");
  refused("rope_scaling", R"({"type": "linear", "factor": 2})", kUnsupported, "rope_scaling");
  refused("rope_parameters", R"({"rope_type": "default", "partial_rotary_factor": 1.0})",
          kUnsupported, "rope_parameters.partial_rotary_factor");
  refused("attention_bias", "true", kUnsupported, "attention_bias");
  refused("mlp_bias", "true", kUnsupported, "mlp_bias");
  refused("hidden_act", R"("gelu")", kUnsupported, "hidden_act");
  refused("attn_layer_indices", "[9, 32]", kInvalidArgument, "attn_layer_indices");
  refused("attn_layer_indices", "[9, 9]", kInvalidArgument, "attn_layer_indices");
  refused("attn_layer_indices", "[]", kUnsupported, "attn_layer_indices");
  refused("attn_layer_indices", "DELETE", kUnsupported, "attn_layer_indices");
  refused("layers_block_type", R"(["mamba"])", kInvalidArgument, "layers_block_type");
  refused("mamba_d_head", "32", kInvalidArgument, "mamba_d_head");
  refused("mamba_d_head", R"("half")", kInvalidArgument, "mamba_d_head");
  refused("mamba_n_groups", "3", kInvalidArgument, "mamba_n_groups");
  refused("mamba_n_heads", "96", kInvalidArgument, "mamba_n_heads");
  refused("time_step_limit", "[0.5, 0.1]", kInvalidArgument, "time_step_limit");
  refused("time_step_limit", "[0.0]", kInvalidArgument, "time_step_limit");
  refused("head_dim", "66", kUnsupported, "head_dim");
  refused("model_type", R"("jamba")", kUnsupported, "model_type");
  refused("mamba_conv_bias", "1", kInvalidArgument, "mamba_conv_bias");
}

// Python's json writes transformers' default time_step_limit (0.0, inf) as [0.0, Infinity], which
// strict JSON lacks: parse_config_json reads it (outside strings only) as DBL_MAX, no limit a
// finite step reaches; NaN stays a parse error.
TEST(ConfigBamba, PythonInfinityInConfigJsonIsReadAsNoLimit) {
  std::string text = kBamba9b;
  text.insert(text.rfind('}'), R"(, "time_step_limit": [0.0, Infinity], "x_note": "Infinity")");
  EXPECT_THROW({ [[maybe_unused]] const json strict = json::parse(text); }, json::exception);
  const json j = parse_config_json(text);
  EXPECT_EQ(j["x_note"], "Infinity");  // inside a string: untouched
  EXPECT_EQ(j["time_step_limit"][1].get<double>(), std::numeric_limits<double>::max());
  json known = j;
  known.erase("x_note");
  const ModelConfig c = config_from_hf_json(known);
  EXPECT_EQ(c.mamba.dt_min, 0.0);
  EXPECT_GE(c.mamba.dt_max, std::numeric_limits<double>::max());
  EXPECT_EQ(parse_config_json(R"({"a": -Infinity, "b": [Infinity]})")["a"].get<double>(),
            -std::numeric_limits<double>::max());
  for (const char* bad : {R"({"a": NaN})", R"({"a": Infinityx})"})
    EXPECT_THROW({ [[maybe_unused]] const json j2 = parse_config_json(bad); }, json::exception)
        << bad;
}

TEST(ConfigBamba, SeededMutationsGiveErrorsNeverCrashes) {
  const testing::TestSeed seed;
  const json values[] = {json(nullptr), json(0),   json(-3),    json(64),
                         json(int64_t{1} << 40),  json(1.5), json("x"),  json(true),
                         json::array({1, "y"}),   json::array({0, 1}),   json("auto")};
  const char* bases[] = {kBamba9b};
  const auto [accepted, rejected] = testing::mutate_configs(
      bases, [&](std::mt19937_64& rng) { return values[rng() % std::size(values)]; }, seed, 1000);
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 0);
  std::printf("bamba config mutations: %d accepted, %d rejected\n", accepted, rejected);
}

}  // namespace
}  // namespace pagoda::model
