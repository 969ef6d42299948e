#include "pagoda/model/eagle_head.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/model/safetensors.h"
#include "pagoda/model/splitmix.h"

namespace pagoda::model {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

/// SGLang's default EAGLE-3 capture layers for an L-layer target (1, L/2 − 1, L − 4), clamped
/// into [0, L − 1] so tiny test targets get valid (possibly repeated) layers.
std::vector<int> default_aux_layers(int num_layers) {
  std::vector<int> out;
  for (int l : {1, num_layers / 2 - 1, num_layers - 4}) out.push_back(std::clamp(l, 0, num_layers - 1));
  return out;
}

void require_size(size_t got, int64_t expected, const char* name) {
  PAGODA_REQUIRE(static_cast<int64_t>(got) == expected, kInvalidArgument,
                 "eagle head tensor {} has {} elements, expected {}", name, got, expected);
}

std::vector<float> concat(std::initializer_list<const std::vector<float>*> parts) {
  std::vector<float> out;
  for (const auto* p : parts) out.insert(out.end(), p->begin(), p->end());
  return out;
}

}  // namespace

EagleConfig eagle_config_from_json(const json& j) {
  PAGODA_REQUIRE(j.is_object(), kInvalidArgument, "eagle config.json must be a JSON object");
  EagleConfig c;
  json base = json::object();  // the Llama keys, parsed strictly by config_from_hf_json
  for (const auto& [k, v] : j.items()) {
    if (k == "architectures" || k == "draft_vocab_size" || k == "target_hidden_size" ||
        k == "eagle_config")
      continue;
    base[k] = v;
  }
  if (j.contains("architectures")) {
    const json& a = j.at("architectures");
    PAGODA_REQUIRE(a.is_array() && a.size() == 1 && a[0].is_string(), kInvalidArgument,
                   "eagle config.json: architectures must be a list of one name");
    const std::string arch = a[0].get<std::string>();
    if (arch == "LlamaForCausalLMEagle3") {
      c.layout = EagleLayout::kEagle3;
    } else if (arch == "LlamaForCausalLMEagle" || arch == "LlamaForCausalLM") {
      c.layout = EagleLayout::kEagle1;
    } else {
      throw_error(ErrorCode::kUnsupported,
                  "eagle config.json: architectures '{}' is not supported (LlamaForCausalLMEagle, "
                  "LlamaForCausalLMEagle3, LlamaForCausalLM)",
                  arch);
    }
  } else {
    PAGODA_REQUIRE(base.contains("model_type"), kInvalidArgument,
                   "eagle config.json has neither architectures nor model_type");
    c.layout = EagleLayout::kEagle1;
  }
  base["architectures"] = json::array({"LlamaForCausalLM"});
  if (!base.contains("model_type")) base["model_type"] = "llama";
  const ModelConfig m = config_from_hf_json(base);
  PAGODA_REQUIRE(m.num_layers == 1, kUnsupported,
                 "eagle config.json: num_hidden_layers {} is not supported (an EAGLE head has 1)",
                 m.num_layers);
  PAGODA_REQUIRE(!m.qkv_bias, kUnsupported, "eagle config.json: attention_bias true is not supported");
  PAGODA_REQUIRE(!m.has_sliding_window() && m.attn_logit_softcap == 0.f &&
                     m.final_logit_softcap == 0.f,
                 kUnsupported, "eagle config.json: sliding windows / soft caps are not supported");
  c.hidden_size = m.hidden_size;
  c.intermediate_size = m.intermediate_size;
  c.num_q_heads = m.num_q_heads;
  c.num_kv_heads = m.num_kv_heads;
  c.head_dim = m.head_dim;
  c.rms_norm_eps = m.rms_norm_eps;
  c.rope = m.rope;
  c.vocab_size = m.vocab_size;
  c.draft_vocab_size = m.vocab_size;
  if (j.contains("draft_vocab_size")) {
    const json& v = j.at("draft_vocab_size");
    PAGODA_REQUIRE(v.is_number_integer() && v.get<int64_t>() >= 1 &&
                       v.get<int64_t>() <= m.vocab_size,
                   kInvalidArgument, "eagle config.json: draft_vocab_size must be an integer in "
                   "[1, vocab_size {}]", m.vocab_size);
    c.draft_vocab_size = v.get<int>();
  }
  PAGODA_REQUIRE(c.layout == EagleLayout::kEagle3 || c.draft_vocab_size == c.vocab_size,
                 kUnsupported, "eagle config.json: draft_vocab_size needs an EAGLE-3 head");
  if (j.contains("target_hidden_size")) {
    const json& v = j.at("target_hidden_size");
    PAGODA_REQUIRE(v.is_number_integer() && v.get<int64_t>() == c.hidden_size, kUnsupported,
                   "eagle config.json: target_hidden_size {} != hidden_size {} is not supported",
                   v.dump(), c.hidden_size);
  }
  if (j.contains("eagle_config") && !j.at("eagle_config").is_null()) {
    const json& e = j.at("eagle_config");
    PAGODA_REQUIRE(e.is_object(), kInvalidArgument, "eagle config.json: eagle_config must be an object");
    for (const auto& [k, v] : e.items()) {
      if (k == "eagle_aux_hidden_state_layer_ids") {
        PAGODA_REQUIRE(v.is_array() && v.size() == 3, kInvalidArgument,
                       "eagle config.json: eagle_config.eagle_aux_hidden_state_layer_ids must be a "
                       "list of 3 layer ids");
        for (const json& x : v) {
          PAGODA_REQUIRE(x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() < kMaxLayers,
                         kInvalidArgument,
                         "eagle config.json: eagle_config.eagle_aux_hidden_state_layer_ids has a "
                         "bad layer id {}", x.dump());
          c.aux_layers.push_back(x.get<int>());
        }
      } else if (k != "use_aux_hidden_state" && k != "use_input_layernorm_in_first_layer") {
        throw_error(ErrorCode::kUnsupported,
                    "eagle config.json: key 'eagle_config.{}' is not supported", k);
      } else {
        PAGODA_REQUIRE(v.is_boolean() && v.get<bool>() == (k == "use_aux_hidden_state"
                                                               ? c.layout == EagleLayout::kEagle3
                                                               : true),
                       kUnsupported, "eagle config.json: eagle_config.{} = {} is not supported",
                       k, v.dump());
      }
    }
  }
  return c;
}

