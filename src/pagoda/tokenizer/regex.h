#pragma once
/// Regex: a compiled PCRE2 pattern (UTF + UCP mode, JIT when the library has it) for the
/// tokenizer.json pre-tokenizer and normalizer patterns. The `tokenizers` package uses Oniguruma;
/// its GPT-2 / Llama-3 / Qwen2 patterns (\p{L}, \p{N}, (?i:...), \s+(?!\S)) mean the same in
/// PCRE2 once \s, \S, \w and \W are given Oniguruma's Unicode meaning (translate_oniguruma).
/// Remaining differences: \W inside a character class keeps PCRE2's meaning, and the two
/// libraries may follow different Unicode versions for newly assigned characters.

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pagoda::tokenizer {

class Regex {
 public:
  /// Compiles `pattern`; a pattern PCRE2 rejects throws pagoda::Error naming it and the offset.
  explicit Regex(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  /// [begin, end) byte ranges of the successive non-overlapping, non-empty matches in `text`
  /// (valid UTF-8). Thread safe (match data is per call).
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

  /// The pattern as given.
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  std::string translated_;
  void* code_ = nullptr;  // pcre2_code_8*
};

/// `pattern` (Oniguruma syntax) with \s / \S as \p{White_Space} / \P{White_Space} and \w / \W as
/// [\p{L}\p{M}\p{N}\p{Pc}\x{200C}\x{200D}] and its complement (outside classes): Oniguruma's
/// Unicode meanings.
std::string translate_oniguruma(std::string_view pattern);

/// `literal` with every regex metacharacter escaped (tokenizer.json {"String": ...} patterns).
std::string regex_escape(std::string_view literal);

}  // namespace pagoda::tokenizer
