#include "pagoda/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>

#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"

namespace pagoda::model {

namespace fs = std::filesystem;

namespace {

std::optional<DType> dtype_from_st(const std::string& s) {
  if (s == "F32") return DType::kF32;
  if (s == "F16") return DType::kF16;
  if (s == "BF16") return DType::kBF16;
  return std::nullopt;
}

const char* st_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    default: return nullptr;
  }
}

}  // namespace

int64_t SafetensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::SafetensorsFile(const fs::path& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  PAGODA_REQUIRE(fd >= 0, kInternal, "cannot open {}: {}", path.string(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < 8) {
    ::close(fd);
    throw_error(ErrorCode::kInvalidArgument, "{}: not a safetensors file (too small)",
                path.string());
  }
  map_size_ = static_cast<size_t>(st.st_size);
  void* m = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  PAGODA_REQUIRE(m != MAP_FAILED, kInternal, "mmap {} failed: {}", path.string(),
                 std::strerror(errno));
  map_ = static_cast<const uint8_t*>(m);
  try {
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | map_[i];
    PAGODA_REQUIRE(header_len <= map_size_ - 8, kInvalidArgument,
                   "{}: header length {} exceeds the file", path.string(), header_len);
    data_offset_ = 8 + static_cast<size_t>(header_len);
    const size_t data_size = map_size_ - data_offset_;
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(map_ + 8, map_ + data_offset_);
    } catch (const nlohmann::json::exception& e) {
      throw_error(ErrorCode::kInvalidArgument, "{}: bad header JSON: {}", path.string(),
                  e.what());
    }
    PAGODA_REQUIRE(header.is_object(), kInvalidArgument, "{}: header is not an object",
                   path.string());
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") continue;
      try {
        SafetensorInfo info;
        const std::string dt = entry.at("dtype").get<std::string>();
        const auto dtype = dtype_from_st(dt);
        PAGODA_REQUIRE(dtype.has_value(), kUnsupported,
                       "{}: tensor {} has dtype {} (supported: F32, F16, BF16)", path.string(),
                       name, dt);
        info.dtype = *dtype;
        info.shape = entry.at("shape").get<std::vector<int64_t>>();
        const auto offs = entry.at("data_offsets").get<std::vector<uint64_t>>();
        PAGODA_REQUIRE(offs.size() == 2 && offs[0] <= offs[1] && offs[1] <= data_size,
                       kInvalidArgument, "{}: tensor {} has bad data_offsets", path.string(),
                       name);
        info.begin = offs[0];
        info.end = offs[1];
        for (int64_t d : info.shape)
          PAGODA_REQUIRE(d >= 0, kInvalidArgument, "{}: tensor {} has a negative dim",
                         path.string(), name);
        PAGODA_REQUIRE(static_cast<uint64_t>(info.numel()) * dtype_size(info.dtype) ==
                           info.end - info.begin,
                       kInvalidArgument, "{}: tensor {} size does not match its shape",
                       path.string(), name);
        tensors_.emplace(name, std::move(info));
      } catch (const nlohmann::json::exception& e) {
        throw_error(ErrorCode::kInvalidArgument, "{}: tensor {}: {}", path.string(), name,
                    e.what());
      }
    }
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(map_), map_size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), map_size_);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      tensors_(std::move(o.tensors_)),
      map_(o.map_),
      map_size_(o.map_size_),
      data_offset_(o.data_offset_) {
  o.map_ = nullptr;
  o.map_size_ = 0;
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
  auto it = tensors_.find(name);
  PAGODA_REQUIRE(it != tensors_.end(), kInvalidArgument, "{}: no tensor named {}",
                 path_.string(), name);
  const SafetensorInfo& info = it->second;
  const uint8_t* src = map_ + data_offset_ + info.begin;
  std::vector<float> out(static_cast<size_t>(info.numel()));
  if (info.dtype == DType::kF32) {
    std::memcpy(out.data(), src, out.size() * sizeof(float));
  } else {
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t bits;
      std::memcpy(&bits, src + 2 * i, 2);
      out[i] = info.dtype == DType::kF16 ? f16_bits_to_f32(bits) : bf16_bits_to_f32(bits);
    }
  }
  return out;
}