EagleHead::EagleHead(EagleConfig config, EagleWeights weights, const LlamaModel& target)
    : config_(std::move(config)),
      w_(std::move(weights)),
      target_(&target),
      rope_(config_.rope, config_.head_dim) {
  const EagleConfig& c = config_;
  const ModelConfig& t = target.config();
  PAGODA_REQUIRE(!is_gemma_family(t.family), kUnsupported,
                 "EAGLE heads for a {} target are not supported (scaled embeddings, soft caps)",
                 hf_architecture_name(t.family));
  PAGODA_REQUIRE(!t.is_mla(), kUnsupported, "EAGLE heads for a {} (MLA) target are not supported",
                 hf_architecture_name(t.family));
  PAGODA_REQUIRE(c.hidden_size == t.hidden_size, kInvalidArgument,
                 "eagle head hidden_size {} differs from the target's {}", c.hidden_size,
                 t.hidden_size);
  PAGODA_REQUIRE(c.vocab_size == t.vocab_size, kInvalidArgument,
                 "eagle head vocab_size {} differs from the target's {}", c.vocab_size,
                 t.vocab_size);
  PAGODA_REQUIRE(c.num_q_heads >= 1 && c.num_kv_heads >= 1 && c.head_dim >= 1 &&
                     c.num_q_heads % c.num_kv_heads == 0 && c.intermediate_size >= 1 &&
                     c.draft_vocab_size >= 1 && c.draft_vocab_size <= c.vocab_size,
                 kInvalidArgument, "eagle head config has bad head / size fields");
  const int64_t h = c.hidden_size, qd = int64_t{c.num_q_heads} * c.head_dim,
                kvd = int64_t{c.num_kv_heads} * c.head_dim, inter = c.intermediate_size;
  if (c.layout == EagleLayout::kEagle1) {
    feature_layers_ = {t.num_layers - 1};
  } else {
    const std::vector<int> aux = c.aux_layers.empty() ? default_aux_layers(t.num_layers) : c.aux_layers;
    for (int l : aux) {
      PAGODA_REQUIRE(l >= 0 && l < t.num_layers, kInvalidArgument,
                     "eagle aux hidden-state layer {} outside the target's {} layers", l,
                     t.num_layers);
      feature_layers_.push_back(l);
    }
  }
  // A target that keeps its embedding / LM head in bf16 (LoadOptions::keep_bf16) has no f32
  // copy of them: the head widens its own (its runner gathers and uploads f32).
  if (w_.embed.empty() && target.embed_weights().empty())
    w_.embed = widened_bf16(target.embed_bf16());
  if (w_.lm_head.empty() && target.lm_head_weights().empty() && c.draft_vocab_size == c.vocab_size)
    w_.lm_head = widened_bf16(target.lm_head_bf16());
  const bool e3 = c.layout == EagleLayout::kEagle3;
  require_size(w_.fc.size(), h * (e3 ? 3 * h : 2 * h), "fc.weight");
  require_size(w_.fc_bias.size(), c.fc_bias ? h : 0, "fc.bias");
  require_size(w_.input_norm.size(), e3 ? h : 0, "input_layernorm.weight");
  require_size(w_.hidden_norm.size(), e3 ? h : 0, "hidden_norm.weight");
  const int64_t in = attn_in_dim();
  require_size(w_.q_proj.size(), qd * in, "self_attn.q_proj.weight");
  require_size(w_.k_proj.size(), kvd * in, "self_attn.k_proj.weight");
  require_size(w_.v_proj.size(), kvd * in, "self_attn.v_proj.weight");
  require_size(w_.o_proj.size(), h * qd, "self_attn.o_proj.weight");
  require_size(w_.post_norm.size(), h, "post_attention_layernorm.weight");
  require_size(w_.gate_proj.size(), inter * h, "mlp.gate_proj.weight");
  require_size(w_.up_proj.size(), inter * h, "mlp.up_proj.weight");
  require_size(w_.down_proj.size(), h * inter, "mlp.down_proj.weight");
  require_size(w_.norm.size(), e3 ? h : 0, "norm.weight");
  if (!w_.embed.empty()) require_size(w_.embed.size(), int64_t{c.vocab_size} * h, "embed_tokens.weight");
  PAGODA_REQUIRE(!w_.lm_head.empty() || c.draft_vocab_size == c.vocab_size, kInvalidArgument,
                 "eagle head with draft_vocab_size {} has no lm_head.weight", c.draft_vocab_size);
  if (!w_.lm_head.empty())
    require_size(w_.lm_head.size(), int64_t{c.draft_vocab_size} * h, "lm_head.weight");
  PAGODA_REQUIRE(!w_.d2t.empty() || c.draft_vocab_size == c.vocab_size, kInvalidArgument,
                 "eagle head with draft_vocab_size {} has no d2t", c.draft_vocab_size);
  if (!w_.d2t.empty()) {
    require_size(w_.d2t.size(), c.draft_vocab_size, "d2t");
    for (size_t d = 0; d < w_.d2t.size(); ++d) {
      const int64_t id = static_cast<int64_t>(d) + w_.d2t[d];
      PAGODA_REQUIRE(id >= 0 && id < c.vocab_size, kInvalidArgument,
                     "eagle head d2t[{}] = {} maps to target id {} outside [0, {})", d, w_.d2t[d],
                     id, c.vocab_size);
    }
    d2t_ = w_.d2t;
  }
  // Packed forms (EagleRunner uploads these).
  if (c.fc_bias) {  // [H, 2H + 1]: the bias is the last column (the runner feeds a 1 there)
    const int64_t k = 2 * h;
    fc_packed_.reserve(static_cast<size_t>(h * (k + 1)));
    for (int64_t r = 0; r < h; ++r) {
      fc_packed_.insert(fc_packed_.end(), w_.fc.begin() + r * k, w_.fc.begin() + (r + 1) * k);
      fc_packed_.push_back(w_.fc_bias[static_cast<size_t>(r)]);
    }
  } else {
    fc_packed_ = w_.fc;
  }
  qkv_ = concat({&w_.q_proj, &w_.k_proj, &w_.v_proj});
  gate_up_ = concat({&w_.gate_proj, &w_.up_proj});
}

