#pragma once
/// Finding the tokenizer of a model folder.

#include <filesystem>
#include <memory>
#include <string>

#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda::tokenizer {

/// The tokenizer of a Hugging Face model folder: tokenizer.json when present (HfTokenizer), else
/// tokenizer.model (SentencePieceTokenizer), else pagoda::Error. tokenizer_config.json, when
/// present, gives bos_token / eos_token / add_bos_token / add_eos_token. `model_dir` may also
/// name a tokenizer.json or tokenizer.model file directly.
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& model_dir);

/// Whether `model_dir` has a tokenizer load_tokenizer can load (tokenizer.json or
/// tokenizer.model, or is one of those files).
bool has_tokenizer(const std::filesystem::path& model_dir);

/// The tokenizer for a `--model` value: "builtin" is the built-in model's ByteTokenizer (bytes
/// 0..255, BOS 256, EOS 257); anything else is load_tokenizer(spec).
std::unique_ptr<Tokenizer> make_tokenizer_for(const std::string& model_spec);

}  // namespace pagoda::tokenizer
