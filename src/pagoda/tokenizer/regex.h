#pragma once
/// Regex: a compiled PCRE2 pattern (UTF + UCP mode, JIT when the library has it) for the
/// tokenizer.json pre-tokenizer and normalizer patterns. The `tokenizers` package uses Oniguruma;
/// its GPT-2 / Llama-3 / Qwen2 patterns (\p{L}, \p{N}, (?i:...), \s+(?!\S)) mean the same in PCRE2.

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
  void* code_ = nullptr;  // pcre2_code_8*
};

/// `literal` with every regex metacharacter escaped (tokenizer.json {"String": ...} patterns).
std::string regex_escape(std::string_view literal);

}  // namespace pagoda::tokenizer