int64_t EagleHead::feature_dim() const {
  return static_cast<int64_t>(feature_layers_.size()) * config_.hidden_size;
}
int64_t EagleHead::attn_in_dim() const {
  return config_.layout == EagleLayout::kEagle3 ? 2 * int64_t{config_.hidden_size}
                                                : config_.hidden_size;
}
int64_t EagleHead::fc_in_dim() const {
  const int64_t h = config_.hidden_size;
  return config_.layout == EagleLayout::kEagle3 ? 3 * h : 2 * h + (config_.fc_bias ? 1 : 0);
}
const std::vector<float>& EagleHead::embed() const {
  return w_.embed.empty() ? target_->embed_weights() : w_.embed;
}
const std::vector<float>& EagleHead::lm_head() const {
  return w_.lm_head.empty() ? target_->lm_head_weights() : w_.lm_head;
}

std::unique_ptr<EagleHead> load_eagle_head(const fs::path& dir, const LlamaModel& target) {
  PAGODA_REQUIRE(fs::is_directory(dir), kInvalidArgument, "{} is not a directory", dir.string());
  const fs::path cp = dir / "config.json";
  PAGODA_REQUIRE(fs::exists(cp), kInvalidArgument, "{} has no config.json", dir.string());
  json j;
  try {
    std::ifstream in(cp);
    j = parse_config_json(std::string(std::istreambuf_iterator<char>(in), {}));
  } catch (const json::exception& e) {
    throw_error(ErrorCode::kInvalidArgument, "{}: {}", cp.string(), e.what());
  }
  EagleConfig c = eagle_config_from_json(j);
  // Against the target first, so a mismatch names the field rather than a tensor shape.
  PAGODA_REQUIRE(c.hidden_size == target.config().hidden_size, kInvalidArgument,
                 "eagle config.json: hidden_size {} differs from the target's {}", c.hidden_size,
                 target.config().hidden_size);
  PAGODA_REQUIRE(c.vocab_size == target.config().vocab_size, kInvalidArgument,
                 "eagle config.json: vocab_size {} differs from the target's {}", c.vocab_size,
                 target.config().vocab_size);
  std::vector<SafetensorsFile> files;
  std::map<std::string, std::pair<size_t, std::string>> where;  // plain name → (file, stored name)
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    files.emplace_back(e.path());
    for (const auto& [name, info] : files.back().tensors()) {
      const std::string plain = name.rfind("model.", 0) == 0 ? name.substr(6) : name;
      PAGODA_REQUIRE(where.emplace(plain, std::make_pair(files.size() - 1, name)).second,
                     kInvalidArgument, "eagle head tensor {} appears twice", plain);
    }
  }
  PAGODA_REQUIRE(!files.empty(), kInvalidArgument, "{}: no *.safetensors files", dir.string());
  std::set<std::string> used;
  auto shape_of = [&](const std::string& n) -> const SafetensorInfo& {
    const auto& [fi, stored] = where.at(n);
    return files[fi].tensors().at(stored);
  };
  auto check_shape = [&](const std::string& n, const std::vector<int64_t>& shape) {
    PAGODA_REQUIRE(where.count(n) != 0, kInvalidArgument, "eagle head checkpoint has no tensor {}", n);
    PAGODA_REQUIRE(shape_of(n).shape == shape, kInvalidArgument,
                   "eagle head tensor {} has shape [{}], expected [{}]", n,
                   fmt::join(shape_of(n).shape, ", "), fmt::join(shape, ", "));
    used.insert(n);
  };
  auto read = [&](const std::string& n, const std::vector<int64_t>& shape) {
    check_shape(n, shape);
    const auto& [fi, stored] = where.at(n);
    return files[fi].read_f32(stored);
  };
  const bool e3 = c.layout == EagleLayout::kEagle3;
  const int64_t h = c.hidden_size, qd = int64_t{c.num_q_heads} * c.head_dim,
                kvd = int64_t{c.num_kv_heads} * c.head_dim, inter = c.intermediate_size;
  const int64_t in = e3 ? 2 * h : h;
  const std::string p = e3 ? "midlayer." : "layers.0.";
  EagleWeights w;
  w.fc = read("fc.weight", {h, e3 ? 3 * h : 2 * h});
  if (!e3 && where.count("fc.bias") != 0) {
    c.fc_bias = true;
    w.fc_bias = read("fc.bias", {h});
  }
  if (e3) {
    w.input_norm = read(p + "input_layernorm.weight", {h});
    w.hidden_norm = read(p + "hidden_norm.weight", {h});
    w.norm = read("norm.weight", {h});
  }
  w.q_proj = read(p + "self_attn.q_proj.weight", {qd, in});
  w.k_proj = read(p + "self_attn.k_proj.weight", {kvd, in});
  w.v_proj = read(p + "self_attn.v_proj.weight", {kvd, in});
  w.o_proj = read(p + "self_attn.o_proj.weight", {h, qd});
  w.post_norm = read(p + "post_attention_layernorm.weight", {h});
  w.gate_proj = read(p + "mlp.gate_proj.weight", {inter, h});
  w.up_proj = read(p + "mlp.up_proj.weight", {inter, h});
  w.down_proj = read(p + "mlp.down_proj.weight", {h, inter});
  if (where.count("embed_tokens.weight") != 0)
    w.embed = read("embed_tokens.weight", {c.vocab_size, h});
  if (where.count("lm_head.weight") != 0)
    w.lm_head = read("lm_head.weight", {c.draft_vocab_size, h});
  if (where.count("d2t") != 0) {
    check_shape("d2t", {c.draft_vocab_size});
    const auto& [fi, stored] = where.at("d2t");
    w.d2t = files[fi].read_i64(stored);
  }
  if (where.count("t2d") != 0) {  // the inverse map: checked for shape and consistency only
    check_shape("t2d", {c.vocab_size});
    const auto& [fi, stored] = where.at("t2d");
    const std::vector<int64_t> t2d = files[fi].read_i64(stored);
    int64_t ones = 0;
    for (int64_t x : t2d) ones += x != 0;
    PAGODA_REQUIRE(ones == c.draft_vocab_size, kInvalidArgument,
                   "eagle head t2d marks {} target ids, draft_vocab_size is {}", ones,
                   c.draft_vocab_size);
  }
  for (const auto& [plain, loc] : where)
    PAGODA_REQUIRE(used.count(plain) != 0, kInvalidArgument,
                   "eagle head tensor {} is not part of the {} layout (not implemented)",
                   loc.second, e3 ? "EAGLE-3" : "EAGLE-1");
  return std::make_unique<EagleHead>(std::move(c), std::move(w), target);
}

