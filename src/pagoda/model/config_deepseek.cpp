// The DeepSeek-V2 / V3 / V3.2 config.json parser (config.h, config_from_hf_json): multi-head
// latent attention, YaRN, DeepSeek sparse attention (V3.2's index_* keys), dense MLP layers only. As strict as the Llama-family parser: every key is
// read and checked, one of the MoE bookkeeping keys (unread while no layer is MoE), or harmless
// metadata; anything else is Error(kUnsupported) naming it.
#include <string>
#include <string_view>

#include "pagoda/model/config_reader.h"

namespace pagoda::model::config_detail {

namespace {

/// Keys this parser reads (each checked below).
constexpr std::string_view kDeepseekKeys[] = {
    "architectures",
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "max_position_embeddings",
    "tie_word_embeddings",
    "hidden_act",
    "attention_bias",
    "bos_token_id",
    "eos_token_id",
    "torch_dtype",
    "dtype",
    "pretraining_tp",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "head_dim",
    "qk_head_dim",
    "rope_interleave",
    "n_routed_experts",
    "first_k_dense_replace",
    "moe_layer_freq",
    "num_nextn_predict_layers",
    // DeepSeek's own checkpoints point at their modeling code, whose equations this implements.
    "auto_map",
};

/// DeepSeek-V3.2's lightning-indexer keys: required on deepseek_v32, refused elsewhere.
constexpr const char* kDsaKeys[] = {"index_n_heads", "index_head_dim", "index_topk"};

bool is_dsa_key(std::string_view key) {
  for (const char* k : kDsaKeys)
    if (key == k) return true;
  return false;
}

/// Mixture-of-experts knobs: they change nothing while no layer is MoE (n_routed_experts 0 /
/// null, or first_k_dense_replace covering every layer), which parse_deepseek_config checks.
constexpr std::string_view kMoeOnlyKeys[] = {
    "n_shared_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "topk_method",
    "n_group",
    "topk_group",
    "routed_scaling_factor",
    "scoring_func",
    "norm_topk_prob",
    "aux_loss_alpha",
    "seq_aux",
    "ep_size",
};

/// DeepSeek's rope_scaling: null / absent / "default" = none; "yarn" with its keys (DeepSeek's
/// defaults: beta_fast 32, beta_slow 1, mscale 1, mscale_all_dim 0, original 4096).
RopeConfig parse_deepseek_rope(const Reader& top) {
  RopeConfig r;
  r.theta = top.number_or("rope_theta", 10000.0, 1e-9, 1e15);
  if (!top.has("rope_scaling")) return r;
  const json& s = top.at("rope_scaling");
  PAGODA_REQUIRE(s.is_object(), kInvalidArgument,
                 "config.json: rope_scaling must be an object or null (got {})", show(s));
  static constexpr std::string_view kKeys[] = {
      "type",      "rope_type", "factor", "original_max_position_embeddings",
      "beta_fast", "beta_slow", "mscale", "mscale_all_dim"};
  for (const auto& [k, v] : s.items())
    PAGODA_REQUIRE(listed(kKeys, k), kUnsupported,
                   "config.json: rope_scaling.{} is not supported (it would change the rotary "
                   "embedding)",
                   k);
  const Reader sr(s, "rope_scaling.");
  std::string type = sr.string_or("rope_type", "");
  if (type.empty()) type = sr.string_or("type", "default");
  if (type == "default") return r;
  PAGODA_REQUIRE(type == "yarn", kUnsupported,
                 "config.json: rope_scaling type '{}' is not supported on DeepSeek (supported: "
                 "default, yarn)",
                 type);
  PAGODA_REQUIRE(sr.has("factor"), kInvalidArgument,
                 "config.json: rope_scaling.factor is required for yarn");
  r.scaling = RopeScalingKind::kYarn;
  r.factor = sr.number_or("factor", 1.0, 1e-6, 1e6);
  r.original_max_position =
      sr.integer_or("original_max_position_embeddings", 4096, 1, kMaxPositions);
  r.beta_fast = sr.number_or("beta_fast", 32.0, 1e-6, 1e6);
  r.beta_slow = sr.number_or("beta_slow", 1.0, 1e-6, 1e6);
  r.mscale = sr.number_or("mscale", 1.0, -1e6, 1e6);
  r.mscale_all_dim = sr.number_or("mscale_all_dim", 0.0, -1e6, 1e6);
  return r;
}

/// Refuses a config in which any layer in range would be a mixture-of-experts layer (DeepSeek:
/// layer l is MoE iff n_routed_experts > 0, l >= first_k_dense_replace and l % moe_layer_freq
/// == 0), naming the fields.
void check_dense(const Reader& r, int num_layers) {
  PAGODA_REQUIRE(r.has("n_routed_experts") || r.explicitly_null("n_routed_experts"),
                 kInvalidArgument,
                 "config.json: n_routed_experts is required (0 or null: the dense layout pagoda "
                 "runs; transformers' default differs between V2 and V3)");
  const int64_t experts = r.integer_or("n_routed_experts", 0, 0, int64_t{1} << 20);
  const int64_t first_dense = r.integer_or("first_k_dense_replace", 0, 0, kMaxLayers);
  const int64_t freq = r.integer_or("moe_layer_freq", 1, 1, kMaxLayers);
  for (int64_t l = first_dense; experts > 0 && l < num_layers; ++l)
    PAGODA_REQUIRE(l % freq != 0, kUnsupported,
                   "config.json: n_routed_experts {} makes layer {} a mixture-of-experts layer "
                   "(first_k_dense_replace {}, moe_layer_freq {}, num_hidden_layers {}); MoE is "
                   "not implemented (dense layouts only: n_routed_experts 0 / null or "
                   "first_k_dense_replace >= num_hidden_layers)",
                   experts, l, first_dense, freq, num_layers);
  const int64_t mtp = r.integer_or("num_nextn_predict_layers", 0, 0, kMaxLayers);
  PAGODA_REQUIRE(mtp == 0, kUnsupported,
                 "config.json: num_nextn_predict_layers {} (multi-token prediction layers) is not "
                 "supported (only 0)",
                 mtp);
}

/// The MLA dimensions; head_dim / qk_head_dim (transformers' derived copies) must agree.
MlaConfig parse_mla(const Reader& r) {
  PAGODA_REQUIRE(r.has("q_lora_rank") || r.explicitly_null("q_lora_rank"), kInvalidArgument,
                 "config.json: q_lora_rank is required (an integer, or null for no q LoRA)");
  MlaConfig m;
  m.q_lora_rank = static_cast<int>(r.integer_or("q_lora_rank", 0, 1, kMaxModelDim));
  m.kv_lora_rank = static_cast<int>(r.integer("kv_lora_rank", 1, kMaxModelDim));
  m.qk_nope_head_dim = static_cast<int>(r.integer("qk_nope_head_dim", 1, kMaxHeadDim));
  m.qk_rope_head_dim = static_cast<int>(r.integer("qk_rope_head_dim", 2, kMaxHeadDim));
  m.v_head_dim = static_cast<int>(r.integer("v_head_dim", 1, kMaxHeadDim));
  PAGODA_REQUIRE(m.qk_rope_head_dim % 2 == 0, kInvalidArgument,
                 "config.json: qk_rope_head_dim {} must be even", m.qk_rope_head_dim);
  PAGODA_REQUIRE(!r.has("head_dim") || r.integer("head_dim", 1, kMaxHeadDim) == m.qk_rope_head_dim,
                 kInvalidArgument,
                 "config.json: head_dim must equal qk_rope_head_dim {} on DeepSeek (got {})",
                 m.qk_rope_head_dim, show(r.at("head_dim")));
  PAGODA_REQUIRE(!r.has("qk_head_dim") || r.integer("qk_head_dim", 1, kMaxHeadDim) ==
                                              m.qk_nope_head_dim + m.qk_rope_head_dim,
                 kInvalidArgument,
                 "config.json: qk_head_dim must equal qk_nope_head_dim + qk_rope_head_dim {} "
                 "(got {})",
                 m.qk_nope_head_dim + m.qk_rope_head_dim, show(r.at("qk_head_dim")));
  PAGODA_REQUIRE(r.boolean_or("rope_interleave", true), kUnsupported,
                 "config.json: rope_interleave false is not supported (DeepSeek checkpoints "
                 "rotate interleaved pairs)");
  return m;
}

/// The DSA fields (deepseek_v32 only; every one required: transformers' defaults are the
/// 671B model's).
DsaConfig parse_dsa(const Reader& r, ModelFamily f) {
  if (f != ModelFamily::kDeepseekV32) {
    for (const char* k : kDsaKeys)
      PAGODA_REQUIRE(!r.has(k), kUnsupported,
                     "config.json: key '{}' (DeepSeek sparse attention) is not supported on {}; "
                     "DSA checkpoints are DeepseekV32ForCausalLM (model_type deepseek_v32)",
                     k, hf_architecture_name(f));
    return {};
  }
  for (const char* k : kDsaKeys)
    PAGODA_REQUIRE(r.has(k), kInvalidArgument,
                   "config.json: {} is required on DeepseekV32ForCausalLM", k);
  return DsaConfig{
      .index_n_heads = static_cast<int>(r.integer("index_n_heads", 1, kMaxHeads)),
      .index_head_dim = static_cast<int>(r.integer("index_head_dim", 1, kMaxHeadDim)),
      .index_topk = static_cast<int>(r.integer("index_topk", 1, kMaxPositions))};
}

}  // namespace

ModelConfig parse_deepseek_config(const json& j, ModelFamily f) {
  for (const auto& [k, v] : j.items())
    PAGODA_REQUIRE(listed(kDeepseekKeys, k) || listed(kMoeOnlyKeys, k) || is_dsa_key(k) ||
                       is_harmless_key(k),
                   kUnsupported,
                   "config.json: key '{}' is not supported on {} (pagoda does not implement "
                   "what it would change)",
                   k, hf_architecture_name(f));
  const Reader r(j, "");
  check_model_type(r, f);
  ModelConfig c;
  c.family = f;
  c.vocab_size = static_cast<int>(r.integer("vocab_size", 1, kMaxVocabSize));
  c.hidden_size = static_cast<int>(r.integer("hidden_size", 1, kMaxModelDim));
  c.intermediate_size = static_cast<int>(r.integer("intermediate_size", 1, kMaxModelDim));
  c.num_layers = static_cast<int>(r.integer("num_hidden_layers", 1, kMaxLayers));
  c.num_q_heads = static_cast<int>(r.integer("num_attention_heads", 1, kMaxHeads));
  c.num_kv_heads =
      static_cast<int>(r.integer_or("num_key_value_heads", c.num_q_heads, 1, kMaxHeads));
  PAGODA_REQUIRE(c.num_kv_heads == c.num_q_heads, kUnsupported,
                 "config.json: num_key_value_heads {} differs from num_attention_heads {} (MLA "
                 "expands the latent to every q head)",
                 c.num_kv_heads, c.num_q_heads);
  check_dense(r, c.num_layers);
  c.mla = parse_mla(r);
  c.dsa = parse_dsa(r, f);
  c.head_dim = c.mla.qk_nope_head_dim + c.mla.qk_rope_head_dim;
  c.rms_norm_eps = static_cast<float>(r.number_or("rms_norm_eps", 1e-6, 1e-30, 0.5));
  c.rope = parse_deepseek_rope(r);
  c.max_position_embeddings = static_cast<int>(r.integer_or(
      "max_position_embeddings", f == ModelFamily::kDeepseekV2 ? 2048 : 4096, 1, kMaxPositions));
  c.tie_word_embeddings = r.boolean_or("tie_word_embeddings", false);
  c.bos_token_id = parse_token_id(r, "bos_token_id", c.vocab_size);
  c.eos_token_id = parse_token_id(r, "eos_token_id", c.vocab_size);
  c.weights_dtype = parse_weights_dtype(r);
  const std::string act = r.string_or("hidden_act", "silu");
  PAGODA_REQUIRE(act == "silu", kUnsupported,
                 "config.json: hidden_act '{}' is not supported (only silu)", act);
  PAGODA_REQUIRE(!r.boolean_or("attention_bias", false), kUnsupported,
                 "config.json: attention_bias true is not supported on {}",
                 hf_architecture_name(f));
  PAGODA_REQUIRE(r.integer_or("pretraining_tp", 1, INT64_MIN, INT64_MAX) == 1, kUnsupported,
                 "config.json: pretraining_tp {} is not supported (only 1)",
                 r.integer_or("pretraining_tp", 1, INT64_MIN, INT64_MAX));
  c.validate();
  return c;
}

}  // namespace pagoda::model::config_detail
