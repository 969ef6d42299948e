// The Bamba (BambaForCausalLM, model_type "bamba") config.json parser (config.h,
// config_from_hf_json): Mamba2 layers beside attention layers at attn_layer_indices, a Llama
// MLP and RMSNorm in every layer, partial RoPE (transformers fixes partial_rotary_factor 0.5).
// As strict as the other parsers: every key is read and checked, or harmless metadata;
// anything else is Error(kUnsupported) naming it. Defaults are transformers' BambaConfig's.
#include <cmath>
#include <limits>
#include <string>
#include <string_view>

#include "pagoda/model/config_reader.h"

namespace pagoda::model::config_detail {

namespace {

/// Keys this parser reads (each checked below).
constexpr std::string_view kBambaKeys[] = {
    "architectures",
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "partial_rotary_factor",
    "max_position_embeddings",
    "tie_word_embeddings",
    "hidden_act",
    "attention_bias",
    "mlp_bias",
    "bos_token_id",
    "eos_token_id",
    "torch_dtype",
    "dtype",
    "attn_layer_indices",
    "layers_block_type",
    "mamba_n_heads",
    "mamba_d_head",
    "mamba_n_groups",
    "mamba_d_state",
    "mamba_d_conv",
    "mamba_expand",
    "mamba_chunk_size",
    "mamba_conv_bias",
    "mamba_proj_bias",
    "time_step_limit",
};

/// Keys that only matter for training (dt_bias initialisation, the z-loss) or generation
/// defaults: range-checked as numbers, then unused.
constexpr std::string_view kBambaTrainingKeys[] = {"time_step_min", "time_step_max",
                                                   "z_loss_coefficient", "num_logits_to_keep"};

/// transformers' BambaConfig sets partial_rotary_factor to 0.5 whatever config.json says;
/// another value would describe a model transformers does not build.
void check_partial_rotary(const Reader& r, const char* where) {
  const double p = r.number_or("partial_rotary_factor", 0.5, 0.0, 1.0);
  PAGODA_REQUIRE(p == 0.5, kUnsupported,
                 "config.json: {}partial_rotary_factor {} is not supported on BambaForCausalLM "
                 "(transformers fixes it at 0.5)",
                 where, p);
}

/// rope_theta, and rope_scaling / rope_parameters when they say the default rope.
double parse_bamba_rope(const Reader& top) {
  double theta = top.number_or("rope_theta", 10000.0, 1e-9, 1e15);
  check_partial_rotary(top, "");
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!top.has(key)) continue;
    const json& s = top.at(key);
    PAGODA_REQUIRE(s.is_object(), kInvalidArgument,
                   "config.json: {} must be an object or null (got {})", key, show(s));
    static constexpr std::string_view kKeys[] = {"type", "rope_type", "rope_theta",
                                                 "partial_rotary_factor"};
    for (const auto& [k, v] : s.items())
      PAGODA_REQUIRE(listed(kKeys, k), kUnsupported,
                     "config.json: {}.{} is not supported on BambaForCausalLM", key, k);
    const Reader sr(s, std::string(key) + ".");
    std::string type = sr.string_or("rope_type", "");
    if (type.empty()) type = sr.string_or("type", "default");
    PAGODA_REQUIRE(type == "default", kUnsupported,
                   "config.json: {} type '{}' is not supported on BambaForCausalLM (only the "
                   "default rope)",
                   key, type);
    theta = sr.number_or("rope_theta", theta, 1e-9, 1e15);
    check_partial_rotary(sr, (std::string(key) + ".").c_str());
  }
  return theta;
}

