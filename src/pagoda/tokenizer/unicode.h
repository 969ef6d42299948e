#pragma once
/// UTF-8 helpers and Unicode normalisation for the tokenizers.
///
/// Normalisation (NFC, NFD, NFKC, NFKD) and lower-casing come from ICU (Debian's libicu-dev,
/// pkg-config icu-uc), not from hand-written tables: ICU is the reference implementation of the
/// Unicode algorithms, is already on every Debian machine (libicu72 is pulled in by many packages),
/// follows the Unicode version of the distribution and gives full case mappings (İ -> i̇) through
/// the root locale, as the `tokenizers` package's per-character Rust `to_lowercase` does.
/// utf8proc would also do, but its lower-casing is simple (one code point to one), not full.

#include <cstdint>
#include <string>
#include <string_view>

namespace pagoda::tokenizer {

/// U+FFFD REPLACEMENT CHARACTER in UTF-8: what undecodable bytes become.
inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

/// Whether `s` is well-formed UTF-8 (no surrogates, no overlongs, at most U+10FFFF).
bool is_valid_utf8(std::string_view s);

/// Length of the longest prefix of `s` that does not end inside an incomplete (truncated but so
/// far valid) UTF-8 sequence. Invalid bytes count as complete (they will never complete).
size_t utf8_complete_prefix(std::string_view s);

/// Length in bytes of the UTF-8 sequence starting with lead byte `c` (1 for invalid leads).
size_t utf8_seq_len(unsigned char c);

/// Appends the UTF-8 encoding of code point `cp` to `out`.
void append_utf8(std::string& out, char32_t cp);

/// Replaces invalid UTF-8 in `s` by U+FFFD (one per maximal invalid subpart, like Rust's
/// String::from_utf8_lossy).
std::string utf8_lossy(std::string_view s);

/// Unicode normalisation forms.
enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };

/// `s` in normal form `form` (ICU Normalizer2). `s` must be valid UTF-8.
std::string normalize(std::string_view s, NormalForm form);

/// Full Unicode lower-casing of each code point on its own (ICU, root locale; no Final_Sigma
/// context, like `tokenizers`' Lowercase). `s` must be valid UTF-8.
std::string to_lower(std::string_view s);

/// GPT-2's byte <-> printable character table used by the ByteLevel pre-tokenizer and decoder:
/// byte b maps to one code point (printable bytes to themselves, the others to U+0100 + k).
class ByteLevelTable {
 public:
  /// The process-wide table (immutable, thread safe).
  static const ByteLevelTable& get();
  /// UTF-8 of the code point byte `b` maps to.
  const std::string& encode_byte(unsigned char b) const { return byte_to_utf8_[b]; }
  /// `s` with every byte replaced by its code point.
  std::string encode(std::string_view s) const;
  /// The byte that code point `cp` stands for, or -1 when `cp` is not in the table.
  int decode_cp(char32_t cp) const { return cp < 324 ? cp_to_byte_[cp] : -1; }

 private:
  ByteLevelTable();
  std::string byte_to_utf8_[256];
  int16_t cp_to_byte_[324];
};

/// Decodes the code point at `s[i]` (valid UTF-8 assumed; invalid bytes yield U+FFFD, length 1)
/// and advances `i`.
char32_t next_cp(std::string_view s, size_t& i);

}  // namespace pagoda::tokenizer
