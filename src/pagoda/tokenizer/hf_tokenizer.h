#pragma once
/// HfTokenizer: a Hugging Face tokenizer.json with a BPE model, both the byte-level family
/// (GPT-2, Llama-3, Qwen2: Split regex + ByteLevel pre-tokenizer, ByteLevel decoder) and the
/// SentencePiece-style family (Llama-2, Mistral: Prepend/Replace normalizer or Metaspace,
/// byte_fallback with <0xNN> tokens). Pipeline, as in the `tokenizers` package: added tokens are
/// split out of the text; each remaining piece is normalised, pre-tokenised and tokenised by the
/// model; with add_special_tokens the post-processor adds BOS/EOS. See docs/design/tokenizer.md
/// for what is supported; everything else is a pagoda::Error at load time naming the field.

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "pagoda/tokenizer/added_vocab.h"
#include "pagoda/tokenizer/bpe_model.h"
#include "pagoda/tokenizer/decoder.h"
#include "pagoda/tokenizer/normalizer.h"
#include "pagoda/tokenizer/pre_tokenizer.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda::tokenizer {

/// Values from tokenizer_config.json that change how a tokenizer.json behaves.
struct HfTokenizerOptions {
  /// Spelling of the BOS / EOS tokens ("<s>", "<|begin_of_text|>"); looked up in the vocabulary.
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  /// When set, add_special_tokens adds exactly [BOS] text [EOS] as these say, instead of the
  /// tokenizer.json post_processor (what transformers' Llama tokenizers do with these fields).
  std::optional<bool> add_bos_token;
  std::optional<bool> add_eos_token;
};

class HfTokenizer final : public Tokenizer {
 public:
  /// From a parsed tokenizer.json. Throws pagoda::Error naming the field for anything
  /// unsupported or inconsistent; a missing member or a member of the wrong JSON type throws
  /// nlohmann::json::exception (from_file turns that into a pagoda::Error too).
  explicit HfTokenizer(const nlohmann::json& tokenizer_json, const HfTokenizerOptions& options = {});
  /// Reads and parses `path` (tokenizer.json) first.
  static std::unique_ptr<HfTokenizer> from_file(const std::filesystem::path& path,
                                                const HfTokenizerOptions& options = {});

  /// Throws pagoda::Error when `text` is not valid UTF-8.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  int32_t vocab_size() const override;
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  bool is_special(int32_t id) const override;
  std::string_view kind() const override { return "hf-bpe"; }

  /// Spelling of `id` (added tokens first, then the model's vocabulary), or nothing.
  std::optional<std::string> id_to_token(int32_t id) const;

 private:
  /// Appends the model ids of one non-added text segment (`at_start`: it begins the input).
  void encode_text(std::string_view text, bool at_start, std::vector<int32_t>& out) const;

  BpeModel model_;
  AddedVocab added_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<int32_t> prefix_ids_;  ///< added before the text by add_special_tokens
  std::vector<int32_t> suffix_ids_;  ///< added after it
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
};

}  // namespace pagoda::tokenizer