/// attn_layer_indices (transformers: null or absent = every layer Mamba2) as a per-layer flag
/// (1 = Mamba2); layers_block_type, when present, must say the same.
std::vector<uint8_t> parse_layer_kinds(const Reader& r, int num_layers) {
  std::vector<uint8_t> linear(static_cast<size_t>(num_layers), 1);
  if (r.has("attn_layer_indices")) {
    const json& a = r.at("attn_layer_indices");
    PAGODA_REQUIRE(a.is_array(), kInvalidArgument,
                   "config.json: attn_layer_indices must be a list of layer indices (got {})",
                   show(a));
    for (const json& e : a) {
      const int64_t l = Reader::integer_value(e, "attn_layer_indices[]", 0, num_layers - 1);
      PAGODA_REQUIRE(linear[static_cast<size_t>(l)] != 0, kInvalidArgument,
                     "config.json: attn_layer_indices lists layer {} twice", l);
      linear[static_cast<size_t>(l)] = 0;
    }
  }
  if (r.has("layers_block_type")) {
    const json& b = r.at("layers_block_type");
    PAGODA_REQUIRE(b.is_array() && static_cast<int>(b.size()) == num_layers, kInvalidArgument,
                   "config.json: layers_block_type must list {} layer kinds (got {})", num_layers,
                   show(b));
    for (int l = 0; l < num_layers; ++l) {
      const json& e = b[static_cast<size_t>(l)];
      const bool mamba = e == "mamba";
      PAGODA_REQUIRE((mamba || e == "attention") &&
                         mamba == (linear[static_cast<size_t>(l)] != 0),
                     kInvalidArgument,
                     "config.json: layers_block_type[{}] = {} disagrees with attn_layer_indices",
                     l, show(e));
    }
  }
  int attention = 0;
  for (uint8_t k : linear) attention += k == 0;
  PAGODA_REQUIRE(attention > 0, kUnsupported,
                 "config.json: attn_layer_indices names no layer: a Bamba model without "
                 "attention layers is not supported (pagoda's engine keeps at least one KV "
                 "layer)");
  return linear;
}

/// time_step_limit [lo, hi] (hi null = no upper bound); transformers' default (0, inf).
void parse_time_step_limit(const Reader& r, MambaConfig& m) {
  m.dt_min = 0.0;
  m.dt_max = std::numeric_limits<double>::infinity();
  if (!r.has("time_step_limit")) return;
  const json& v = r.at("time_step_limit");
  PAGODA_REQUIRE(v.is_array() && v.size() == 2 && v[0].is_number() &&
                     (v[1].is_number() || v[1].is_null()),
                 kInvalidArgument,
                 "config.json: time_step_limit must be [min, max] numbers (got {})", show(v));
  m.dt_min = v[0].get<double>();
  if (v[1].is_number()) m.dt_max = v[1].get<double>();
  PAGODA_REQUIRE(std::isfinite(m.dt_min) && m.dt_min >= 0.0 && m.dt_max > m.dt_min,
                 kInvalidArgument, "config.json: time_step_limit ({}, {}) needs 0 <= min < max",
                 m.dt_min, m.dt_max);
}

MambaConfig parse_mamba(const Reader& r, int hidden) {
  MambaConfig m;
  m.num_heads = static_cast<int>(r.integer_or("mamba_n_heads", 128, 1, kMaxHeads));
  const int64_t expand = r.integer_or("mamba_expand", 2, 1, 64);
  const int64_t d_inner = expand * hidden;
  if (r.has("mamba_d_head") && r.at("mamba_d_head").is_string()) {
    PAGODA_REQUIRE(r.at("mamba_d_head") == "auto", kInvalidArgument,
                   "config.json: mamba_d_head must be an integer or \"auto\" (got {})",
                   show(r.at("mamba_d_head")));
  } else if (r.has("mamba_d_head")) {
    m.head_dim = static_cast<int>(r.integer("mamba_d_head", 1, kMaxHeadDim));
  }
  if (m.head_dim == 0) {
    PAGODA_REQUIRE(d_inner % m.num_heads == 0, kInvalidArgument,
                   "config.json: mamba_n_heads {} must divide mamba_expand {} x hidden_size {}",
                   m.num_heads, expand, hidden);
    m.head_dim = static_cast<int>(d_inner / m.num_heads);
  }
  PAGODA_REQUIRE(int64_t{m.head_dim} * m.num_heads == d_inner, kInvalidArgument,
                 "config.json: mamba_n_heads {} x mamba_d_head {} must equal mamba_expand {} x "
                 "hidden_size {}",
                 m.num_heads, m.head_dim, expand, hidden);
  m.num_groups = static_cast<int>(r.integer_or("mamba_n_groups", 1, 1, kMaxHeads));
  PAGODA_REQUIRE(m.num_heads % m.num_groups == 0, kInvalidArgument,
                 "config.json: mamba_n_groups {} must divide mamba_n_heads {}", m.num_groups,
                 m.num_heads);
  m.state_size = static_cast<int>(r.integer_or("mamba_d_state", 256, 1, kMaxHeadDim));
  m.conv_kernel = static_cast<int>(r.integer_or("mamba_d_conv", 4, 1, 64));
  m.chunk_size = static_cast<int>(r.integer_or("mamba_chunk_size", 256, 1, kMaxPositions));
  m.conv_bias = r.boolean_or("mamba_conv_bias", true);
  m.proj_bias = r.boolean_or("mamba_proj_bias", false);
  parse_time_step_limit(r, m);
  return m;
}

}  // namespace

