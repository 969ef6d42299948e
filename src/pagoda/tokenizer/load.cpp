#include "pagoda/tokenizer/load.h"

#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/tokenizer/byte_tokenizer.h"
#include "pagoda/tokenizer/hf_tokenizer.h"
#include "pagoda/tokenizer/sentencepiece_tokenizer.h"

namespace pagoda::tokenizer {

namespace {

/// A token field of tokenizer_config.json: a string, {"content": ...}, or null.
std::optional<std::string> token_field(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content")) return it->at("content").get<std::string>();
  throw_error(ErrorCode::kInvalidArgument, "tokenizer_config.json: {} is malformed", key);
}

std::optional<bool> bool_field(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  PAGODA_REQUIRE(it->is_boolean(), kInvalidArgument, "tokenizer_config.json: {} is not a bool",
                 key);
  return it->get<bool>();
}

nlohmann::json read_config(const std::filesystem::path& dir) {
  const auto path = dir / "tokenizer_config.json";
  if (!std::filesystem::exists(path)) return nlohmann::json::object();
  std::ifstream in(path);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw_error(ErrorCode::kInvalidArgument, "{}: {}", path.string(), e.what());
  }
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& model_dir) {
  std::filesystem::path dir = model_dir, json_path, sp_path;
  if (std::filesystem::is_regular_file(model_dir)) {
    dir = model_dir.parent_path();
    (model_dir.extension() == ".json" ? json_path : sp_path) = model_dir;
  } else {
    PAGODA_REQUIRE(std::filesystem::is_directory(model_dir), kInvalidArgument,
                   "tokenizer: {} is neither a folder nor a file", model_dir.string());
    if (std::filesystem::exists(dir / "tokenizer.json")) {
      json_path = dir / "tokenizer.json";
    } else if (std::filesystem::exists(dir / "tokenizer.model")) {
      sp_path = dir / "tokenizer.model";
    } else {
      throw_error(ErrorCode::kInvalidArgument,
                  "tokenizer: {} has neither tokenizer.json nor tokenizer.model",
                  model_dir.string());
    }
  }
  const nlohmann::json config = read_config(dir.empty() ? std::filesystem::path(".") : dir);
  if (!json_path.empty()) {
    const HfTokenizerOptions options{.bos_token = token_field(config, "bos_token"),
                                     .eos_token = token_field(config, "eos_token"),
                                     .add_bos_token = bool_field(config, "add_bos_token"),
                                     .add_eos_token = bool_field(config, "add_eos_token")};
    return HfTokenizer::from_file(json_path, options);
  }
  const SentencePieceOptions options{
      .add_bos = bool_field(config, "add_bos_token").value_or(true),
      .add_eos = bool_field(config, "add_eos_token").value_or(false)};
  return std::make_unique<SentencePieceTokenizer>(sp_path, options);
}

bool has_tokenizer(const std::filesystem::path& model_dir) {
  namespace fs = std::filesystem;
  if (fs::is_regular_file(model_dir)) {
    const auto name = model_dir.filename();
    return name.extension() == ".json" || name.extension() == ".model";
  }
  return fs::exists(model_dir / "tokenizer.json") || fs::exists(model_dir / "tokenizer.model");
}

std::unique_ptr<Tokenizer> make_tokenizer_for(const std::string& model_spec) {
  if (model_spec == "builtin") return std::make_unique<ByteTokenizer>();
  return load_tokenizer(model_spec);
}

}  // namespace pagoda::tokenizer
