#include "pagoda/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
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
  if (s == "I64") return DType::kI64;   // EAGLE-3 d2t (read_i64)
  if (s == "BOOL") return DType::kU8;   // EAGLE-3 t2d (read_i64)
  return std::nullopt;
}

const char* st_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI64:
      return "I64";
    case DType::kU8:
      return "BOOL";
    default:
      return nullptr;
  }
}

}  // namespace

int64_t SafetensorInfo::numel() const {
  return checked_numel(shape).value_or(-1);
}

std::optional<int64_t> checked_numel(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return std::nullopt;
  return n;
}

namespace {

/// A non-negative JSON integer (an unsigned value above INT64_MAX or a float is not one).
std::optional<int64_t> json_index(const nlohmann::json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    const int64_t x = v.get<int64_t>();
    if (x < 0) return std::nullopt;
    return x;
  }
  return std::nullopt;
}

/// Parses one header entry {"dtype", "shape", "data_offsets"}; `data_size` bounds the offsets.
SafetensorInfo parse_entry(const fs::path& path, const std::string& name,
                           const nlohmann::json& entry, uint64_t data_size) {
  const std::string where = fmt::format("{}: tensor {}", path.string(), name);
  PAGODA_REQUIRE(entry.is_object(), kInvalidArgument, "{}: entry is not an object", where);
  for (const auto& [k, v] : entry.items())
    PAGODA_REQUIRE(k == "dtype" || k == "shape" || k == "data_offsets", kInvalidArgument,
                   "{}: unknown field '{}'", where, k);
  const auto dt_it = entry.find("dtype");
  PAGODA_REQUIRE(dt_it != entry.end() && dt_it->is_string(), kInvalidArgument,
                 "{}: dtype missing or not a string", where);
  const std::string dt = dt_it->get<std::string>();
  const auto dtype = dtype_from_st(dt);
  PAGODA_REQUIRE(dtype.has_value(), kUnsupported, "{} has dtype {} (supported: F32, F16, BF16, I64, BOOL)",
                 where, dt);
  SafetensorInfo info;
  info.dtype = *dtype;
  const auto sh = entry.find("shape");
  PAGODA_REQUIRE(sh != entry.end() && sh->is_array() && sh->size() <= 8, kInvalidArgument,
                 "{}: shape missing or not a list of at most 8 dims", where);
  for (const auto& d : *sh) {
    const auto v = json_index(d);
    PAGODA_REQUIRE(v.has_value(), kInvalidArgument, "{}: shape has {} (dims must be integers >= 0)",
                   where, d.dump());
    info.shape.push_back(*v);
  }
  const auto offs = entry.find("data_offsets");
  PAGODA_REQUIRE(offs != entry.end() && offs->is_array() && offs->size() == 2, kInvalidArgument,
                 "{}: data_offsets missing or not [begin, end]", where);
  const auto b = json_index((*offs)[0]), e = json_index((*offs)[1]);
  PAGODA_REQUIRE(b && e && *b <= *e && static_cast<uint64_t>(*e) <= data_size, kInvalidArgument,
                 "{}: bad data_offsets {} (data section holds {} bytes)", where, offs->dump(),
                 data_size);
  info.begin = static_cast<uint64_t>(*b);
  info.end = static_cast<uint64_t>(*e);
  const auto n = checked_numel(info.shape);
  uint64_t bytes = 0;
  PAGODA_REQUIRE(n && !__builtin_mul_overflow(static_cast<uint64_t>(*n),
                                              uint64_t{dtype_size(info.dtype)}, &bytes),
                 kInvalidArgument, "{}: shape [{}] overflows", where, fmt::join(info.shape, ", "));
  PAGODA_REQUIRE(bytes == info.end - info.begin, kInvalidArgument,
                 "{}: shape [{}] x {} is {} bytes but data_offsets span {}", where,
                 fmt::join(info.shape, ", "), dt, bytes, info.end - info.begin);
  return info;
}

}  // namespace

