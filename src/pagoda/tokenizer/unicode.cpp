#include "pagoda/tokenizer/unicode.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include "pagoda/core/error.h"

namespace pagoda::tokenizer {

namespace {

/// Length of the valid UTF-8 sequence at s[i] (0 when invalid or truncated; -n when it is a
/// truncated but so far valid sequence of n bytes running into the end of `s`).
int valid_seq_at(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return 1;
  int n = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (int k = 1; k < n; ++k) {
    if (i + k >= s.size()) return -k;
    const auto b = static_cast<unsigned char>(s[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return 0;
  }
  return n;
}

std::string from_icu(const icu::UnicodeString& u) {
  std::string out;
  u.toUTF8String(out);
  return out;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const int n = valid_seq_at(s, i);
    if (n <= 0) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

size_t utf8_complete_prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const int n = valid_seq_at(s, i);
    if (n < 0) return i;
    i += n == 0 ? 1 : static_cast<size_t>(n);
  }
  return s.size();
}

size_t utf8_seq_len(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 1;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const int n = valid_seq_at(s, i);
    if (n > 0) {
      out.append(s.substr(i, static_cast<size_t>(n)));
      i += static_cast<size_t>(n);
      continue;
    }
    out.append("\xEF\xBF\xBD");
    // A maximal invalid subpart: a valid prefix of a sequence (truncated) counts as one.
    size_t skip = 1;
    if (n < 0) {
      skip = static_cast<size_t>(-n);
    } else {
      // Count the continuation bytes that were still valid before the failure.
      const size_t want = utf8_seq_len(static_cast<unsigned char>(s[i]));
      for (size_t k = 1; k < want && i + k < s.size(); ++k) {
        const std::string_view probe = s.substr(i, k + 1);
        const int m = valid_seq_at(probe, 0);
        if (m == 0) break;
        skip = k + 1;
      }
      if (want == 1) skip = 1;
    }
    i += skip;
  }
  return out;
}

char32_t next_cp(std::string_view s, size_t& i) {
  const int n = valid_seq_at(s, i);
  if (n <= 0) {
    ++i;
    return 0xFFFD;
  }
  const auto* p = reinterpret_cast<const unsigned char*>(s.data() + i);
  i += static_cast<size_t>(n);
  switch (n) {
    case 1: return p[0];
    case 2: return ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    case 3: return ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    default:
      return ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) |
             (p[3] & 0x3Fu);
  }
}

std::string normalize(std::string_view s, NormalForm form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case NormalForm::kNfc: n = icu::Normalizer2::getNFCInstance(status); break;
    case NormalForm::kNfd: n = icu::Normalizer2::getNFDInstance(status); break;
    case NormalForm::kNfkc: n = icu::Normalizer2::getNFKCInstance(status); break;
    case NormalForm::kNfkd: n = icu::Normalizer2::getNFKDInstance(status); break;
  }
  PAGODA_REQUIRE(U_SUCCESS(status) && n != nullptr, kInternal, "ICU normalizer: {}",
                 u_errorName(status));
  const icu::UnicodeString in = icu::UnicodeString::fromUTF8(
      icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
  const icu::UnicodeString out = n->normalize(in, status);
  PAGODA_REQUIRE(U_SUCCESS(status), kInternal, "ICU normalize: {}", u_errorName(status));
  return from_icu(out);
}

std::string to_lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
      ++i;
      continue;
    }
    const size_t b = i;
    next_cp(s, i);
    // One code point at a time: full mappings (İ -> i̇) but no context (Σ -> σ even at the end
    // of a word), which is what the `tokenizers` Lowercase normalizer does.
    icu::UnicodeString u = icu::UnicodeString::fromUTF8(
        icu::StringPiece(s.data() + b, static_cast<int32_t>(i - b)));
    u.toLower(icu::Locale::getRoot());
    u.toUTF8String(out);
  }
  return out;
}

ByteLevelTable::ByteLevelTable() {
  for (auto& v : cp_to_byte_) v = -1;
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
    append_utf8(byte_to_utf8_[b], cp);
    cp_to_byte_[cp] = static_cast<int16_t>(b);
  }
}

const ByteLevelTable& ByteLevelTable::get() {
  static const ByteLevelTable table;
  return table;
}

std::string ByteLevelTable::encode(std::string_view s) const {
  std::string out;
  out.reserve(s.size() * 2);
  for (char c : s) out += byte_to_utf8_[static_cast<unsigned char>(c)];
  return out;
}

}  // namespace pagoda::tokenizer
