#include "pagoda/model/config.h"

#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"

namespace pagoda::model {

bool ModelConfig::has_sliding_window() const {
  for (int w : layer_window)
    if (w >= 0) return true;
  return false;
}

int64_t ModelConfig::num_parameters() const {
  const int64_t h = hidden_size;
  const int64_t qd = int64_t{num_q_heads} * head_dim;
  const int64_t kvd = int64_t{num_kv_heads} * head_dim;
  const int64_t per_layer = 2 * h + h * (qd + 2 * kvd) + qd * h + 3 * h * intermediate_size;
  const int64_t embed = int64_t{vocab_size} * h;
  return embed + (tie_word_embeddings ? 0 : embed) + h + num_layers * per_layer;
}

void ModelConfig::validate() const {
  PAGODA_REQUIRE(vocab_size > 0, kInvalidArgument, "vocab_size must be > 0 (got {})", vocab_size);
  PAGODA_REQUIRE(hidden_size > 0, kInvalidArgument, "hidden_size must be > 0 (got {})",
                 hidden_size);
  PAGODA_REQUIRE(intermediate_size > 0, kInvalidArgument,
                 "intermediate_size must be > 0 (got {})", intermediate_size);
  PAGODA_REQUIRE(num_layers > 0, kInvalidArgument, "num_layers must be > 0 (got {})", num_layers);
  PAGODA_REQUIRE(num_q_heads > 0 && num_kv_heads > 0 && num_q_heads % num_kv_heads == 0,
                 kInvalidArgument, "heads {} / kv heads {}: need kv > 0 dividing q", num_q_heads,
                 num_kv_heads);
  PAGODA_REQUIRE(head_dim > 0 && head_dim % 2 == 0, kInvalidArgument,
                 "head_dim must be even and > 0 (got {})", head_dim);
  PAGODA_REQUIRE(rms_norm_eps > 0.f, kInvalidArgument, "rms_norm_eps must be > 0");
  PAGODA_REQUIRE(rope.theta > 0.0, kInvalidArgument, "rope theta must be > 0");
  PAGODA_REQUIRE(rope.scaling == RopeScalingKind::kNone || rope.factor > 0.0, kInvalidArgument,
                 "rope scaling factor must be > 0");
  PAGODA_REQUIRE(rope.scaling != RopeScalingKind::kLlama3 ||
                     (rope.high_freq_factor > rope.low_freq_factor &&
                      rope.original_max_position > 0),
                 kInvalidArgument, "llama3 rope scaling needs high_freq_factor > low_freq_factor");
  PAGODA_REQUIRE(max_position_embeddings > 0, kInvalidArgument,
                 "max_position_embeddings must be > 0");
  PAGODA_REQUIRE(layer_window.empty() || static_cast<int>(layer_window.size()) == num_layers,
                 kInvalidArgument, "layer_window has {} entries for {} layers",
                 layer_window.size(), num_layers);
  for (int w : layer_window)
    PAGODA_REQUIRE(w >= -1, kInvalidArgument, "sliding window {} < -1", w);
  PAGODA_REQUIRE(attn_logit_softcap >= 0.f && final_logit_softcap >= 0.f, kInvalidArgument,
                 "soft caps must be >= 0");
  PAGODA_REQUIRE(bos_token_id < vocab_size && eos_token_id < vocab_size, kInvalidArgument,
                 "bos/eos token ids must be < vocab_size {}", vocab_size);
}

ModelConfig builtin_tiny_config() {
  return ModelConfig{
      .vocab_size = 320,
      .hidden_size = 256,
      .intermediate_size = 768,
      .num_layers = 4,
      .num_q_heads = 4,
      .num_kv_heads = 2,
      .head_dim = 64,
      .rms_norm_eps = 1e-5f,
      .rope = RopeConfig{.theta = 10000.0},
      .max_position_embeddings = 4096,
      .tie_word_embeddings = false,
      .layer_window = {},
      .attn_logit_softcap = 0.f,
      .final_logit_softcap = 0.f,
      .bos_token_id = 256,
      .eos_token_id = 257,
      .name = "builtin-tiny",
  };
}

namespace {

template <typename T>
T get_or(const nlohmann::json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return it->get<T>();
}

int first_token_id(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return -1;
  if (it->is_array()) return it->empty() ? -1 : (*it)[0].get<int>();
  return it->get<int>();
}

RopeConfig parse_rope(const nlohmann::json& j) {
  RopeConfig r;
  r.theta = get_or<double>(j, "rope_theta", 10000.0);
  // transformers >= 5 folds rope_theta and rope_scaling into rope_parameters.
  auto it = j.find("rope_parameters");
  if (it != j.end() && it->is_object()) {
    r.theta = get_or<double>(*it, "rope_theta", r.theta);
  } else {
    it = j.find("rope_scaling");
  }
  if (it == j.end() || it->is_null()) return r;
  const nlohmann::json& s = *it;
  std::string type = get_or<std::string>(s, "rope_type", "");
  if (type.empty()) type = get_or<std::string>(s, "type", "default");
  if (type == "default") return r;
  r.factor = get_or<double>(s, "factor", 1.0);
  if (type == "linear") {
    r.scaling = RopeScalingKind::kLinear;
  } else if (type == "llama3") {
    r.scaling = RopeScalingKind::kLlama3;
    r.low_freq_factor = get_or<double>(s, "low_freq_factor", 1.0);
    r.high_freq_factor = get_or<double>(s, "high_freq_factor", 4.0);
    r.original_max_position = get_or<int64_t>(s, "original_max_position_embeddings", 8192);
  } else {
    throw_error(ErrorCode::kUnsupported,
                "rope_scaling type '{}' is not supported (supported: default, linear, llama3)",
                type);
  }
  return r;
}

}  // namespace

ModelConfig config_from_hf_json(const nlohmann::json& j) {
  try {
    ModelConfig c;
    c.vocab_size = j.at("vocab_size").get<int>();
    c.hidden_size = j.at("hidden_size").get<int>();
    c.intermediate_size = j.at("intermediate_size").get<int>();
    c.num_layers = j.at("num_hidden_layers").get<int>();
    c.num_q_heads = j.at("num_attention_heads").get<int>();
    c.num_kv_heads = get_or<int>(j, "num_key_value_heads", c.num_q_heads);
    c.head_dim = get_or<int>(j, "head_dim", c.num_q_heads > 0 ? c.hidden_size / c.num_q_heads : 0);
    c.rms_norm_eps = get_or<float>(j, "rms_norm_eps", 1e-6f);
    c.rope = parse_rope(j);
    c.max_position_embeddings = get_or<int>(j, "max_position_embeddings", 4096);
    c.tie_word_embeddings = get_or<bool>(j, "tie_word_embeddings", false);
    c.attn_logit_softcap = get_or<float>(j, "attn_logit_softcapping", 0.f);
    c.final_logit_softcap = get_or<float>(j, "final_logit_softcapping", 0.f);
    c.bos_token_id = first_token_id(j, "bos_token_id");
    c.eos_token_id = first_token_id(j, "eos_token_id");
    PAGODA_REQUIRE(!get_or<bool>(j, "attention_bias", false) && !get_or<bool>(j, "mlp_bias", false),
                   kUnsupported, "attention_bias / mlp_bias checkpoints are not supported");
    const std::string act = get_or<std::string>(j, "hidden_act", "silu");
    PAGODA_REQUIRE(act == "silu", kUnsupported, "hidden_act '{}' unsupported (only silu)", act);
    const int window = get_or<int>(j, "sliding_window", -1);
    const bool use_window = get_or<bool>(j, "use_sliding_window", true);
    if (window > 0 && use_window) {
      c.layer_window.assign(c.num_layers, window - 1);
      auto lt = j.find("layer_types");
      if (lt != j.end() && lt->is_array() && static_cast<int>(lt->size()) == c.num_layers) {
        for (int l = 0; l < c.num_layers; ++l)
          if ((*lt)[l].get<std::string>() != "sliding_attention") c.layer_window[l] = -1;
      }
    }
    c.validate();
    return c;
  } catch (const nlohmann::json::exception& e) {
    throw_error(ErrorCode::kInvalidArgument, "config.json: {}", e.what());
  }
}

}  // namespace pagoda::model
