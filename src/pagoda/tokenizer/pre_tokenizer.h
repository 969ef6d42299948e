#pragma once
/// PreTokenizer: the tokenizer.json "pre_tokenizer" stage, which cuts normalised text into the
/// words the model tokenizes one by one. Supported types: Split (String or Regex pattern, every
/// behavior, invert), ByteLevel (add_prefix_space, use_regex with the GPT-2 pattern), Metaspace
/// (replacement, prepend_scheme always/first/never or legacy add_prefix_space, split), Digits,
/// Whitespace, WhitespaceSplit and Sequence; null means the whole piece is one word. Any other
/// type throws pagoda::Error naming it.

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace pagoda::tokenizer {

/// One piece of text on its way through the pre-tokenizers.
struct Piece {
  std::string text;
  /// Whether the piece starts at offset 0 of the original input (Metaspace prepend "first").
  bool at_start = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  /// Replaces `pieces` by their split (and possibly rewritten) pieces, in order; empty pieces are
  /// dropped. Const and thread safe.
  virtual void apply(std::vector<Piece>& pieces) const = 0;
};

/// The pre-tokenizer described by `j` (tokenizer.json "pre_tokenizer"); nullptr for JSON null.
/// Throws pagoda::Error naming the field for anything unsupported.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j);

/// The GPT-2 pre-tokenization pattern ByteLevel uses when use_regex is true.
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace pagoda::tokenizer
