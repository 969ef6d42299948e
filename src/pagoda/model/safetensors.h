#pragma once
/// Safetensors I/O and Hugging Face checkpoint loading.
///
/// File format: an 8-byte little-endian header length N, N bytes of JSON
/// ({"name": {"dtype": "F32"|"F16"|"BF16"|..., "shape": [...], "data_offsets": [begin, end]},
/// "__metadata__": {...}}), then the raw little-endian tensor bytes (offsets relative to the byte
/// after the header). Files are memory-mapped read-only while open.

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pagoda/core/dtype.h"
#include "pagoda/model/config.h"
#include "pagoda/model/weights.h"

namespace pagoda::model {

/// One tensor's header entry.
struct SafetensorInfo {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  ///< byte offset in the data section
  uint64_t end = 0;
  /// Product of `shape`; -1 when a dim is negative or the product overflows int64 (a header
  /// SafetensorsFile accepted never gives -1).
  int64_t numel() const;
};

/// Product of `shape`, or nullopt when a dim is negative or the product overflows int64.
std::optional<int64_t> checked_numel(std::span<const int64_t> shape);

/// Validates the header of the safetensors file whose bytes are `bytes` (the whole file: the
/// data section is only measured, never read) with exactly SafetensorsFile's checks and errors;
/// `path` only names the file in messages. Returns the entries and, when `data_offset` is not
/// null, the data section's offset. Nothing is allocated from an unchecked size. Used by
/// SafetensorsFile and by the fuzz target tests/fuzz/fuzz_model_inputs.cpp.
std::map<std::string, SafetensorInfo> parse_safetensors_header(const std::filesystem::path& path,
                                                               std::span<const uint8_t> bytes,
                                                               size_t* data_offset);

/// A memory-mapped .safetensors file (read-only). Movable, not copyable.
class SafetensorsFile {
 public:
  /// Opens and validates the header before anything else is read: header length inside the
  /// file, a JSON object without duplicate names, every entry {dtype, shape, data_offsets} with
  /// integer dims >= 0 whose product (overflow-checked) × dtype size equals its byte range, and
  /// the ranges tiling the data section exactly (no overlap, hole or trailing bytes).
  /// Throws Error(kInvalidArgument) on a malformed file, kUnsupported on an unknown dtype,
  /// kInternal on I/O failure.
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) = delete;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::map<std::string, SafetensorInfo>& tensors() const { return tensors_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  /// The tensor converted to f32 (F32, F16, BF16 sources). Throws kInvalidArgument if absent.
  std::vector<float> read_f32(const std::string& name) const;
  /// A BF16 tensor's values as they are stored (uint16 bits). Throws kInvalidArgument if absent
  /// or of another dtype.
  std::vector<uint16_t> read_bf16(const std::string& name) const;
  /// An I64 or BOOL tensor (EAGLE-3's d2t / t2d) as int64. Throws kInvalidArgument if absent or
  /// of another dtype (read_f32 likewise refuses integer tensors).
  std::vector<int64_t> read_i64(const std::string& name) const;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::map<std::string, SafetensorInfo> tensors_;
  const uint8_t* map_ = nullptr;
  size_t map_size_ = 0;
  size_t data_offset_ = 0;
};

/// A tensor to write: f32 values stored as `dtype` (F32, F16 or BF16, rounded to nearest even;
/// I64 or U8 (written as BOOL), truncated: integral values below 2^24).
struct SafetensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  ///< numel(shape) values
  DType dtype = DType::kF32;
};

/// Writes a .safetensors file (tensors in the given order). Throws kInvalidArgument for an
/// unsupported dtype, kInternal on I/O failure.
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<SafetensorToWrite>& tensors);

/// How load_hf_checkpoint keeps the tensors.
struct LoadOptions {
  /// Keep the dense GEMM matrices (q/k/v/o, gate/up/down of Llama-family attention layers), the
  /// embedding and the LM head that the checkpoint stores in BF16 as bf16 (LayerWeights::bf16,
  /// ModelWeights::embed_bf16 / lm_head_bf16) instead of widening them to f32:
  /// for model ops whose GEMMs read bf16 (the CPU ops' onednn and amx modes; cpu_gemm_reads_bf16),
  /// so a bf16 checkpoint is never widened. Every other tensor is f32 either way.
  bool keep_bf16 = false;
};

/// A model loaded from disk.
struct LoadedModel {
  ModelConfig config;
  ModelWeights weights;
};

/// Loads a Hugging Face LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM /
/// Gemma2ForCausalLM / Gemma3ForCausalLM (text) checkpoint folder (Gemma: the four norms per layer
/// and Gemma 3's self_attn.{q,k}_norm too): config.json (config_from_hf_json, strict) plus either
/// model.safetensors.index.json (sharded; its weight_map names the files, plain names inside `dir`)
/// or every *.safetensors file in the folder. Weights are converted to f32 (but see
/// LoadOptions::keep_bf16). Every tensor in the
/// files must be one the model uses (only `*.rotary_emb.inv_freq` is ignored): a stray tensor, e.g.
/// a q_proj.bias the config does not declare, is an Error naming it, as is a name in two shards, a
/// missing or mismatched tensor, or a tied lm_head.weight that differs from the embedding.
LoadedModel load_hf_checkpoint(const std::filesystem::path& dir, const LoadOptions& options = {});

/// "builtin" → builtin_tiny_config() with make_random_weights(config, weight_seed) (f32;
/// `options` does not apply); anything else is a checkpoint folder for load_hf_checkpoint().
/// Throws Error like those.
LoadedModel load_model(const std::string& spec, uint64_t weight_seed,
                       const LoadOptions& options = {});

/// Writes `weights` as a HF checkpoint folder (config.json + model.safetensors in `dtype`) for
/// config.family (q/k/v biases when config.qkv_bias; Llama with bias writes attention_bias).
/// Windows: Mistral needs one window on every layer (or writes layer_types), Qwen2 writes
/// use_sliding_window + layer_types, Gemma writes sliding_window + layer_types (and explicit null
/// soft caps when there are none); a Llama config with windows is Error(kUnsupported)
/// (transformers' Llama has none), as is a config whose Gemma fields do not match its family. Used
/// by tests and tools. `dir` is created if needed.
void save_hf_checkpoint(const std::filesystem::path& dir, const ModelConfig& config,
                        const ModelWeights& weights, DType dtype);

}  // namespace pagoda::model