std::map<std::string, SafetensorInfo> parse_safetensors_header(const fs::path& path,
                                                               std::span<const uint8_t> bytes,
                                                               size_t* data_offset_out) {
  PAGODA_REQUIRE(bytes.size() >= 8, kInvalidArgument, "{}: not a safetensors file (too small)",
                 path.string());
  std::map<std::string, SafetensorInfo> tensors;
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  PAGODA_REQUIRE(header_len <= bytes.size() - 8, kInvalidArgument,
                 "{}: header length {} exceeds the file", path.string(), header_len);
  const size_t data_offset = 8 + static_cast<size_t>(header_len);
  const uint64_t data_size = bytes.size() - data_offset;
  nlohmann::json header;
  try {
    // Duplicate tensor names would silently keep the last entry: refuse them while parsing.
    std::set<std::string> seen;
    auto no_duplicates = [&](int depth, nlohmann::json::parse_event_t event,
                             nlohmann::json& parsed) {
      if (depth == 1 && event == nlohmann::json::parse_event_t::key) {
        const std::string key = parsed.get<std::string>();
        PAGODA_REQUIRE(seen.insert(key).second, kInvalidArgument,
                       "{}: tensor {} appears twice in the header", path.string(), key);
      }
      return true;
    };
    header = nlohmann::json::parse(bytes.data() + 8, bytes.data() + data_offset, no_duplicates);
  } catch (const nlohmann::json::exception& e) {
    throw_error(ErrorCode::kInvalidArgument, "{}: bad header JSON: {}", path.string(), e.what());
  }
  PAGODA_REQUIRE(header.is_object(), kInvalidArgument, "{}: header is not a JSON object",
                 path.string());
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      PAGODA_REQUIRE(entry.is_object(), kInvalidArgument, "{}: __metadata__ is not an object",
                     path.string());
      continue;
    }
    SafetensorInfo info = parse_entry(path, name, entry, data_size);
    ranges.emplace_back(info.begin, info.end);
    tensors.emplace(name, std::move(info));
  }
  // The data section is exactly the tensors' bytes, back to back: no overlap, no hole, no
  // trailing bytes (the format's own rule; an overlap would alias two tensors).
  std::sort(ranges.begin(), ranges.end());
  uint64_t covered = 0;
  for (const auto& [b, e] : ranges) {
    PAGODA_REQUIRE(b == covered, kInvalidArgument,
                   "{}: tensor data ranges {} at byte {} (expected {}: overlapping or gapped "
                   "data_offsets)",
                   path.string(), b < covered ? "overlap" : "leave a hole", b, covered);
    covered = e;
  }
  PAGODA_REQUIRE(covered == data_size, kInvalidArgument,
                 "{}: tensors cover {} of the {} data bytes", path.string(), covered, data_size);
  if (data_offset_out != nullptr) *data_offset_out = data_offset;
  return tensors;
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
    tensors_ = parse_safetensors_header(path, {map_, map_size_}, &data_offset_);
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
  PAGODA_REQUIRE(it != tensors_.end(), kInvalidArgument, "{}: no tensor named {}", path_.string(),
                 name);
  const SafetensorInfo& info = it->second;
  PAGODA_REQUIRE(dtype_is_float(info.dtype), kInvalidArgument,
                 "{}: tensor {} has dtype {}, expected F32, F16 or BF16", path_.string(), name,
                 info.dtype);
  const uint8_t* src = map_ + data_offset_ + info.begin;
  std::vector<float> out(static_cast<size_t>(info.numel()));
  if (info.dtype == DType::kF32) {
    std::memcpy(out.data(), src, out.size() * sizeof(float));
  } else {
    // On the OpenMP threads: an 8B checkpoint widens 16 GB of bf16 into 32 GB of f32 here.
    const bool f16 = info.dtype == DType::kF16;
    float* dst = out.data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < static_cast<int64_t>(out.size()); ++i) {
      uint16_t bits;
      std::memcpy(&bits, src + 2 * i, 2);
      dst[i] = f16 ? f16_bits_to_f32(bits) : bf16_bits_to_f32(bits);
    }
  }
  return out;
}

std::vector<uint16_t> SafetensorsFile::read_bf16(const std::string& name) const {
  auto it = tensors_.find(name);
  PAGODA_REQUIRE(it != tensors_.end(), kInvalidArgument, "{}: no tensor named {}", path_.string(),
                 name);
  const SafetensorInfo& info = it->second;
  PAGODA_REQUIRE(info.dtype == DType::kBF16, kInvalidArgument,
                 "{}: tensor {} has dtype {}, expected BF16", path_.string(), name, info.dtype);
  std::vector<uint16_t> out(static_cast<size_t>(info.numel()));
  std::memcpy(out.data(), map_ + data_offset_ + info.begin, out.size() * sizeof(uint16_t));
  return out;
}

