#pragma once
/// SentencePieceTokenizer: a SentencePiece tokenizer.model through Debian's libsentencepiece (the
/// library itself, not a re-implementation). Text is given to SentencePiece as is: control
/// tokens written in the text ("<s>") are not parsed as such (SentencePiece semantics);
/// user-defined symbols are. add_special_tokens adds BOS (and EOS) as tokenizer_config.json's
/// add_bos_token / add_eos_token say (defaults: BOS yes, EOS no, like Llama's tokenizer).

#include <filesystem>
#include <memory>

#include "pagoda/tokenizer/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace pagoda::tokenizer {

/// How add_special_tokens wraps the text of a SentencePiece tokenizer.
struct SentencePieceOptions {
  bool add_bos = true;
  bool add_eos = false;
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  /// Loads `model_path` (tokenizer.model). Throws pagoda::Error when SentencePiece rejects it.
  explicit SentencePieceTokenizer(const std::filesystem::path& model_path,
                                  const SentencePieceOptions& options = {});
  ~SentencePieceTokenizer() override;

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  int32_t vocab_size() const override;
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  int32_t bos_id() const override;
  int32_t eos_id() const override;
  bool is_special(int32_t id) const override;
  std::string_view kind() const override { return "sentencepiece"; }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  SentencePieceOptions options_;
};

}  // namespace pagoda::tokenizer
