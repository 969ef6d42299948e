#pragma once
/// AddedVocab: tokenizer.json "added_tokens", found in the text before anything else (leftmost,
/// longest first), honouring lstrip / rstrip (white space next to the token is absorbed) and
/// single_word (no match next to a word character). Tokens with normalized=false are found in the
/// raw text, the others in the normalised text of the pieces in between.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace pagoda::tokenizer {

/// One entry of "added_tokens".
struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

/// A piece of text after splitting: either an added token (id >= 0) or text to tokenize.
struct TextSegment {
  std::string text;
  int32_t id = -1;
  size_t offset = 0;  ///< byte offset of the segment in the string that was split
};

class AddedVocab {
 public:
  AddedVocab() = default;
  /// From the "added_tokens" array. Throws pagoda::Error on a malformed entry.
  explicit AddedVocab(const nlohmann::json& added_tokens);

  /// Splits `text` around the tokens with normalized == `normalized_set`. Never returns empty
  /// text segments.
  std::vector<TextSegment> split(std::string_view text, bool normalized_set) const;

  /// The added token with id `id`, or nullptr.
  const AddedToken* by_id(int32_t id) const;
  /// The id of the added token spelled `content`, or nothing.
  std::optional<int32_t> by_content(std::string_view content) const;
  /// max id + 1 (0 when empty).
  int32_t id_bound() const { return id_bound_; }
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, size_t> by_id_;
  std::unordered_map<std::string, size_t> by_content_;
  /// Per first byte and set (normalized or not), indices into tokens_, longest first.
  std::vector<size_t> first_byte_[2][256];
  int32_t id_bound_ = 0;
};

}  // namespace pagoda::tokenizer