std::vector<int64_t> SafetensorsFile::read_i64(const std::string& name) const {
  auto it = tensors_.find(name);
  PAGODA_REQUIRE(it != tensors_.end(), kInvalidArgument, "{}: no tensor named {}", path_.string(),
                 name);
  const SafetensorInfo& info = it->second;
  PAGODA_REQUIRE(info.dtype == DType::kI64 || info.dtype == DType::kU8, kInvalidArgument,
                 "{}: tensor {} has dtype {}, expected I64 or BOOL", path_.string(), name,
                 info.dtype);
  const uint8_t* src = map_ + data_offset_ + info.begin;
  std::vector<int64_t> out(static_cast<size_t>(info.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    if (info.dtype == DType::kU8) {
      out[i] = src[i];
    } else {
      std::memcpy(&out[i], src + 8 * i, 8);
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
    header[t.name] = {
        {"dtype", name}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
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
    if (t.dtype == DType::kI64 || t.dtype == DType::kU8) {  // integral values given as floats
      std::vector<uint8_t> buf(static_cast<size_t>(n) * dtype_size(t.dtype));
      for (int64_t i = 0; i < n; ++i) write_from_f32(buf.data(), t.dtype, static_cast<size_t>(i), t.data[i]);
      f.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
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

/// Finds tensors by name across the shards of a checkpoint and remembers which were read, so
/// that a tensor the model does not use is an error instead of being ignored.
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
        PAGODA_REQUIRE(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
                       kInvalidArgument, "{}: no weight_map object", index.string());
        for (const auto& [name, file] : j.at("weight_map").items()) {
          PAGODA_REQUIRE(file.is_string(), kInvalidArgument, "{}: weight_map[{}] is not a string",
                         index.string(), name);
          const fs::path f = file.get<std::string>();
          PAGODA_REQUIRE(!f.empty() && f == f.filename() && f != "." && f != "..", kInvalidArgument,
                         "{}: weight_map[{}] = '{}' is not a file name in {}", index.string(), name,
                         f.string(), dir.string());
          files.insert(dir / f);
        }
      } catch (const nlohmann::json::exception& e) {
        throw_error(ErrorCode::kInvalidArgument, "{}: {}", index.string(), e.what());
      }
    } else {
      for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ".safetensors") files.insert(e.path());
    }
    PAGODA_REQUIRE(!files.empty(), kInvalidArgument, "{}: no *.safetensors files", dir.string());
    for (const auto& p : files) {
      files_.emplace_back(p);
      for (const auto& [name, info] : files_.back().tensors()) {
        const auto [it, fresh] = where_.emplace(name, files_.size() - 1);
        PAGODA_REQUIRE(fresh, kInvalidArgument, "tensor {} is in both {} and {}", name,
                       files_[it->second].path().filename().string(), p.filename().string());
      }
    }
  }

  bool contains(const std::string& name) const { return where_.count(name) != 0; }

  /// The tensor as f32, checked against `expected_shape`; marks it used.
  std::vector<float> read(const std::string& name, std::vector<int64_t> expected_shape) {
    return checked(name, expected_shape).read_f32(name);
  }

  /// A dense GEMM matrix, checked like read(): into `bf16` as stored when `keep_bf16` and the
  /// file stores it in BF16, else into `f32`.
  void read_matrix(const std::string& name, std::vector<int64_t> expected_shape,
                   std::vector<float>& f32, std::vector<uint16_t>& bf16) {
    const SafetensorsFile& f = checked(name, expected_shape);
    if (keep_bf16 && f.tensors().at(name).dtype == DType::kBF16) {
      bf16 = f.read_bf16(name);
    } else {
      f32 = f.read_f32(name);
    }
  }

  bool keep_bf16 = false;  ///< read_matrix's choice (LoadOptions::keep_bf16)

  /// The file holding `name`, whose shape was checked against `expected_shape`; marks it used.
  const SafetensorsFile& checked(const std::string& name,
                                 const std::vector<int64_t>& expected_shape) {
    auto it = where_.find(name);
    PAGODA_REQUIRE(it != where_.end(), kInvalidArgument, "checkpoint has no tensor {}", name);
    const SafetensorsFile& f = files_[it->second];
    const SafetensorInfo& info = f.tensors().at(name);
    PAGODA_REQUIRE(info.shape == expected_shape, kInvalidArgument,
                   "tensor {} has shape [{}], expected [{}]", name, fmt::join(info.shape, ", "),
                   fmt::join(expected_shape, ", "));
    used_.insert(name);
    return f;
  }

  /// Throws naming the first tensor that was never read (rotary_emb.inv_freq buffers, which
  /// the model recomputes, are the one harmless exception). `hint` ends the message.
  void require_all_used(const std::string& hint) const {
    for (const auto& [name, file] : where_) {
      if (used_.count(name) != 0 || name.ends_with("rotary_emb.inv_freq")) continue;
      throw_error(ErrorCode::kInvalidArgument,
                  "checkpoint tensor {} (in {}) is not used by this model{}", name,
                  files_[file].path().filename().string(), hint);
    }
  }

 private:
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;  ///< tensor name -> index in files_
  std::set<std::string> used_;
};

/// One DeepSeek layer's attention tensors (HF DeepseekV2/V3 names).
void read_mla_layer(TensorSource& src, const ModelConfig& c, const std::string& p,
                    LayerWeights& lw) {
  const MlaConfig& m = c.mla;
  const int64_t h = c.hidden_size, hq = c.num_q_heads, qr = m.q_lora_rank;
  const int64_t qk = int64_t{m.qk_nope_head_dim} + m.qk_rope_head_dim;
  const std::string a = p + "self_attn.";
  if (qr > 0) {
    lw.q_a_proj = src.read(a + "q_a_proj.weight", {qr, h});
    lw.q_a_norm = src.read(a + "q_a_layernorm.weight", {qr});
    lw.q_b_proj = src.read(a + "q_b_proj.weight", {hq * qk, qr});
  } else {
    lw.q_proj = src.read(a + "q_proj.weight", {hq * qk, h});
  }
  lw.kv_a_proj =
      src.read(a + "kv_a_proj_with_mqa.weight", {int64_t{m.kv_lora_rank} + m.qk_rope_head_dim, h});
  lw.kv_a_norm = src.read(a + "kv_a_layernorm.weight", {m.kv_lora_rank});
  lw.kv_b_proj =
      src.read(a + "kv_b_proj.weight", {hq * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank});
  lw.o_proj = src.read(a + "o_proj.weight", {h, hq * m.v_head_dim});
  if (!c.is_dsa()) return;
  const int64_t ih = c.dsa.index_n_heads, id = c.dsa.index_head_dim;
  const std::string x = a + "indexer.";
  lw.idx_wq_b = src.read(x + "wq_b.weight", {ih * id, qr});
  lw.idx_wk = src.read(x + "wk.weight", {id, h});
  lw.idx_k_norm = src.read(x + "k_norm.weight", {id});
  lw.idx_k_norm_bias = src.read(x + "k_norm.bias", {id});
  lw.idx_weights_proj = src.read(x + "weights_proj.weight", {ih, h});
}

/// One layer's q/k/v/o projections (HF self_attn.*_proj.weight).
void read_attention_proj(TensorSource& src, const ModelConfig& c, const std::string& p,
                         LayerWeights& lw) {
  const int64_t h = c.hidden_size, qd = int64_t{c.num_q_heads} * c.head_dim;
  const int64_t kvd = int64_t{c.num_kv_heads} * c.head_dim;
  src.read_matrix(p + "self_attn.q_proj.weight", {qd, h}, lw.q_proj, lw.bf16.q_proj);
  src.read_matrix(p + "self_attn.k_proj.weight", {kvd, h}, lw.k_proj, lw.bf16.k_proj);
  src.read_matrix(p + "self_attn.v_proj.weight", {kvd, h}, lw.v_proj, lw.bf16.v_proj);
  src.read_matrix(p + "self_attn.o_proj.weight", {h, qd}, lw.o_proj, lw.bf16.o_proj);
}

/// One Bamba Mamba2 layer's mixer tensors (HF BambaMixer names; conv1d.weight is [conv_dim, 1,
/// d_conv]).
void read_mamba_layer(TensorSource& src, const ModelConfig& c, const std::string& p,
                      LayerWeights& lw) {
  const MambaConfig& m = c.mamba;
  const int64_t h = c.hidden_size, di = m.d_inner(), cd = m.conv_dim(), nh = m.num_heads;
  const int64_t proj = di + cd + nh;
  const std::string x = p + "mamba.";
  lw.ssm_in_proj = src.read(x + "in_proj.weight", {proj, h});
  if (m.proj_bias) lw.ssm_in_bias = src.read(x + "in_proj.bias", {proj});
  lw.ssm_conv = src.read(x + "conv1d.weight", {cd, 1, m.conv_kernel});
  if (m.conv_bias) lw.ssm_conv_bias = src.read(x + "conv1d.bias", {cd});
  lw.ssm_dt_bias = src.read(x + "dt_bias", {nh});
  lw.ssm_a_log = src.read(x + "A_log", {nh});
  lw.ssm_d = src.read(x + "D", {nh});
  lw.ssm_norm = src.read(x + "norm.weight", {di});
  lw.ssm_out_proj = src.read(x + "out_proj.weight", {h, di});
  if (m.proj_bias) lw.ssm_out_bias = src.read(x + "out_proj.bias", {h});
}

/// A Bamba checkpoint (HF BambaForCausalLM names: final_layernorm, pre_ff_layernorm,
/// feed_forward.*, self_attn.* on the attention layers, mamba.* on the others).
void read_bamba_layers(TensorSource& src, const ModelConfig& c, ModelWeights& w) {
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    lw.input_norm = src.read(p + "input_layernorm.weight", {h});
    if (c.is_linear_layer(l)) {
      read_mamba_layer(src, c, p, lw);
    } else {
      read_attention_proj(src, c, p, lw);
    }
    lw.post_norm = src.read(p + "pre_ff_layernorm.weight", {h});
    src.read_matrix(p + "feed_forward.gate_proj.weight", {inter, h}, lw.gate_proj,
                    lw.bf16.gate_proj);
    src.read_matrix(p + "feed_forward.up_proj.weight", {inter, h}, lw.up_proj, lw.bf16.up_proj);
    src.read_matrix(p + "feed_forward.down_proj.weight", {h, inter}, lw.down_proj,
                    lw.bf16.down_proj);
  }
}

