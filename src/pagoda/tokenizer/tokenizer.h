#pragma once
/// Tokenizer: the text <-> token id contract every tokenizer of pagoda implements (the built-in
/// byte tokenizer, Hugging Face tokenizer.json BPE, SentencePiece tokenizer.model).
/// Contract (docs/design/tokenizer.md): encode/decode are const, thread safe and deterministic;
/// encode(text, add_special_tokens=true) gives the ids the `tokenizers` Python package gives for
/// `encode(text).ids`; anything a tokenizer file asks for that pagoda does not implement is a
/// pagoda::Error at load time, never a silently different tokenization.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pagoda::tokenizer {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// Token ids of `text` (any bytes; tokenizers that need UTF-8 throw pagoda::Error on invalid
  /// UTF-8). With `add_special_tokens` the tokenizer's post-processing (BOS, template) is applied.
  /// Special tokens written inside `text` (e.g. "<|begin_of_text|>") become their ids either way.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const = 0;

  /// Text of `ids` (bytes; may end in an incomplete UTF-8 sequence only for the byte tokenizer,
  /// the others replace invalid bytes by U+FFFD like the Python packages). Ids outside the
  /// vocabulary are left out, as `tokenizers` does (model vocabularies are often padded past the
  /// tokenizer's); a negative id throws pagoda::Error in the byte tokenizer. With
  /// `skip_special_tokens` special/control ids are left out too.
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const = 0;

  /// Number of ids, added tokens included (ids are in [0, vocab_size())).
  virtual int32_t vocab_size() const = 0;

  /// Id of the token spelled exactly `token` (vocabulary spelling, e.g. "Ġthe" or "▁the"), or
  /// nothing.
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;

  /// Beginning / end of sequence ids, -1 when the tokenizer has none.
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;

  /// Whether `id` is a special (control) token, which decode skips on request.
  virtual bool is_special(int32_t id) const = 0;

  /// Short description for logs: "byte", "hf-bpe", "sentencepiece".
  virtual std::string_view kind() const = 0;
};

}  // namespace pagoda::tokenizer
