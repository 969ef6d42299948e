// libFuzzer target for the untrusted files a checkpoint folder brings: the first byte picks the
// input kind, the rest is the file.
//   0: a .safetensors file (8-byte header length + JSON header + data), parse_safetensors_header
//   1: config.json text, config_from_hf_json
//   2: tokenizer.json text, HfTokenizer (then encode / decode of a fixed text and of the input)
//   3: a valid config.json with one key's value replaced by the input (JSON text), so the
//      range checks are reached without the fuzzer first discovering the whole schema
//   4: a valid two-tensor safetensors file whose dims and offsets come from the input (int64s)
//   5: a valid tokenizer.json (byte-fallback BPE) with one member replaced by the input (JSON)
// Each must return or throw its documented error (pagoda::Error; for the tokenizer also
// nlohmann::json::exception for a wrong member type) — never crash, hang, leak or throw anything
// else (std::bad_alloc or std::length_error from an unchecked size is a bug: abort). Accepted
// results must satisfy the validated invariants. One CI target covers all three (30 s budget).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/model/config.h"
#include "pagoda/model/safetensors.h"
#include "pagoda/tokenizer/hf_tokenizer.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

void fuzz_safetensors(std::span<const uint8_t> bytes) {
  size_t data_offset = 0;
  const auto tensors = pagoda::model::parse_safetensors_header("fuzz.safetensors", bytes, &data_offset);
  check(data_offset >= 8 && data_offset <= bytes.size());
  const uint64_t data_size = bytes.size() - data_offset;
  uint64_t covered = 0;
  for (const auto& [name, info] : tensors) {
    check(info.begin <= info.end && info.end <= data_size);
    const int64_t n = info.numel();
    check(n >= 0);
    check(static_cast<uint64_t>(n) * pagoda::dtype_size(info.dtype) == info.end - info.begin);
    covered += info.end - info.begin;
  }
  check(covered == data_size);  // the ranges tile the data section
}

void fuzz_config(std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return;
  const pagoda::model::ModelConfig c = pagoda::model::config_from_hf_json(j);
  c.validate();  // an accepted config is a valid one
  check(c.num_layers >= 1 && c.num_layers <= pagoda::model::kMaxLayers);
  check(c.num_q_heads >= 1 && c.num_kv_heads >= 1 && c.num_q_heads % c.num_kv_heads == 0);
  check(c.layer_window.empty() || static_cast<int>(c.layer_window.size()) == c.num_layers);
  check(c.num_parameters() > 0);
}

void fuzz_tokenizer(std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return;
  const pagoda::tokenizer::HfTokenizer tok(j);
  const int32_t vocab = tok.vocab_size();
  check(vocab >= 0);
  for (std::string_view s : {std::string_view("Hello, world! 123 \xc3\xa9t\xc3\xa9"), text.substr(0, 64)}) {
    std::vector<int32_t> ids;
    try {
      ids = tok.encode(s, true);
    } catch (const pagoda::Error&) {
      continue;  // invalid UTF-8 (documented)
    }
    for (int32_t id : ids) check(id >= 0);
    (void)tok.decode(ids, false);
    (void)tok.decode(ids, true);
  }
}

/// A valid Llama config.json; mode 3 replaces the value of key number data[1] % size.
const char* const kConfigKeys[] = {
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings",
    "sliding_window", "rope_scaling", "eos_token_id", "bos_token_id", "torch_dtype",
    "tie_word_embeddings", "architectures", "layer_types", "use_sliding_window",
    "max_window_layers", "attn_logit_softcapping"};

void fuzz_config_field(std::span<const uint8_t> in) {
  if (in.empty()) return;
  nlohmann::json j = nlohmann::json::parse(R"({
    "architectures": ["MistralForCausalLM"], "vocab_size": 1000, "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 3, "num_attention_heads": 8,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "max_position_embeddings": 2048, "sliding_window": 64, "bos_token_id": 1,
    "eos_token_id": 2, "torch_dtype": "bfloat16"})");
  const std::string key = kConfigKeys[in[0] % std::size(kConfigKeys)];
  const std::string_view text(reinterpret_cast<const char*>(in.data() + 1), in.size() - 1);
  nlohmann::json v = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) return;
  j[key] = std::move(v);
  fuzz_config(j.dump());
}