std::string describe(const ModelConfig& c) {
  if (c.has_linear_layers())
    return fmt::format("{}, {} attention and {} Mamba2 layers, conv bias {}, in/out_proj bias {}",
                       hf_architecture_name(c.family), c.num_attention_layers(),
                       c.num_linear_layers(), c.mamba.conv_bias ? "yes" : "no",
                       c.mamba.proj_bias ? "yes" : "no");
  if (c.is_mla())
    return fmt::format("{}, q LoRA {}, dense MLP{}", hf_architecture_name(c.family),
                       c.mla.q_lora_rank > 0 ? "yes" : "no (q_lora_rank null: q_proj)",
                       c.is_dsa() ? ", DSA indexer" : "");
  return fmt::format("{}, q/k/v bias {}", hf_architecture_name(c.family),
                     c.qkv_bias ? "yes" : "no (a bias needs attention_bias: true or Qwen2)");
}

}  // namespace

LoadedModel load_hf_checkpoint(const fs::path& dir, const LoadOptions& options) {
  PAGODA_REQUIRE(fs::is_directory(dir), kInvalidArgument, "{} is not a directory", dir.string());
  const fs::path config_path = dir / "config.json";
  PAGODA_REQUIRE(fs::exists(config_path), kInvalidArgument, "{} has no config.json", dir.string());
  nlohmann::json j;
  {
    std::ifstream in(config_path);
    try {
      j = parse_config_json(std::string(std::istreambuf_iterator<char>(in), {}));
    } catch (const nlohmann::json::exception& e) {
      throw_error(ErrorCode::kInvalidArgument, "{}: {}", config_path.string(), e.what());
    }
  }
  LoadedModel m;
  m.config = config_from_hf_json(j);
  m.config.name = fs::absolute(dir).filename().string();
  if (m.config.name.empty()) m.config.name = dir.string();
  const ModelConfig& c = m.config;
  TensorSource src(dir);
  src.keep_bf16 = options.keep_bf16;
  const int64_t h = c.hidden_size, v = c.vocab_size, inter = c.intermediate_size;
  const int64_t qd = int64_t{c.num_q_heads} * c.head_dim;
  const int64_t kvd = int64_t{c.num_kv_heads} * c.head_dim;
  ModelWeights& w = m.weights;
  const bool bamba = c.family == ModelFamily::kBamba;
  src.read_matrix("model.embed_tokens.weight", {v, h}, w.embed, w.embed_bf16);
  w.final_norm = src.read(bamba ? "model.final_layernorm.weight" : "model.norm.weight", {h});
  if (src.contains("lm_head.weight")) {
    src.read_matrix("lm_head.weight", {v, h}, w.lm_head, w.lm_head_bf16);
    // transformers ties the head to the embedding and ignores a stored copy: so do we, but a
    // copy that differs would mean two different models (compared as values: the two may be
    // stored in different dtypes).
    if (c.tie_word_embeddings) {
      // Widened only where the two forms differ (no copy of an f32 table).
      const bool same =
          w.lm_head_bf16.empty() == w.embed_bf16.empty()
              ? w.lm_head == w.embed && w.lm_head_bf16 == w.embed_bf16
              : (w.lm_head_bf16.empty() ? w.lm_head == widened_bf16(w.embed_bf16)
                                        : widened_bf16(w.lm_head_bf16) == w.embed);
      PAGODA_REQUIRE(same, kInvalidArgument,
                     "lm_head.weight differs from model.embed_tokens.weight although "
                     "tie_word_embeddings is true");
      w.lm_head.clear();
      w.lm_head_bf16.clear();
    }
  } else {
    PAGODA_REQUIRE(c.tie_word_embeddings, kInvalidArgument,
                   "checkpoint has no lm_head.weight and tie_word_embeddings is false");
  }
  w.layers.resize(c.num_layers);
  if (bamba) read_bamba_layers(src, c, w);
  for (int l = 0; l < c.num_layers && !bamba; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    LayerWeights& lw = w.layers[l];
    lw.input_norm = src.read(p + "input_layernorm.weight", {h});
    if (c.is_mla()) {
      read_mla_layer(src, c, p, lw);
    } else {
      read_attention_proj(src, c, p, lw);
    }
    if (c.qkv_bias) {
      lw.q_bias = src.read(p + "self_attn.q_proj.bias", {qd});
      lw.k_bias = src.read(p + "self_attn.k_proj.bias", {kvd});
      lw.v_bias = src.read(p + "self_attn.v_proj.bias", {kvd});
    }
    if (c.sandwich_norms) {  // Gemma: post_attention_layernorm is on the attention output
      lw.attn_out_norm = src.read(p + "post_attention_layernorm.weight", {h});
      lw.post_norm = src.read(p + "pre_feedforward_layernorm.weight", {h});
      lw.mlp_out_norm = src.read(p + "post_feedforward_layernorm.weight", {h});
    } else {
      lw.post_norm = src.read(p + "post_attention_layernorm.weight", {h});
    }
    if (c.qk_norm) {
      lw.q_norm = src.read(p + "self_attn.q_norm.weight", {c.head_dim});
      lw.k_norm = src.read(p + "self_attn.k_norm.weight", {c.head_dim});
    }
    src.read_matrix(p + "mlp.gate_proj.weight", {inter, h}, lw.gate_proj, lw.bf16.gate_proj);
    src.read_matrix(p + "mlp.up_proj.weight", {inter, h}, lw.up_proj, lw.bf16.up_proj);
    src.read_matrix(p + "mlp.down_proj.weight", {h, inter}, lw.down_proj, lw.bf16.down_proj);
  }
  src.require_all_used(fmt::format(" ({})", describe(c)));
  w.validate(c);
  return m;
}