EagleConfig eagle_config_for(const ModelConfig& t, EagleLayout layout, int draft_vocab) {
  EagleConfig c;
  c.layout = layout;
  c.hidden_size = t.hidden_size;
  c.intermediate_size = t.intermediate_size;
  c.num_q_heads = t.num_q_heads;
  c.num_kv_heads = t.num_kv_heads;
  c.head_dim = t.head_dim;
  c.rms_norm_eps = t.rms_norm_eps;
  c.rope = t.rope;
  c.vocab_size = t.vocab_size;
  c.draft_vocab_size = draft_vocab > 0 ? draft_vocab : t.vocab_size;
  c.fc_bias = layout == EagleLayout::kEagle1;
  return c;
}

EagleWeights make_random_eagle_weights(const EagleConfig& c, const ModelConfig& t, uint64_t seed) {
  SplitMix64 rng(seed ^ 0xEA61EEA61EEA61Eull);  // as make_random_weights; a separate stream
  const bool e3 = c.layout == EagleLayout::kEagle3;
  const int64_t h = c.hidden_size, qd = int64_t{c.num_q_heads} * c.head_dim,
                kvd = int64_t{c.num_kv_heads} * c.head_dim, inter = c.intermediate_size;
  const int64_t in = e3 ? 2 * h : h, fc_in = e3 ? 3 * h : 2 * h;
  auto lin = [&](int64_t out, int64_t k) { return rng.normals(out * k, 0.0, 1.0 / std::sqrt(double(k))); };
  EagleWeights w;
  w.fc = lin(h, fc_in);
  if (c.fc_bias) w.fc_bias = rng.normals(h, 0.0, 0.1);
  if (e3) {
    w.input_norm = rng.normals(h, 1.0, 0.1);
    w.hidden_norm = rng.normals(h, 1.0, 0.1);
  }
  w.q_proj = lin(qd, in);
  w.k_proj = lin(kvd, in);
  w.v_proj = lin(kvd, in);
  w.o_proj = lin(h, qd);
  w.post_norm = rng.normals(h, 1.0, 0.1);
  w.gate_proj = lin(inter, h);
  w.up_proj = lin(inter, h);
  w.down_proj = lin(h, inter);
  if (e3) {
    w.norm = rng.normals(h, 1.0, 0.1);
    w.lm_head = lin(c.draft_vocab_size, h);
    // d2t: draft id d → a distinct target id (a seeded sorted sample, as real maps are sorted).
    std::vector<int64_t> ids(static_cast<size_t>(t.vocab_size));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
    for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[rng.next() % i]);
    ids.resize(static_cast<size_t>(c.draft_vocab_size));
    std::sort(ids.begin(), ids.end());
    for (size_t d = 0; d < ids.size(); ++d) w.d2t.push_back(ids[d] - static_cast<int64_t>(d));
  }
  return w;
}