void write_safetensors(const fs::path& path, const std::vector<SafetensorToWrite>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const char* name = st_name(t.dtype);
    PAGODA_REQUIRE(name != nullptr, kInvalidArgument, "cannot write dtype {} to safetensors",
                   t.dtype);
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    const uint64_t bytes = static_cast<uint64_t>(n) * dtype_size(t.dtype);
    header[t.name] = {{"dtype", name}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');
  std::ofstream f(path, std::ios::binary);
  PAGODA_REQUIRE(f.good(), kInternal, "cannot write {}", path.string());
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>((uint64_t{h.size()} >> (8 * i)) & 0xFF);
  f.write(reinterpret_cast<const char*>(len), 8);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    if (t.dtype == DType::kF32) {
      f.write(reinterpret_cast<const char*>(t.data), n * 4);
      continue;
    }
    std::vector<uint16_t> buf(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      buf[i] = t.dtype == DType::kF16 ? f32_to_f16_bits(t.data[i]) : f32_to_bf16_bits(t.data[i]);
    f.write(reinterpret_cast<const char*>(buf.data()), n * 2);
  }
  PAGODA_REQUIRE(f.good(), kInternal, "write to {} failed", path.string());
}

namespace {

/// Finds tensors by name across the shards of a checkpoint.
class TensorSource {
 public:
  explicit TensorSource(const fs::path& dir) {
    std::set<fs::path> files;
    const fs::path index = dir / "model.safetensors.index.json";
    if (fs::exists(index)) {
      std::ifstream in(index);
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(in);
        for (const auto& [name, file] : j.at("weight_map").items())
          files.insert(dir / file.get<std::string>());
      } catch (const nlohmann::json::exception& e) {
        throw_error(ErrorCode::kInvalidArgument, "{}: {}", index.string(), e.what());
      }
    } else {
      for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ".safetensors") files.insert(e.path());
    }
    PAGODA_REQUIRE(!files.empty(), kInvalidArgument, "{}: no *.safetensors files", dir.string());
    for (const auto& p : files) files_.emplace_back(p);
  }

  bool contains(const std::string& name) const {
    return std::any_of(files_.begin(), files_.end(),
                       [&](const SafetensorsFile& f) { return f.contains(name); });
  }

  std::vector<float> read(const std::string& name, std::vector<int64_t> expected_shape) const {
    for (const auto& f : files_) {
      auto it = f.tensors().find(name);
      if (it == f.tensors().end()) continue;
      PAGODA_REQUIRE(it->second.shape == expected_shape, kInvalidArgument,
                     "tensor {} has shape [{}], expected [{}]", name,
                     fmt::join(it->second.shape, ", "), fmt::join(expected_shape, ", "));
      return f.read_f32(name);
    }
    throw_error(ErrorCode::kInvalidArgument, "checkpoint has no tensor {}", name);
  }

 private:
  std::vector<SafetensorsFile> files_;
};

}  // namespace

LoadedModel load_hf_checkpoint(const fs::path& dir) {
  PAGODA_REQUIRE(fs::is_directory(dir), kInvalidArgument, "{} is not a directory", dir.string());
  const fs::path config_path = dir / "config.json";
  PAGODA_REQUIRE(fs::exists(config_path), kInvalidArgument, "{} has no config.json",
                 dir.string());
  nlohmann::json j;
  {
    std::ifstream in(config_path);
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw_error(ErrorCode::kInvalidArgument, "{}: {}", config_path.string(), e.what());
    }
  }
  LoadedModel m;
  m.config = config_from_hf_json(j);
  m.config.name = fs::absolute(dir).filename().string();
  if (m.config.name.empty()) m.config.name = dir.string();
  const ModelConfig& c = m.config;
  const TensorSource src(dir);
  const int64_t h = c.hidden_size, v = c.vocab_size, inter = c.intermediate_size;
  const int64_t qd = int64_t{c.num_q_heads} * c.head_dim;
  const int64_t kvd = int64_t{c.num_kv_heads} * c.head_dim;
  ModelWeights& w = m.weights;
  w.embed = src.read("model.embed_tokens.weight", {v, h});
  w.final_norm = src.read("model.norm.weight", {h});
  if (src.contains("lm_head.weight")) {
    w.lm_head = src.read("lm_head.weight", {v, h});
  } else {
    PAGODA_REQUIRE(c.tie_word_embeddings, kInvalidArgument,
                   "checkpoint has no lm_head.weight and tie_word_embeddings is false");
  }
  w.layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    LayerWeights& lw = w.layers[l];
    lw.input_norm = src.read(p + "input_layernorm.weight", {h});
    lw.q_proj = src.read(p + "self_attn.q_proj.weight", {qd, h});
    lw.k_proj = src.read(p + "self_attn.k_proj.weight", {kvd, h});
    lw.v_proj = src.read(p + "self_attn.v_proj.weight", {kvd, h});
    lw.o_proj = src.read(p + "self_attn.o_proj.weight", {h, qd});
    lw.post_norm = src.read(p + "post_attention_layernorm.weight", {h});
    lw.gate_proj = src.read(p + "mlp.gate_proj.weight", {inter, h});
    lw.up_proj = src.read(p + "mlp.up_proj.weight", {inter, h});
    lw.down_proj = src.read(p + "mlp.down_proj.weight", {h, inter});
  }
  w.validate(c);
  return m;
}