LoadedModel load_model(const std::string& spec, uint64_t weight_seed, const LoadOptions& options) {
  if (spec == "builtin") {
    LoadedModel m;
    m.config = builtin_tiny_config();
    m.weights = make_random_weights(m.config, weight_seed);
    return m;
  }
  return load_hf_checkpoint(spec, options);
}

void save_hf_checkpoint(const fs::path& dir, const ModelConfig& c, const ModelWeights& w,
                        DType dtype) {
  w.validate(c);
  PAGODA_REQUIRE(w.embed_bf16.empty() && w.lm_head_bf16.empty(), kUnsupported,
                 "saving weights loaded with keep_bf16 is not implemented");
  for (const LayerWeights& lw : w.layers)
    PAGODA_REQUIRE(lw.bf16.q_proj.empty() && lw.bf16.k_proj.empty() && lw.bf16.v_proj.empty() &&
                       lw.bf16.o_proj.empty() && lw.bf16.gate_proj.empty() &&
                       lw.bf16.up_proj.empty() && lw.bf16.down_proj.empty(),
                   kUnsupported, "saving weights loaded with keep_bf16 is not implemented");
  PAGODA_REQUIRE(!c.is_mla() && !c.has_linear_layers(), kUnsupported,
                 "saving {} checkpoints is not implemented (tools/make_checkpoint.py writes "
                 "them)",
                 hf_architecture_name(c.family));
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
    if (c.qkv_bias) {
      t.push_back({p + "self_attn.q_proj.bias", {qd}, lw.q_bias.data(), dtype});
      t.push_back({p + "self_attn.k_proj.bias", {kvd}, lw.k_bias.data(), dtype});
      t.push_back({p + "self_attn.v_proj.bias", {kvd}, lw.v_bias.data(), dtype});
    }
    t.push_back({p + "self_attn.o_proj.weight", {h, qd}, lw.o_proj.data(), dtype});
    if (c.sandwich_norms) {
      t.push_back({p + "post_attention_layernorm.weight", {h}, lw.attn_out_norm.data(), dtype});
      t.push_back({p + "pre_feedforward_layernorm.weight", {h}, lw.post_norm.data(), dtype});
      t.push_back({p + "post_feedforward_layernorm.weight", {h}, lw.mlp_out_norm.data(), dtype});
    } else {
      t.push_back({p + "post_attention_layernorm.weight", {h}, lw.post_norm.data(), dtype});
    }
    if (c.qk_norm) {
      t.push_back({p + "self_attn.q_norm.weight", {c.head_dim}, lw.q_norm.data(), dtype});
      t.push_back({p + "self_attn.k_norm.weight", {c.head_dim}, lw.k_norm.data(), dtype});
    }
    t.push_back({p + "mlp.gate_proj.weight", {inter, h}, lw.gate_proj.data(), dtype});
    t.push_back({p + "mlp.up_proj.weight", {inter, h}, lw.up_proj.data(), dtype});
    t.push_back({p + "mlp.down_proj.weight", {h, inter}, lw.down_proj.data(), dtype});
  }
  t.push_back({"model.norm.weight", {h}, w.final_norm.data(), dtype});
  if (!w.lm_head.empty()) t.push_back({"lm_head.weight", {v, h}, w.lm_head.data(), dtype});
  write_safetensors(dir / "model.safetensors", t);

  const bool gemma = is_gemma_family(c.family);
  PAGODA_REQUIRE(
      c.sandwich_norms == gemma && c.norm_weight_offset == gemma &&
          c.qk_norm == (c.family == ModelFamily::kGemma3) &&
          c.activation == (gemma ? Activation::kGeluTanh : Activation::kSilu) &&
          c.embed_scale == (gemma ? std::sqrt(static_cast<float>(c.hidden_size)) : 1.f) &&
          (gemma || (c.query_pre_attn_scalar == 0.0 && c.local_rope.theta == 0.0)) &&
          ((c.family == ModelFamily::kGemma3) == (c.local_rope.theta > 0.0)),
      kUnsupported, "{} checkpoints cannot express this config's norms, activation or scales",
      hf_architecture_name(c.family));
  nlohmann::json j = {
      {"architectures", {std::string(hf_architecture_name(c.family))}},
      {"model_type", std::string(hf_model_type(c.family))},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_layers},
      {"num_attention_heads", c.num_q_heads},
      {"num_key_value_heads", c.num_kv_heads},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope.theta},
      {"max_position_embeddings", c.max_position_embeddings},
      {"tie_word_embeddings", w.lm_head.empty()},
      {gemma ? "hidden_activation" : "hidden_act", gemma ? "gelu_pytorch_tanh" : "silu"},
      {"torch_dtype",
       dtype == DType::kF32 ? "float32" : (dtype == DType::kF16 ? "float16" : "bfloat16")},
  };
  if (c.family != ModelFamily::kQwen2) {
    j["head_dim"] = c.head_dim;
  } else {
    PAGODA_REQUIRE(c.head_dim * c.num_q_heads == c.hidden_size, kUnsupported,
                   "Qwen2 configs need head_dim * heads == hidden_size");
  }
  if (c.family == ModelFamily::kLlama) j["attention_bias"] = c.qkv_bias;
  PAGODA_REQUIRE(c.qkv_bias == (c.family == ModelFamily::kQwen2) || c.family == ModelFamily::kLlama,
                 kUnsupported, "{} {} q/k/v biases", hf_architecture_name(c.family),
                 c.family == ModelFamily::kQwen2 ? "always has" : "never has");
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
  int w_max = -1;
  std::vector<std::string> types;
  for (int l = 0; l < c.num_layers; ++l) {
    w_max = std::max(w_max, c.window_of(l));
    types.push_back(c.window_of(l) >= 0 ? "sliding_attention" : "full_attention");
  }
  for (int l = 0; l < c.num_layers; ++l)
    PAGODA_REQUIRE(c.window_of(l) < 0 || c.window_of(l) == w_max, kUnsupported,
                   "HF configs hold one sliding_window value for all sliding layers");
  const bool all_sliding = std::all_of(
      types.begin(), types.end(), [](const std::string& s) { return s == "sliding_attention"; });
  switch (c.family) {
    case ModelFamily::kLlama:
      PAGODA_REQUIRE(!c.has_sliding_window(), kUnsupported,
                     "LlamaForCausalLM has no sliding window (save as Mistral or Qwen2)");
      break;
    case ModelFamily::kMistral:
      PAGODA_REQUIRE(!c.has_sliding_window() || all_sliding, kUnsupported,
                     "MistralForCausalLM slides every layer or none");
      j["sliding_window"] = c.has_sliding_window() ? nlohmann::json(w_max + 1) : nlohmann::json();
      break;
    case ModelFamily::kGemma2:
    case ModelFamily::kGemma3:
      j["sliding_window"] = w_max >= 0 ? w_max + 1 : 4096;  // unused when no layer slides
      j["layer_types"] = types;
      j["query_pre_attn_scalar"] =
          c.query_pre_attn_scalar > 0.0 ? c.query_pre_attn_scalar : double(c.head_dim);
      if (c.family == ModelFamily::kGemma3) j["rope_local_base_freq"] = c.local_rope.theta;
      // Gemma 2 defaults to caps of 50 / 30: an absent cap is written as null.
      j["final_logit_softcapping"] = nullptr;
      j["attn_logit_softcapping"] = nullptr;
      break;
    case ModelFamily::kQwen2: {
      // Sliding layers must be a suffix [max_window_layers, num_layers): the one pattern both
      // old (max_window_layers) and new (layer_types) transformers read the same way.
      int first = c.num_layers;
      while (first > 0 && types[first - 1] == "sliding_attention") --first;
      PAGODA_REQUIRE(std::find(types.begin(), types.begin() + first, "sliding_attention") ==
                         types.begin() + first,
                     kUnsupported, "Qwen2 sliding layers must be the last ones");
      j["use_sliding_window"] = c.has_sliding_window();
      j["sliding_window"] = c.has_sliding_window() ? nlohmann::json(w_max + 1) : nlohmann::json();
      j["max_window_layers"] = first;
      j["layer_types"] = types;
      break;
    }
    case ModelFamily::kDeepseekV2:
    case ModelFamily::kDeepseekV3:
    case ModelFamily::kDeepseekV32:
    case ModelFamily::kBamba:
      break;  // refused above
  }
  if (c.final_logit_softcap > 0.f) j["final_logit_softcapping"] = c.final_logit_softcap;
  if (c.attn_logit_softcap > 0.f) j["attn_logit_softcapping"] = c.attn_logit_softcap;
  std::ofstream f(dir / "config.json");
  f << j.dump(2) << "\n";
  PAGODA_REQUIRE(f.good(), kInternal, "write {} failed", (dir / "config.json").string());
}

}  // namespace pagoda::model