ModelConfig parse_bamba_config(const json& j) {
  for (const auto& [k, v] : j.items())
    PAGODA_REQUIRE(listed(kBambaKeys, k) || listed(kBambaTrainingKeys, k) || is_harmless_key(k),
                   kUnsupported,
                   "config.json: key '{}' is not supported on BambaForCausalLM (pagoda does not "
                   "implement what it would change)",
                   k);
  const Reader r(j, "");
  const ModelFamily f = ModelFamily::kBamba;
  check_model_type(r, f);
  for (std::string_view k : kBambaTrainingKeys)
    r.number_or(std::string(k).c_str(), 0.0, -1e30, 1e30);
  ModelConfig c;
  c.family = f;
  c.vocab_size = static_cast<int>(r.integer_or("vocab_size", 128000, 1, kMaxVocabSize));
  c.hidden_size = static_cast<int>(r.integer_or("hidden_size", 4096, 1, kMaxModelDim));
  c.intermediate_size = static_cast<int>(r.integer_or("intermediate_size", 14336, 1, kMaxModelDim));
  c.num_layers = static_cast<int>(r.integer_or("num_hidden_layers", 32, 1, kMaxLayers));
  c.num_q_heads = static_cast<int>(r.integer_or("num_attention_heads", 32, 1, kMaxHeads));
  // transformers: null means as many as the q heads; absent, its default 8.
  c.num_kv_heads = static_cast<int>(r.explicitly_null("num_key_value_heads")
                                        ? c.num_q_heads
                                        : r.integer_or("num_key_value_heads", 8, 1, kMaxHeads));
  PAGODA_REQUIRE(c.num_q_heads % c.num_kv_heads == 0, kInvalidArgument,
                 "config.json: num_key_value_heads {} does not divide num_attention_heads {}",
                 c.num_kv_heads, c.num_q_heads);
  if (r.has("head_dim")) {
    c.head_dim = static_cast<int>(r.integer("head_dim", 1, kMaxHeadDim));
  } else {
    PAGODA_REQUIRE(c.hidden_size % c.num_q_heads == 0, kInvalidArgument,
                   "config.json: hidden_size {} is not a multiple of num_attention_heads {} and "
                   "head_dim is not given",
                   c.hidden_size, c.num_q_heads);
    c.head_dim = c.hidden_size / c.num_q_heads;
  }
  PAGODA_REQUIRE(c.head_dim % 4 == 0, kUnsupported,
                 "config.json: head_dim {} is not a multiple of 4 (Bamba's RoPE rotates pairs in "
                 "the first half of each head)",
                 c.head_dim);
  c.rotary_dim = c.head_dim / 2;
  c.rms_norm_eps = static_cast<float>(r.number_or("rms_norm_eps", 1e-5, 1e-30, 0.5));
  c.rope.theta = parse_bamba_rope(r);
  c.max_position_embeddings =
      static_cast<int>(r.integer_or("max_position_embeddings", 262144, 1, kMaxPositions));
  c.tie_word_embeddings = r.boolean_or("tie_word_embeddings", false);
  c.bos_token_id = r.has("bos_token_id") ? parse_token_id(r, "bos_token_id", c.vocab_size)
                                         : (c.vocab_size > 1 ? 1 : -1);
  c.eos_token_id = r.has("eos_token_id") ? parse_token_id(r, "eos_token_id", c.vocab_size)
                                         : (c.vocab_size > 2 ? 2 : -1);
  c.weights_dtype = parse_weights_dtype(r);
  const std::string act = r.string_or("hidden_act", "silu");
  PAGODA_REQUIRE(act == "silu", kUnsupported,
                 "config.json: hidden_act '{}' is not supported on BambaForCausalLM (only silu: "
                 "the MLP and the Mamba2 convolution both use it)",
                 act);
  for (const char* k : {"attention_bias", "mlp_bias"})
    PAGODA_REQUIRE(!r.boolean_or(k, false), kUnsupported,
                   "config.json: {} true is not supported on BambaForCausalLM", k);
  c.linear_layer = parse_layer_kinds(r, c.num_layers);
  c.mamba = parse_mamba(r, c.hidden_size);
  c.validate();
  return c;
}

}  // namespace pagoda::model::config_detail