/// Mode 4: int64 dims / offsets read from the input drive a valid-looking header.
void fuzz_safetensors_numbers(std::span<const uint8_t> in) {
  auto next = [&, pos = size_t{0}]() mutable -> int64_t {
    int64_t v = 0;
    for (int b = 0; b < 8; ++b) v = (v << 8) | (pos < in.size() ? in[pos++] : 0);
    return v;
  };
  nlohmann::json h;
  const int64_t a0 = next(), a1 = next(), o0 = next(), o1 = next(), b0 = next(), o2 = next();
  h["a"] = {{"dtype", "F32"}, {"shape", {a0, a1}}, {"data_offsets", {o0, o1}}};
  h["b"] = {{"dtype", "BF16"}, {"shape", {b0}}, {"data_offsets", {o1, o2}}};
  const std::string header = h.dump();
  const size_t data = static_cast<size_t>(static_cast<uint64_t>(next()) % 4096);
  std::vector<uint8_t> file(8 + header.size() + data, 0);
  for (int b = 0; b < 8; ++b) file[static_cast<size_t>(b)] = static_cast<uint8_t>(header.size() >> (8 * b));
  std::copy(header.begin(), header.end(), file.begin() + 8);
  fuzz_safetensors(file);
}

/// A valid byte-fallback BPE tokenizer.json: <unk> 0, <s> 1, <0x00>..<0xFF> 2..257, a, b, ab.
nlohmann::json tokenizer_template() {
  nlohmann::json vocab = nlohmann::json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) vocab[std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">"] = 2 + b;
  vocab["a"] = 258;
  vocab["b"] = 259;
  vocab["ab"] = 260;
  return nlohmann::json{
      {"version", "1.0"},
      {"added_tokens", nlohmann::json::array({nlohmann::json{
                           {"id", 1}, {"content", "<s>"}, {"special", true}, {"lstrip", false},
                           {"rstrip", false}, {"single_word", false}, {"normalized", false}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", nullptr},
      {"post_processor", nullptr},
      {"decoder", nlohmann::json{{"type", "ByteFallback"}}},
      {"model", nlohmann::json{{"type", "BPE"}, {"unk_token", "<unk>"}, {"byte_fallback", true},
                               {"fuse_unk", true}, {"vocab", vocab},
                               {"merges", nlohmann::json::array({nlohmann::json::array({"a", "b"})})}}}};
}

const char* const kTokenizerPaths[] = {
    "/added_tokens", "/added_tokens/0", "/added_tokens/0/id", "/normalizer", "/pre_tokenizer",
    "/post_processor", "/decoder", "/model", "/model/type", "/model/vocab", "/model/vocab/ab",
    "/model/merges", "/model/merges/0", "/model/unk_token", "/model/byte_fallback"};

void fuzz_tokenizer_field(std::span<const uint8_t> in) {
  if (in.empty()) return;
  static const nlohmann::json base = [] {
    nlohmann::json t = tokenizer_template();
    try {
      const pagoda::tokenizer::HfTokenizer check_template(t);  // the template itself must load
    } catch (...) {
      std::abort();
    }
    return t;
  }();
  const std::string_view text(reinterpret_cast<const char*>(in.data() + 1), in.size() - 1);
  nlohmann::json v = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) return;
  nlohmann::json j = base;
  j[nlohmann::json::json_pointer(kTokenizerPaths[in[0] % std::size(kTokenizerPaths)])] = std::move(v);
  fuzz_tokenizer(j.dump());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::span<const uint8_t> rest(data + 1, size - 1);
  const std::string_view text(reinterpret_cast<const char*>(rest.data()), rest.size());
  try {
    switch (data[0] % 6) {
      case 0:
        fuzz_safetensors(rest);
        break;
      case 1:
        fuzz_config(text);
        break;
      case 2:
        fuzz_tokenizer(text);
        break;
      case 3:
        fuzz_config_field(rest);
        break;
      case 4:
        fuzz_safetensors_numbers(rest);
        break;
      default:
        fuzz_tokenizer_field(rest);
        break;
    }
  } catch (const pagoda::Error&) {
  } catch (const nlohmann::json::exception&) {
    // documented for the tokenizer (member of the wrong JSON type); config_from_hf_json must
    // turn every type error into pagoda::Error
    const int mode = data[0] % 6;
    if (mode != 2 && mode != 5) std::abort();
  }
  return 0;
}
