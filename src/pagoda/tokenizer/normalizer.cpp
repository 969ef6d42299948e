#include "pagoda/tokenizer/normalizer.h"

#include <vector>

#include <nlohmann/json.hpp>
#include <unicode/uchar.h>

#include "pagoda/core/error.h"
#include "pagoda/tokenizer/json_util.h"
#include "pagoda/tokenizer/regex.h"
#include "pagoda/tokenizer/unicode.h"

namespace pagoda::tokenizer {

namespace {

class FormNormalizer final : public Normalizer {
 public:
  explicit FormNormalizer(NormalForm form) : form_(form) {}
  std::string apply(std::string_view text) const override { return normalize(text, form_); }

 private:
  NormalForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  std::string apply(std::string_view text) const override { return to_lower(text); }
};

/// Drops combining marks (general categories Mn, Mc, Me), as `tokenizers`' StripAccents does.
class StripAccentsNormalizer final : public Normalizer {
 public:
  std::string apply(std::string_view text) const override {
    std::string out;
    for (size_t i = 0; i < text.size();) {
      const size_t b = i;
      const char32_t cp = next_cp(text, i);
      const int type = u_charType(static_cast<UChar32>(cp));
      if (type != U_NON_SPACING_MARK && type != U_COMBINING_SPACING_MARK &&
          type != U_ENCLOSING_MARK) {
        out.append(text.substr(b, i - b));
      }
    }
    return out;
  }
};

/// Strips Unicode white space on the left and/or right.
class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string apply(std::string_view text) const override {
    size_t b = 0, e = text.size();
    if (left_) {
      while (b < e) {
        size_t i = b;
        if (!u_isUWhiteSpace(static_cast<UChar32>(next_cp(text, i)))) break;
        b = i;
      }
    }
    if (right_) {
      while (e > b) {
        size_t s = e - 1;
        while (s > b && (static_cast<unsigned char>(text[s]) & 0xC0) == 0x80) --s;
        size_t i = s;
        if (!u_isUWhiteSpace(static_cast<UChar32>(next_cp(text, i)))) break;
        e = s;
      }
    }
    return std::string(text.substr(b, e - b));
  }

 private:
  bool left_, right_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string apply(std::string_view text) const override {
    if (text.empty()) return {};
    return prefix_ + std::string(text);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(const std::string& pattern, std::string content)
      : regex_(pattern), content_(std::move(content)) {}
  std::string apply(std::string_view text) const override {
    std::string out;
    size_t last = 0;
    for (const auto& [b, e] : regex_.find_all(text)) {
      out.append(text.substr(last, b - last));
      out += content_;
      last = e;
    }
    out.append(text.substr(last));
    return out;
  }

 private:
  Regex regex_;
  std::string content_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  std::string apply(std::string_view text) const override {
    std::string s(text);
    for (const auto& p : parts_) s = p->apply(s);
    return s;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = json_string(j, "type", "normalizer");
  if (type == "NFC") return std::make_unique<FormNormalizer>(NormalForm::kNfc);
  if (type == "NFD") return std::make_unique<FormNormalizer>(NormalForm::kNfd);
  if (type == "NFKC") return std::make_unique<FormNormalizer>(NormalForm::kNfkc);
  if (type == "NFKD") return std::make_unique<FormNormalizer>(NormalForm::kNfkd);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(j.value("strip_left", true),
                                             j.value("strip_right", true));
  }
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(json_string(j, "prepend", "normalizer.Prepend"));
  if (type == "Replace") {
    return std::make_unique<ReplaceNormalizer>(json_pattern(j, "normalizer.Replace"),
                                               json_string(j, "content", "normalizer.Replace"));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const auto& n : j.at("normalizers")) {
      auto p = make_normalizer(n);
      if (p) parts.push_back(std::move(p));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  throw_error(ErrorCode::kUnsupported,
              "tokenizer.json: normalizer type '{}' is not supported (supported: NFC, NFD, NFKC, "
              "NFKD, Lowercase, StripAccents, Strip, Prepend, Replace, Sequence)",
              type);
}

}  // namespace pagoda::tokenizer