void save_eagle_head(const fs::path& dir, const EagleConfig& c, const EagleWeights& w) {
  fs::create_directories(dir);
  const bool e3 = c.layout == EagleLayout::kEagle3;
  json j = {{"architectures", {e3 ? "LlamaForCausalLMEagle3" : "LlamaForCausalLMEagle"}},
            {"model_type", "llama"},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.intermediate_size},
            {"num_hidden_layers", 1},
            {"num_attention_heads", c.num_q_heads},
            {"num_key_value_heads", c.num_kv_heads},
            {"head_dim", c.head_dim},
            {"rms_norm_eps", c.rms_norm_eps},
            {"rope_theta", c.rope.theta},
            {"vocab_size", c.vocab_size},
            {"hidden_act", "silu"},
            {"torch_dtype", "float32"}};
  PAGODA_REQUIRE(c.rope.scaling == RopeScalingKind::kNone, kUnsupported,
                 "save_eagle_head writes unscaled rope only");
  if (e3) j["draft_vocab_size"] = c.draft_vocab_size;
  if (!c.aux_layers.empty()) j["eagle_config"] = {{"eagle_aux_hidden_state_layer_ids", c.aux_layers}};
  std::ofstream(dir / "config.json") << j.dump(2);
  const int64_t h = c.hidden_size, qd = int64_t{c.num_q_heads} * c.head_dim,
                kvd = int64_t{c.num_kv_heads} * c.head_dim, inter = c.intermediate_size;
  const int64_t in = e3 ? 2 * h : h;
  const std::string p = e3 ? "midlayer." : "layers.0.";
  std::vector<SafetensorToWrite> t;
  auto add = [&](std::string n, std::vector<int64_t> shape, const std::vector<float>& v) {
    if (!v.empty()) t.push_back(SafetensorToWrite{std::move(n), std::move(shape), v.data(), DType::kF32});
  };
  add("fc.weight", {h, e3 ? 3 * h : 2 * h}, w.fc);
  add("fc.bias", {h}, w.fc_bias);
  add(p + "input_layernorm.weight", {h}, w.input_norm);
  add(p + "hidden_norm.weight", {h}, w.hidden_norm);
  add(p + "self_attn.q_proj.weight", {qd, in}, w.q_proj);
  add(p + "self_attn.k_proj.weight", {kvd, in}, w.k_proj);
  add(p + "self_attn.v_proj.weight", {kvd, in}, w.v_proj);
  add(p + "self_attn.o_proj.weight", {h, qd}, w.o_proj);
  add(p + "post_attention_layernorm.weight", {h}, w.post_norm);
  add(p + "mlp.gate_proj.weight", {inter, h}, w.gate_proj);
  add(p + "mlp.up_proj.weight", {inter, h}, w.up_proj);
  add(p + "mlp.down_proj.weight", {h, inter}, w.down_proj);
  add("norm.weight", {h}, w.norm);
  add("embed_tokens.weight", {c.vocab_size, h}, w.embed);
  add("lm_head.weight", {c.draft_vocab_size, h}, w.lm_head);
  std::vector<float> d2t(w.d2t.begin(), w.d2t.end()), t2d;
  if (!w.d2t.empty()) {
    t.push_back(SafetensorToWrite{"d2t", {c.draft_vocab_size}, d2t.data(), DType::kI64});
    t2d.assign(static_cast<size_t>(c.vocab_size), 0.f);
    for (size_t d = 0; d < w.d2t.size(); ++d) t2d[static_cast<size_t>(int64_t(d) + w.d2t[d])] = 1.f;
    t.push_back(SafetensorToWrite{"t2d", {c.vocab_size}, t2d.data(), DType::kU8});
  }
  write_safetensors(dir / "model.safetensors", t);
}

}  // namespace pagoda::model