LoadedModel load_model(const std::string& spec, uint64_t weight_seed) {
  if (spec == "builtin") {
    LoadedModel m;
    m.config = builtin_tiny_config();
    m.weights = make_random_weights(m.config, weight_seed);
    return m;
  }
  return load_hf_checkpoint(spec);
}

void save_hf_checkpoint(const fs::path& dir, const ModelConfig& c, const ModelWeights& w,
                        DType dtype) {
  w.validate(c);
  fs::create_directories(dir);
  const int64_t h = c.hidden_size, v = c.vocab_size, inter = c.intermediate_size;
  const int64_t qd = int64_t{c.num_q_heads} * c.head_dim;
  const int64_t kvd = int64_t{c.num_kv_heads} * c.head_dim;
  std::vector<SafetensorToWrite> t;
  t.push_back({"model.embed_tokens.weight", {v, h}, w.embed.data(), dtype});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    const LayerWeights& lw = w.layers[l];
    t.push_back({p + "input_layernorm.weight", {h}, lw.input_norm.data(), dtype});
    t.push_back({p + "self_attn.q_proj.weight", {qd, h}, lw.q_proj.data(), dtype});
    t.push_back({p + "self_attn.k_proj.weight", {kvd, h}, lw.k_proj.data(), dtype});
    t.push_back({p + "self_attn.v_proj.weight", {kvd, h}, lw.v_proj.data(), dtype});
    t.push_back({p + "self_attn.o_proj.weight", {h, qd}, lw.o_proj.data(), dtype});
    t.push_back({p + "post_attention_layernorm.weight", {h}, lw.post_norm.data(), dtype});
    t.push_back({p + "mlp.gate_proj.weight", {inter, h}, lw.gate_proj.data(), dtype});
    t.push_back({p + "mlp.up_proj.weight", {inter, h}, lw.up_proj.data(), dtype});
    t.push_back({p + "mlp.down_proj.weight", {h, inter}, lw.down_proj.data(), dtype});
  }
  t.push_back({"model.norm.weight", {h}, w.final_norm.data(), dtype});
  if (!w.lm_head.empty()) t.push_back({"lm_head.weight", {v, h}, w.lm_head.data(), dtype});
  write_safetensors(dir / "model.safetensors", t);

  nlohmann::json j = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_layers},
      {"num_attention_heads", c.num_q_heads},
      {"num_key_value_heads", c.num_kv_heads},
      {"head_dim", c.head_dim},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope.theta},
      {"max_position_embeddings", c.max_position_embeddings},
      {"tie_word_embeddings", w.lm_head.empty()},
      {"hidden_act", "silu"},
      {"torch_dtype", dtype == DType::kF32 ? "float32" : (dtype == DType::kF16 ? "float16" : "bfloat16")},
  };
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_id >= 0) j["eos_token_id"] = c.eos_token_id;
  if (c.rope.scaling == RopeScalingKind::kLinear) {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope.factor}};
  } else if (c.rope.scaling == RopeScalingKind::kLlama3) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope.factor},
                         {"low_freq_factor", c.rope.low_freq_factor},
                         {"high_freq_factor", c.rope.high_freq_factor},
                         {"original_max_position_embeddings", c.rope.original_max_position}};
  }
  if (c.has_sliding_window()) {
    int w_max = 0;
    std::vector<std::string> types;
    for (int l = 0; l < c.num_layers; ++l) {
      w_max = std::max(w_max, c.window_of(l));
      types.push_back(c.window_of(l) >= 0 ? "sliding_attention" : "full_attention");
    }
    for (int l = 0; l < c.num_layers; ++l)
      PAGODA_REQUIRE(c.window_of(l) < 0 || c.window_of(l) == w_max, kUnsupported,
                     "HF configs hold one sliding_window value for all sliding layers");
    j["sliding_window"] = w_max + 1;
    j["layer_types"] = types;
  }
  if (c.final_logit_softcap > 0.f) j["final_logit_softcapping"] = c.final_logit_softcap;
  if (c.attn_logit_softcap > 0.f) j["attn_logit_softcapping"] = c.attn_logit_softcap;
  std::ofstream f(dir / "config.json");
  f << j.dump(2) << "\n";
  PAGODA_REQUIRE(f.good(), kInternal, "write {} failed", (dir / "config.json").string());
}

}  // namespace pagoda::model
