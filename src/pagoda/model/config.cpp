#include "pagoda/model/config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/model/config_reader.h"

namespace pagoda::model {

bool ModelConfig::has_linear_layers() const {
  for (uint8_t k : linear_layer)
    if (k != 0) return true;
  return false;
}

int ModelConfig::num_attention_layers() const {
  int n = num_layers;
  for (uint8_t k : linear_layer) n -= k != 0;
  return n;
}

bool ModelConfig::has_sliding_window() const {
  for (int w : layer_window)
    if (w >= 0) return true;
  return false;
}

float ModelConfig::attention_scaling() const {
  const double base = query_pre_attn_scalar > 0.0 ? query_pre_attn_scalar : double(head_dim);
  double m = 1.0;  // DeepSeek's YaRN: softmax_scale *= mscale² with mscale from mscale_all_dim
  if (rope.scaling == RopeScalingKind::kYarn && rope.mscale_all_dim != 0.0)
    m = yarn_get_mscale(rope.factor, rope.mscale_all_dim);
  return static_cast<float>(m * m / std::sqrt(base));
}

int64_t ModelConfig::num_parameters() const {
  const int64_t h = hidden_size;
  const int64_t qd = int64_t{num_q_heads} * head_dim;
  const int64_t kvd = int64_t{num_kv_heads} * head_dim;
  const int64_t norms = (sandwich_norms ? 4 * h : 2 * h) + (qk_norm ? 2 * head_dim : 0);
  int64_t per_layer = norms + h * (qd + 2 * kvd) + qd * h + 3 * h * intermediate_size;
  if (is_mla()) {
    const MlaConfig& m = mla;
    const int64_t hq = num_q_heads, qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    const int64_t q = m.q_lora_rank > 0 ? int64_t{m.q_lora_rank} * (h + 1) + hq * qk * m.q_lora_rank
                                        : hq * qk * h;
    const int64_t kv = (int64_t{m.kv_lora_rank} + m.qk_rope_head_dim) * h + m.kv_lora_rank +
                       hq * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank;
    per_layer = 2 * h + q + kv + hq * m.v_head_dim * h + 3 * h * intermediate_size;
    const int64_t ih = dsa.index_n_heads, id = dsa.index_head_dim;
    per_layer += ih * id * m.q_lora_rank + id * h + 2 * id + ih * h;  // the DSA indexer
  }
  const int64_t embed = int64_t{vocab_size} * h;
  int64_t linear = 0;  // a Mamba2 layer replaces the attention block
  if (has_linear_layers()) {
    const MambaConfig& m = mamba;
    const int64_t di = m.d_inner(), cd = m.conv_dim(), proj = di + cd + m.num_heads;
    const int64_t mixer = proj * h + cd * m.conv_kernel + 3 * m.num_heads + di + h * di +
                          (m.conv_bias ? cd : 0) + (m.proj_bias ? proj + h : 0);
    const int64_t attn = h * (qd + 2 * kvd) + qd * h;
    linear = num_linear_layers() * (mixer - attn);
  }
  return linear + embed + (tie_word_embeddings ? 0 : embed) + h + num_layers * per_layer;
}

namespace {

/// a * b (both >= 0) capped at INT64_MAX instead of overflowing.
int64_t sat_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

}  // namespace

std::string_view hf_architecture_name(ModelFamily f) {
  switch (f) {
    case ModelFamily::kLlama:
      return "LlamaForCausalLM";
    case ModelFamily::kMistral:
      return "MistralForCausalLM";
    case ModelFamily::kQwen2:
      return "Qwen2ForCausalLM";
    case ModelFamily::kGemma2:
      return "Gemma2ForCausalLM";
    case ModelFamily::kGemma3:
      return "Gemma3ForCausalLM";
    case ModelFamily::kDeepseekV2:
      return "DeepseekV2ForCausalLM";
    case ModelFamily::kDeepseekV3:
      return "DeepseekV3ForCausalLM";
    case ModelFamily::kDeepseekV32:
      return "DeepseekV32ForCausalLM";
    case ModelFamily::kBamba:
      return "BambaForCausalLM";
  }
  return "?";
}

void ModelConfig::validate() const {
  const auto in = [](int64_t v, int64_t hi) { return v > 0 && v <= hi; };
  PAGODA_REQUIRE(in(vocab_size, kMaxVocabSize), kInvalidArgument,
                 "vocab_size must be in [1, {}] (got {})", kMaxVocabSize, vocab_size);
  PAGODA_REQUIRE(in(hidden_size, kMaxModelDim), kInvalidArgument,
                 "hidden_size must be in [1, {}] (got {})", kMaxModelDim, hidden_size);
  PAGODA_REQUIRE(in(intermediate_size, kMaxModelDim), kInvalidArgument,
                 "intermediate_size must be in [1, {}] (got {})", kMaxModelDim, intermediate_size);
  PAGODA_REQUIRE(in(num_layers, kMaxLayers), kInvalidArgument,
                 "num_layers must be in [1, {}] (got {})", kMaxLayers, num_layers);
  PAGODA_REQUIRE(
      in(num_q_heads, kMaxHeads) && in(num_kv_heads, kMaxHeads) && num_q_heads % num_kv_heads == 0,
      kInvalidArgument, "heads {} / kv heads {}: need kv > 0 dividing q (at most {})", num_q_heads,
      num_kv_heads, kMaxHeads);
  PAGODA_REQUIRE(in(head_dim, kMaxHeadDim) && head_dim % 2 == 0, kInvalidArgument,
                 "head_dim must be even and in [2, {}] (got {})", kMaxHeadDim, head_dim);
  const int64_t qd = int64_t{num_q_heads} * head_dim;
  PAGODA_REQUIRE(sat_mul(qd, hidden_size) <= kMaxTensorElements &&
                     sat_mul(vocab_size, hidden_size) <= kMaxTensorElements &&
                     sat_mul(intermediate_size, hidden_size) <= kMaxTensorElements,
                 kInvalidArgument,
                 "a weight matrix would exceed {} elements (hidden {}, q width {}, vocab {}, "
                 "intermediate {})",
                 kMaxTensorElements, hidden_size, qd, vocab_size, intermediate_size);
  PAGODA_REQUIRE(rms_norm_eps > 0.f && rms_norm_eps < 1.f, kInvalidArgument,
                 "rms_norm_eps must be in (0, 1) (got {})", rms_norm_eps);
  PAGODA_REQUIRE(rope.theta > 0.0 && std::isfinite(rope.theta), kInvalidArgument,
                 "rope theta must be finite and > 0");
  PAGODA_REQUIRE(
      rope.scaling == RopeScalingKind::kNone || (rope.factor > 0.0 && std::isfinite(rope.factor)),
      kInvalidArgument, "rope scaling factor must be finite and > 0");
  PAGODA_REQUIRE(rope.scaling != RopeScalingKind::kLlama3 ||
                     (rope.high_freq_factor > rope.low_freq_factor && rope.low_freq_factor > 0.0 &&
                      std::isfinite(rope.high_freq_factor) && rope.original_max_position > 0),
                 kInvalidArgument,
                 "llama3 rope scaling needs high_freq_factor > low_freq_factor > 0 and "
                 "original_max_position_embeddings > 0");
  PAGODA_REQUIRE(in(max_position_embeddings, kMaxPositions), kInvalidArgument,
                 "max_position_embeddings must be in [1, {}] (got {})", kMaxPositions,
                 max_position_embeddings);
  PAGODA_REQUIRE(layer_window.empty() || static_cast<int>(layer_window.size()) == num_layers,
                 kInvalidArgument, "layer_window has {} entries for {} layers", layer_window.size(),
                 num_layers);
  for (int w : layer_window)
    PAGODA_REQUIRE(w >= -1 && w < kMaxPositions, kInvalidArgument,
                   "sliding window {} outside [-1, {})", w, kMaxPositions);
  PAGODA_REQUIRE(attn_logit_softcap >= 0.f && final_logit_softcap >= 0.f &&
                     std::isfinite(attn_logit_softcap) && std::isfinite(final_logit_softcap),
                 kInvalidArgument, "soft caps must be finite and >= 0");
  PAGODA_REQUIRE(bos_token_id >= -1 && eos_token_id >= -1 && bos_token_id < vocab_size &&
                     eos_token_id < vocab_size,
                 kInvalidArgument, "bos/eos token ids {} / {} must be in [-1, vocab_size {})",
                 bos_token_id, eos_token_id, vocab_size);
  PAGODA_REQUIRE(
      weights_dtype == DType::kF32 || weights_dtype == DType::kF16 || weights_dtype == DType::kBF16,
      kInvalidArgument, "weights_dtype must be f32, f16 or bf16 (got {})", weights_dtype);
  PAGODA_REQUIRE(std::isfinite(embed_scale) && embed_scale > 0.f, kInvalidArgument,
                 "embed_scale must be finite and > 0 (got {})", embed_scale);
  PAGODA_REQUIRE(std::isfinite(query_pre_attn_scalar) && query_pre_attn_scalar >= 0.0,
                 kInvalidArgument, "query_pre_attn_scalar must be finite and >= 0 (got {})",
                 query_pre_attn_scalar);
  PAGODA_REQUIRE(
      rope.scaling != RopeScalingKind::kYarn ||
          (rope.original_max_position > 0 && std::isfinite(rope.beta_fast) &&
           std::isfinite(rope.beta_slow) && rope.beta_fast > 0.0 && rope.beta_slow > 0.0 &&
           std::isfinite(rope.mscale) && std::isfinite(rope.mscale_all_dim)),
      kInvalidArgument,
      "yarn rope scaling needs original_max_position_embeddings > 0, beta_fast / "
      "beta_slow > 0 and finite mscale / mscale_all_dim");
  if (is_mla()) validate_mla();
  if (!linear_layer.empty()) validate_mamba();
  PAGODA_REQUIRE(rotary_dim >= 0 && rotary_dim <= head_dim && rotary_dim % 2 == 0,
                 kInvalidArgument, "rotary_dim {} must be even and in [0, head_dim {}]",
                 rotary_dim, head_dim);
  PAGODA_REQUIRE(std::isfinite(local_rope.theta) && local_rope.theta >= 0.0 &&
                     local_rope.scaling == RopeScalingKind::kNone,
                 kInvalidArgument, "the local RoPE needs a finite theta >= 0 and no scaling");
}

void ModelConfig::validate_mla() const {
  const MlaConfig& m = mla;
  const auto in = [](int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; };
  PAGODA_REQUIRE(in(m.q_lora_rank, 0, kMaxModelDim) && in(m.kv_lora_rank, 1, kMaxModelDim),
                 kInvalidArgument, "q_lora_rank {} / kv_lora_rank {} outside [0 / 1, {}]",
                 m.q_lora_rank, m.kv_lora_rank, kMaxModelDim);
  PAGODA_REQUIRE(in(m.qk_nope_head_dim, 1, kMaxHeadDim) && in(m.v_head_dim, 1, kMaxHeadDim) &&
                     in(m.qk_rope_head_dim, 2, kMaxHeadDim) && m.qk_rope_head_dim % 2 == 0,
                 kInvalidArgument,
                 "qk_nope_head_dim {} / v_head_dim {} must be in [1, {}] and qk_rope_head_dim {} "
                 "even in [2, {}]",
                 m.qk_nope_head_dim, m.v_head_dim, kMaxHeadDim, m.qk_rope_head_dim, kMaxHeadDim);
  PAGODA_REQUIRE(head_dim == m.qk_nope_head_dim + m.qk_rope_head_dim && num_kv_heads == num_q_heads,
                 kInvalidArgument,
                 "an MLA config has head_dim = qk_nope + qk_rope ({}, got {}) and as many kv "
                 "heads as q heads ({}, got {})",
                 m.qk_nope_head_dim + m.qk_rope_head_dim, head_dim, num_q_heads, num_kv_heads);
  const int64_t hq = num_q_heads;
  PAGODA_REQUIRE(
      sat_mul(hq * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank) <= kMaxTensorElements &&
          sat_mul(hq * head_dim, std::max(m.q_lora_rank, hidden_size)) <= kMaxTensorElements &&
          sat_mul(hq * m.v_head_dim, hidden_size) <= kMaxTensorElements,
      kInvalidArgument, "an MLA weight matrix would exceed {} elements", kMaxTensorElements);
  if (dsa.index_topk == 0 && dsa.index_n_heads == 0 && dsa.index_head_dim == 0) return;
  const DsaConfig& d = dsa;
  PAGODA_REQUIRE(in(d.index_topk, 1, kMaxPositions) && in(d.index_n_heads, 1, kMaxHeads) &&
                     in(d.index_head_dim, m.qk_rope_head_dim, kMaxHeadDim),
                 kInvalidArgument,
                 "DSA needs index_topk in [1, {}], index_n_heads in [1, {}] and index_head_dim in "
                 "[qk_rope_head_dim {}, {}] (got {}, {}, {})",
                 kMaxPositions, kMaxHeads, m.qk_rope_head_dim, kMaxHeadDim, d.index_topk,
                 d.index_n_heads, d.index_head_dim);
  PAGODA_REQUIRE(m.q_lora_rank > 0, kUnsupported,
                 "DSA needs q LoRA (the indexer's queries come from the q LoRA latent; "
                 "q_lora_rank is null)");
}

void ModelConfig::validate_mamba() const {
  const MambaConfig& m = mamba;
  PAGODA_REQUIRE(static_cast<int>(linear_layer.size()) == num_layers, kInvalidArgument,
                 "linear_layer has {} entries for {} layers", linear_layer.size(), num_layers);
  PAGODA_REQUIRE(!is_mla() && !has_sliding_window(), kInvalidArgument,
                 "Mamba2 layers beside MLA or sliding-window layers are not a supported layout");
  const auto in = [](int64_t v, int64_t hi) { return v > 0 && v <= hi; };
  PAGODA_REQUIRE(in(m.num_heads, kMaxHeads) && in(m.head_dim, kMaxHeadDim) &&
                     in(m.state_size, kMaxHeadDim) && in(m.num_groups, kMaxHeads) &&
                     m.num_heads % m.num_groups == 0 && in(m.conv_kernel, 64) &&
                     in(m.chunk_size, kMaxPositions),
                 kInvalidArgument,
                 "Mamba2 sizes: heads {}, head dim {}, state {}, groups {} (dividing the heads), "
                 "conv kernel {} (at most 64), chunk {}",
                 m.num_heads, m.head_dim, m.state_size, m.num_groups, m.conv_kernel, m.chunk_size);
  PAGODA_REQUIRE(sat_mul(int64_t{m.d_inner()} + m.conv_dim() + m.num_heads, hidden_size) <=
                     kMaxTensorElements,
                 kInvalidArgument, "the Mamba2 in_proj would exceed {} elements",
                 kMaxTensorElements);
  PAGODA_REQUIRE(!std::isnan(m.dt_min) && !std::isnan(m.dt_max) && m.dt_min >= 0.0 &&
                     m.dt_max > m.dt_min,
                 kInvalidArgument, "time_step_limit ({}, {}) needs 0 <= min < max", m.dt_min,
                 m.dt_max);
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

using nlohmann::json;
using namespace config_detail;

/// Keys whose value pagoda reads (each is checked where it is parsed).
constexpr std::string_view kUnderstoodKeys[] = {
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
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "hidden_activation",
    "query_pre_attn_scalar",
    "rope_local_base_freq",
    "sliding_window_pattern",
    "_sliding_window_pattern",
    "use_bidirectional_attention",
    "bos_token_id",
    "eos_token_id",
    "torch_dtype",
    "dtype",
    "pretraining_tp",
    "use_mrope",
};

/// Keys that never change the forward pass of these decoders (bookkeeping, training-only
/// dropout and init, generation-time defaults, classification-head labels).
constexpr std::string_view kHarmlessKeys[] = {
    "transformers_version",
    "_name_or_path",
    "initializer_range",
    "use_cache",
    "pad_token_id",
    "attention_dropout",
    "embd_pdrop",
    "resid_pdrop",
    "hidden_dropout",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "use_return_dict",
    "torchscript",
    "tokenizer_class",
    "chunk_size_feed_forward",
    "id2label",
    "label2id",
    "problem_type",
    "sep_token_id",
    "decoder_start_token_id",
    "task_specific_params",
    "finetuning_task",
    "prefix",
    "is_decoder",
    "tie_encoder_decoder",
    "_attn_implementation_autoset",
    "cache_implementation",  // Gemma's generation-time cache hint ("hybrid")
};

constexpr ModelFamily kFamilies[] = {
    ModelFamily::kLlama,  ModelFamily::kMistral,    ModelFamily::kQwen2,     ModelFamily::kGemma2,
    ModelFamily::kGemma3, ModelFamily::kDeepseekV2, ModelFamily::kDeepseekV3,
    ModelFamily::kDeepseekV32, ModelFamily::kBamba};

}  // namespace

std::string_view hf_model_type(ModelFamily f) {
  switch (f) {
    case ModelFamily::kLlama:
      return "llama";
    case ModelFamily::kMistral:
      return "mistral";
    case ModelFamily::kQwen2:
      return "qwen2";
    case ModelFamily::kGemma2:
      return "gemma2";
    case ModelFamily::kGemma3:
      return "gemma3_text";
    case ModelFamily::kDeepseekV2:
      return "deepseek_v2";
    case ModelFamily::kDeepseekV3:
      return "deepseek_v3";
    case ModelFamily::kDeepseekV32:
      return "deepseek_v32";
    case ModelFamily::kBamba:
      return "bamba";
  }
  return "?";
}

bool is_gemma_family(ModelFamily f) {
  return f == ModelFamily::kGemma2 || f == ModelFamily::kGemma3;
}

bool is_deepseek_family(ModelFamily f) {
  return f == ModelFamily::kDeepseekV2 || f == ModelFamily::kDeepseekV3 ||
         f == ModelFamily::kDeepseekV32;
}

double yarn_get_mscale(double factor, double m) {
  return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}

namespace config_detail {

ModelFamily parse_family(const Reader& r) {
  if (r.has("architectures")) {
    const json& a = r.at("architectures");
    PAGODA_REQUIRE(a.is_array() && a.size() == 1 && a[0].is_string(), kInvalidArgument,
                   "config.json: architectures must be a list of one name (got {})", show(a));
    const std::string arch = a[0].get<std::string>();
    for (ModelFamily f : kFamilies)
      if (arch == hf_architecture_name(f)) return f;
    throw_error(ErrorCode::kUnsupported,
                "config.json: architectures '{}' is not supported (supported: LlamaForCausalLM, "
                "MistralForCausalLM, Qwen2ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, "
                "DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, DeepseekV32ForCausalLM, "
                "BambaForCausalLM)",
                arch);
  }
  PAGODA_REQUIRE(r.has("model_type"), kInvalidArgument,
                 "config.json has neither architectures nor model_type");
  const std::string type = r.string_or("model_type", "");
  for (ModelFamily f : kFamilies)
    if (type == hf_model_type(f)) return f;
  throw_error(ErrorCode::kUnsupported,
              "config.json: model_type '{}' is not supported (supported: llama, mistral, qwen2, "
              "gemma2, gemma3_text, deepseek_v2, deepseek_v3, deepseek_v32, bamba)",
              type);
}

void check_model_type(const Reader& r, ModelFamily f) {
  if (!r.has("model_type")) return;
  const std::string type = r.string_or("model_type", "");
  const std::string_view want = hf_model_type(f);
  PAGODA_REQUIRE(type == want, kUnsupported,
                 "config.json: model_type '{}' does not match architectures {} (expected '{}')",
                 type, hf_architecture_name(f), want);
}

int parse_token_id(const Reader& r, const char* key, int64_t vocab) {
  if (!r.has(key)) return -1;
  const json& v = r.at(key);
  if (v.is_array()) {
    if (v.empty()) return -1;
    for (const json& e : v) Reader::integer_value(e, r.name(key), 0, vocab - 1);
    return static_cast<int>(Reader::integer_value(v[0], r.name(key), 0, vocab - 1));
  }
  return static_cast<int>(r.integer(key, 0, vocab - 1));
}

DType parse_weights_dtype(const Reader& r) {
  const char* key = r.has("dtype") ? "dtype" : "torch_dtype";
  const std::string s = r.string_or(key, "float32");
  if (s == "float32") return DType::kF32;
  if (s == "float16") return DType::kF16;
  if (s == "bfloat16") return DType::kBF16;
  throw_error(ErrorCode::kUnsupported,
              "config.json: {} '{}' is not supported (supported: float32, float16, bfloat16)", key,
              s);
}

bool is_harmless_key(std::string_view key) {
  return listed(kHarmlessKeys, key);
}

}  // namespace config_detail

namespace {

/// Keys only the Gemma families have, and keys transformers' Gemma never reads: either on the
/// other side is an error naming it (it would be silently ignored otherwise).
void check_family_keys(const Reader& r, ModelFamily f) {
  static constexpr const char* kGemmaOnly[] = {
      "hidden_activation",      "query_pre_attn_scalar",   "rope_local_base_freq",
      "sliding_window_pattern", "_sliding_window_pattern", "use_bidirectional_attention"};
  static constexpr const char* kNotGemma[] = {"use_sliding_window", "max_window_layers",
                                              "mlp_bias",           "pretraining_tp",
                                              "use_mrope",          "partial_rotary_factor"};
  const bool gemma = is_gemma_family(f);
  const std::span<const char* const> refused =
      gemma ? std::span<const char* const>(kNotGemma) : std::span<const char* const>(kGemmaOnly);
  for (const char* k : refused)
    PAGODA_REQUIRE(!r.has(k), kUnsupported, "config.json: {} is not a {} key (not supported)", k,
                   hf_architecture_name(f));
  PAGODA_REQUIRE(
      f == ModelFamily::kGemma3 ||
          (!r.has("sliding_window_pattern") && !r.has("_sliding_window_pattern") &&
           !r.has("rope_local_base_freq")),
      kUnsupported,
      "config.json: sliding_window_pattern / rope_local_base_freq are Gemma3ForCausalLM keys, "
      "not {} ones",
      hf_architecture_name(f));
}

/// The rotary settings in the object `s` (rope_scaling, or rope_parameters of transformers 5),
/// over `r` (its theta from the top level); `key` names it in errors.
RopeConfig parse_rope_object(const json& s, const std::string& key, RopeConfig r) {
  PAGODA_REQUIRE(s.is_object(), kInvalidArgument, "config.json: {} must be an object (got {})", key,
                 show(s));
  const Reader sr(s, key + ".");
  for (const auto& [k, v] : s.items()) {
    static constexpr std::string_view kRopeKeys[] = {"type",
                                                     "rope_type",
                                                     "factor",
                                                     "low_freq_factor",
                                                     "high_freq_factor",
                                                     "original_max_position_embeddings",
                                                     "rope_theta",
                                                     "partial_rotary_factor"};
    PAGODA_REQUIRE(listed(kRopeKeys, k), kUnsupported,
                   "config.json: {}.{} is not supported (it would change the rotary embedding)",
                   key, k);
  }
  // transformers >= 5 keeps rope_theta inside rope_parameters.
  r.theta = sr.number_or("rope_theta", r.theta, 1e-9, 1e15);
  const double inner_partial = sr.number_or("partial_rotary_factor", 1.0, 0.0, 1.0);
  PAGODA_REQUIRE(inner_partial == 1.0, kUnsupported,
                 "config.json: {}.partial_rotary_factor {} is not supported (only 1.0)", key,
                 inner_partial);
  std::string type = sr.string_or("rope_type", "");
  if (type.empty()) type = sr.string_or("type", "default");
  if (type == "default") return r;
  r.factor = sr.number_or("factor", 1.0, 1e-6, 1e6);
  if (type == "linear") {
    r.scaling = RopeScalingKind::kLinear;
  } else if (type == "llama3") {
    r.scaling = RopeScalingKind::kLlama3;
    r.low_freq_factor = sr.number_or("low_freq_factor", 1.0, 1e-6, 1e6);
    r.high_freq_factor = sr.number_or("high_freq_factor", 4.0, 1e-6, 1e6);
    r.original_max_position =
        sr.integer_or("original_max_position_embeddings", 8192, 1, kMaxPositions);
  } else if (type == "dynamic") {
    throw_error(ErrorCode::kUnsupported,
                "config.json: {} type 'dynamic' (dynamic NTK) is not supported: its frequencies "
                "depend on the sequence length, which a paged KV cache cannot follow "
                "(supported: default, linear, llama3)",
                key);
  } else {
    throw_error(ErrorCode::kUnsupported,
                "config.json: {} type '{}' is not supported (supported: default, linear, llama3)",
                key, type);
  }
  return r;
}

/// The global RoPE, and for Gemma 3 the local one (`local`, theta rope_local_base_freq, default
/// 10000; transformers 5 writes rope_parameters {full_attention: {...}, sliding_attention: {...}}).
RopeConfig parse_rope(const Reader& top, ModelFamily f, RopeConfig* local) {
  RopeConfig r;
  r.theta = top.number_or("rope_theta", f == ModelFamily::kGemma3 ? 1e6 : 10000.0, 1e-9, 1e15);
  const double partial = top.number_or("partial_rotary_factor", 1.0, 0.0, 1.0);
  PAGODA_REQUIRE(partial == 1.0, kUnsupported,
                 "config.json: partial_rotary_factor {} is not supported (only 1.0)", partial);
  const bool params = top.has("rope_parameters");
  PAGODA_REQUIRE(!(params && top.has("rope_scaling")), kUnsupported,
                 "config.json: both rope_parameters and rope_scaling are set");
  const std::string key = params ? "rope_parameters" : "rope_scaling";
  if (f == ModelFamily::kGemma3) {
    *local = RopeConfig{.theta = top.number_or("rope_local_base_freq", 10000.0, 1e-9, 1e15)};
    if (params && top.at("rope_parameters").contains("full_attention")) {
      const json& p = top.at("rope_parameters");
      for (const auto& [k, v] : p.items())
        PAGODA_REQUIRE(k == "full_attention" || k == "sliding_attention", kUnsupported,
                       "config.json: rope_parameters.{} is not supported (full_attention, "
                       "sliding_attention)",
                       k);
      if (p.contains("sliding_attention")) {
        *local = parse_rope_object(p.at("sliding_attention"), "rope_parameters.sliding_attention",
                                   *local);
        PAGODA_REQUIRE(local->scaling == RopeScalingKind::kNone, kUnsupported,
                       "config.json: rope_parameters.sliding_attention: only the default rope "
                       "is supported on Gemma 3's local layers");
      }
      return parse_rope_object(p.at("full_attention"), "rope_parameters.full_attention", r);
    }
  }
  if (!top.has(key.c_str())) return r;
  return parse_rope_object(top.at(key.c_str()), key, r);
}

/// Per-layer windows (FlashInfer convention, HF sliding_window - 1) by family:
///   Llama: none (transformers' Llama has no sliding window; a non-null sliding_window is an
///          error rather than silently different numbers).
///   Mistral: sliding_window (default 4096; null = none) on every layer.
///   Qwen2: only when use_sliding_window (default false): the layers l >= max_window_layers, or
///          those layer_types marks.
///   Gemma 2 / 3: sliding_window (default 4096) on the layers l with (l + 1) % pattern != 0
///          (pattern 2, Gemma 3 sliding_window_pattern default 6), or those layer_types marks.
std::vector<int> parse_windows(const Reader& r, ModelFamily f, int num_layers) {
  PAGODA_REQUIRE(f != ModelFamily::kMistral || !r.has("layer_types"), kUnsupported,
                 "config.json: layer_types on MistralForCausalLM is not supported "
                 "(transformers' Mistral ignores it)");
  std::vector<std::string> types;
  if (r.has("layer_types")) {
    const json& lt = r.at("layer_types");
    PAGODA_REQUIRE(lt.is_array() && static_cast<int64_t>(lt.size()) == num_layers, kInvalidArgument,
                   "config.json: layer_types must be a list of {} names", num_layers);
    for (const json& e : lt) {
      PAGODA_REQUIRE(e.is_string() && (e == "sliding_attention" || e == "full_attention"),
                     kUnsupported,
                     "config.json: layer_types entry {} is not supported (sliding_attention, "
                     "full_attention)",
                     show(e));
      types.push_back(e.get<std::string>());
    }
  }
  int64_t window = -1;  // HF sliding_window; -1 = none
  bool enabled = false;
  int64_t first_sliding = 0;
  int64_t pattern = 0;  // Gemma: every pattern-th layer is global; 0 = the max_window_layers rule
  switch (f) {
    case ModelFamily::kLlama:
      PAGODA_REQUIRE(
          !r.has("sliding_window") && !r.boolean_or("use_sliding_window", false), kUnsupported,
          "config.json: sliding_window on LlamaForCausalLM is not supported "
          "(transformers' Llama ignores it; use MistralForCausalLM or Qwen2ForCausalLM)");
      PAGODA_REQUIRE(!r.has("max_window_layers"), kUnsupported,
                     "config.json: max_window_layers is not a LlamaForCausalLM key");
      for (const std::string& t : types)
        PAGODA_REQUIRE(t == "full_attention", kUnsupported,
                       "config.json: layer_types '{}' on LlamaForCausalLM is not supported", t);
      return {};
    case ModelFamily::kMistral:
      PAGODA_REQUIRE(!r.has("use_sliding_window") && !r.has("max_window_layers"), kUnsupported,
                     "config.json: use_sliding_window / max_window_layers are not "
                     "MistralForCausalLM keys");
      enabled = true;
      // Absent: HF's default 4096; null (Mistral v0.2 and later): no window.
      window = r.explicitly_null("sliding_window")
                   ? -1
                   : r.integer_or("sliding_window", 4096, 1, kMaxPositions);
      break;
    case ModelFamily::kQwen2:
      enabled = r.boolean_or("use_sliding_window", false);
      window = r.explicitly_null("sliding_window")
                   ? -1
                   : r.integer_or("sliding_window", 4096, 1, kMaxPositions);
      first_sliding = r.integer_or("max_window_layers", 28, 0, kMaxLayers);
      pattern = 0;
      // transformers < 4.53 reads max_window_layers, later versions layer_types: they must agree.
      if (enabled && window >= 0 && !types.empty() && r.has("max_window_layers")) {
        for (int l = 0; l < num_layers; ++l)
          PAGODA_REQUIRE((types[l] == "sliding_attention") == (l >= first_sliding), kUnsupported,
                         "config.json: layer_types[{}] = {} disagrees with max_window_layers {}", l,
                         types[l], first_sliding);
      }
      break;
    case ModelFamily::kGemma2:
    case ModelFamily::kGemma3:
      enabled = true;
      PAGODA_REQUIRE(!r.explicitly_null("sliding_window"), kUnsupported,
                     "config.json: sliding_window null on {} is not supported",
                     hf_architecture_name(f));
      window = r.integer_or("sliding_window", 4096, 1, kMaxPositions);
      pattern = f == ModelFamily::kGemma2 ? 2 : 6;
      // transformers 5 also writes the pattern as _sliding_window_pattern: each must agree with
      // layer_types (old transformers read the pattern, new ones layer_types).
      for (const char* key : {"sliding_window_pattern", "_sliding_window_pattern"}) {
        if (!r.has(key)) continue;
        pattern = r.integer(key, 1, kMaxLayers);
        for (int l = 0; l < static_cast<int>(types.size()); ++l)
          PAGODA_REQUIRE((types[l] == "sliding_attention") == ((l + 1) % pattern != 0),
                         kUnsupported, "config.json: layer_types[{}] = {} disagrees with {} {}", l,
                         types[l], key, pattern);
      }
      PAGODA_REQUIRE(!(r.has("sliding_window_pattern") && r.has("_sliding_window_pattern")) ||
                         r.integer("sliding_window_pattern", 1, kMaxLayers) ==
                             r.integer("_sliding_window_pattern", 1, kMaxLayers),
                     kUnsupported,
                     "config.json: sliding_window_pattern and _sliding_window_pattern disagree");
      break;
    case ModelFamily::kDeepseekV2:
    case ModelFamily::kDeepseekV3:
    case ModelFamily::kDeepseekV32:
    case ModelFamily::kBamba:
      return {};  // parsed by config_deepseek.cpp / config_bamba.cpp, never here
  }
  if (!enabled || window < 0) return {};
  std::vector<int> w(num_layers, -1);
  for (int l = 0; l < num_layers; ++l) {
    const bool by_rule = pattern > 0 ? (l + 1) % pattern != 0 : l >= first_sliding;
    const bool sliding = types.empty() ? by_rule : types[l] == "sliding_attention";
    if (sliding) w[l] = static_cast<int>(window - 1);
  }
  return w;
}

/// The Gemma-only fields: GeGLU, (1 + w) norms, sqrt(hidden) embedding scale, sandwich norms,
/// query_pre_attn_scalar (default 256), Gemma 3's q/k norms; bidirectional attention is refused.
void parse_gemma(const Reader& r, ModelConfig& c) {
  const std::string act = r.string_or("hidden_activation", "gelu_pytorch_tanh");
  PAGODA_REQUIRE(act == "gelu_pytorch_tanh", kUnsupported,
                 "config.json: hidden_activation '{}' is not supported (only gelu_pytorch_tanh)",
                 act);
  // transformers' Gemma reads hidden_activation only; a different hidden_act is ambiguous.
  PAGODA_REQUIRE(!r.has("hidden_act") || r.string_or("hidden_act", "") == act, kUnsupported,
                 "config.json: hidden_act '{}' differs from hidden_activation '{}' (not supported)",
                 r.string_or("hidden_act", ""), act);
  PAGODA_REQUIRE(!r.boolean_or("use_bidirectional_attention", false), kUnsupported,
                 "config.json: use_bidirectional_attention true is not supported (causal only)");
  c.activation = Activation::kGeluTanh;
  c.norm_weight_offset = true;
  c.embed_scale = static_cast<float>(std::sqrt(static_cast<double>(c.hidden_size)));
  c.sandwich_norms = true;
  c.qk_norm = c.family == ModelFamily::kGemma3;
  c.query_pre_attn_scalar = r.number_or("query_pre_attn_scalar", 256.0, 1e-6, 1e9);
}

ModelConfig parse_config(const json& j) {
  PAGODA_REQUIRE(j.is_object(), kInvalidArgument, "config.json must be a JSON object (got {})",
                 show(j));
  const ModelFamily family = parse_family(Reader(j, ""));
  if (is_deepseek_family(family)) return parse_deepseek_config(j, family);
  if (family == ModelFamily::kBamba) return parse_bamba_config(j);
  for (const auto& [k, v] : j.items())
    PAGODA_REQUIRE(listed(kUnderstoodKeys, k) || listed(kHarmlessKeys, k), kUnsupported,
                   "config.json: key '{}' is not supported (pagoda does not implement what it "
                   "would change)",
                   k);
  const Reader r(j, "");
  ModelConfig c;
  c.family = parse_family(r);
  check_model_type(r, c.family);
  check_family_keys(r, c.family);
  const bool gemma = is_gemma_family(c.family);
  c.vocab_size = static_cast<int>(r.integer("vocab_size", 1, kMaxVocabSize));
  c.hidden_size = static_cast<int>(r.integer("hidden_size", 1, kMaxModelDim));
  c.intermediate_size = static_cast<int>(r.integer("intermediate_size", 1, kMaxModelDim));
  c.num_layers = static_cast<int>(r.integer("num_hidden_layers", 1, kMaxLayers));
  c.num_q_heads = static_cast<int>(r.integer("num_attention_heads", 1, kMaxHeads));
  c.num_kv_heads = static_cast<int>(
      r.integer_or("num_key_value_heads", gemma ? 4 : c.num_q_heads, 1, kMaxHeads));
  PAGODA_REQUIRE(c.num_q_heads % c.num_kv_heads == 0, kInvalidArgument,
                 "config.json: num_key_value_heads {} does not divide num_attention_heads {}",
                 c.num_kv_heads, c.num_q_heads);
  const bool even_split = c.hidden_size % c.num_q_heads == 0;
  if (r.has("head_dim")) {
    c.head_dim = static_cast<int>(r.integer("head_dim", 1, kMaxHeadDim));
    PAGODA_REQUIRE(c.family != ModelFamily::kQwen2 ||
                       (even_split && c.head_dim == c.hidden_size / c.num_q_heads),
                   kUnsupported,
                   "config.json: head_dim {} != hidden_size {} / num_attention_heads {} is not "
                   "supported for Qwen2ForCausalLM",
                   c.head_dim, c.hidden_size, c.num_q_heads);
  } else if (gemma) {
    c.head_dim = 256;  // transformers' Gemma default, whatever hidden_size / heads is
  } else {
    PAGODA_REQUIRE(even_split, kInvalidArgument,
                   "config.json: hidden_size {} is not a multiple of num_attention_heads {} and "
                   "head_dim is not given",
                   c.hidden_size, c.num_q_heads);
    c.head_dim = c.hidden_size / c.num_q_heads;
  }
  c.rms_norm_eps = static_cast<float>(r.number_or("rms_norm_eps", 1e-6, 1e-30, 0.5));
  c.rope = parse_rope(r, c.family, &c.local_rope);
  int64_t default_max_pos = 32768;
  switch (c.family) {
    case ModelFamily::kLlama:
      default_max_pos = 2048;
      break;
    case ModelFamily::kMistral:
      default_max_pos = 4096 * 32;
      break;
    case ModelFamily::kQwen2:
      break;
    case ModelFamily::kGemma2:
      default_max_pos = 8192;
      break;
    case ModelFamily::kGemma3:
      default_max_pos = 131072;
      break;
    case ModelFamily::kDeepseekV2:
    case ModelFamily::kDeepseekV3:
    case ModelFamily::kDeepseekV32:
    case ModelFamily::kBamba:
      break;  // parsed by config_deepseek.cpp / config_bamba.cpp, never here
  }
  c.max_position_embeddings =
      static_cast<int>(r.integer_or("max_position_embeddings", default_max_pos, 1, kMaxPositions));
  c.tie_word_embeddings = r.boolean_or("tie_word_embeddings", gemma);
  // Gemma 2's defaults are 50 / 30 (null: none); other families default to none.
  const bool g2 = c.family == ModelFamily::kGemma2;
  c.attn_logit_softcap =
      static_cast<float>(r.explicitly_null("attn_logit_softcapping")
                             ? 0.0
                             : r.number_or("attn_logit_softcapping", g2 ? 50.0 : 0.0, 0.0, 1e6));
  c.final_logit_softcap =
      static_cast<float>(r.explicitly_null("final_logit_softcapping")
                             ? 0.0
                             : r.number_or("final_logit_softcapping", g2 ? 30.0 : 0.0, 0.0, 1e6));
  c.bos_token_id = parse_token_id(r, "bos_token_id", c.vocab_size);
  c.eos_token_id = parse_token_id(r, "eos_token_id", c.vocab_size);
  c.weights_dtype = parse_weights_dtype(r);

  if (gemma) {
    parse_gemma(r, c);
  } else {
    const std::string act = r.string_or("hidden_act", "silu");
    PAGODA_REQUIRE(act == "silu", kUnsupported,
                   "config.json: hidden_act '{}' is not supported "
                   "(only silu)",
                   act);
  }
  PAGODA_REQUIRE(!r.boolean_or("mlp_bias", false), kUnsupported,
                 "config.json: mlp_bias true is not supported");
  PAGODA_REQUIRE(r.integer_or("pretraining_tp", 1, INT64_MIN, INT64_MAX) == 1, kUnsupported,
                 "config.json: pretraining_tp {} is not supported (only 1)",
                 r.integer_or("pretraining_tp", 1, INT64_MIN, INT64_MAX));
  PAGODA_REQUIRE(!r.boolean_or("use_mrope", false), kUnsupported,
                 "config.json: use_mrope true (multimodal rope) is not supported");
  const bool attention_bias = r.boolean_or("attention_bias", c.family == ModelFamily::kQwen2);
  switch (c.family) {
    case ModelFamily::kLlama:
      c.qkv_bias = attention_bias;
      break;
    case ModelFamily::kMistral:
      PAGODA_REQUIRE(!attention_bias, kUnsupported,
                     "config.json: attention_bias true on MistralForCausalLM is not supported "
                     "(transformers' Mistral has no q/k/v bias)");
      break;
    case ModelFamily::kQwen2:
      PAGODA_REQUIRE(attention_bias, kUnsupported,
                     "config.json: attention_bias false on Qwen2ForCausalLM is not supported "
                     "(Qwen2 always has q/k/v biases)");
      c.qkv_bias = true;
      break;
    case ModelFamily::kGemma2:
    case ModelFamily::kGemma3:
      PAGODA_REQUIRE(!attention_bias, kUnsupported,
                     "config.json: attention_bias true on {} is not supported (q/k/v biases "
                     "before Gemma's q/k norms are not implemented)",
                     hf_architecture_name(c.family));
      break;
    case ModelFamily::kDeepseekV2:
    case ModelFamily::kDeepseekV3:
    case ModelFamily::kDeepseekV32:
    case ModelFamily::kBamba:
      break;  // parsed by config_deepseek.cpp / config_bamba.cpp, never here
  }
  c.layer_window = parse_windows(r, c.family, c.num_layers);
  c.validate();
  return c;
}

}  // namespace

ModelConfig config_from_hf_json(const nlohmann::json& j) {
  try {
    return parse_config(j);
  } catch (const nlohmann::json::exception& e) {
    throw_error(ErrorCode::kInvalidArgument, "config.json: {}", e.what());
  }
}

nlohmann::json parse_config_json(std::string_view text) {
  static constexpr std::string_view kInf = "Infinity";
  std::string out;
  out.reserve(text.size());
  bool in_string = false, escaped = false;
  auto word_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    if (text.substr(i, kInf.size()) == kInf && (i == 0 || !word_char(text[i - 1])) &&
        (i + kInf.size() == text.size() || !word_char(text[i + kInf.size()]))) {
      out += "1.7976931348623157e308";  // DBL_MAX
      i += kInf.size() - 1;
      continue;
    }
    out += c;
  }
  return nlohmann::json::parse(out);
}

}  // namespace pagoda::model
