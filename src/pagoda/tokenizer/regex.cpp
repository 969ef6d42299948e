#include "pagoda/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "pagoda/core/error.h"

namespace pagoda::tokenizer {

namespace {

pcre2_code* as_code(void* p) { return static_cast<pcre2_code*>(p); }

struct MatchData {
  explicit MatchData(const pcre2_code* code)
      : data(pcre2_match_data_create_from_pattern(code, nullptr)) {}
  ~MatchData() { pcre2_match_data_free(data); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
  pcre2_match_data* data;
};

}  // namespace

Regex::Regex(std::string_view pattern) : pattern_(pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(error, msg, sizeof(msg));
    throw_error(ErrorCode::kInvalidArgument, "tokenizer regex '{}' at offset {}: {}", pattern_,
                offset, reinterpret_cast<const char*>(msg));
  }
  // JIT is an optimisation: when the library was built without it, matching is interpreted.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(as_code(code_)); }

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  MatchData md(as_code(code_));
  PAGODA_REQUIRE(md.data != nullptr, kInternal, "pcre2_match_data_create failed");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    const int rc = pcre2_match(as_code(code_), subject, text.size(), start, PCRE2_NO_UTF_CHECK,
                               md.data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    PAGODA_REQUIRE(rc >= 0, kInternal, "pcre2_match of '{}' failed: {}", pattern_, rc);
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.data);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      start = e;
    } else {
      // Empty match: step over one code point.
      start = b + 1;
      while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80)
        ++start;
    }
  }
  return out;
}

std::string regex_escape(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}-/#").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

}  // namespace pagoda::tokenizer
