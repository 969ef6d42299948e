#include "pagoda/tokenizer/pre_tokenizer.h"

#include <functional>
#include <utility>

#include <nlohmann/json.hpp>
#include <unicode/uchar.h>

#include "pagoda/core/error.h"
#include "pagoda/tokenizer/json_util.h"
#include "pagoda/tokenizer/regex.h"
#include "pagoda/tokenizer/unicode.h"

namespace pagoda::tokenizer {

namespace {

/// How the matched parts of a split are kept (tokenizers' SplitDelimiterBehavior).
enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const std::string& s) {
  if (s == "Removed") return Behavior::kRemoved;
  if (s == "Isolated") return Behavior::kIsolated;
  if (s == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::kMergedWithNext;
  if (s == "Contiguous") return Behavior::kContiguous;
  throw_error(ErrorCode::kUnsupported, "tokenizer.json: pre_tokenizer behavior '{}' is unknown", s);
}

struct Segment {
  size_t begin, end;
  bool is_match;
};

/// Matches of one piece as segments covering [0, size): the gaps are non-match segments.
using Matcher = std::function<std::vector<std::pair<size_t, size_t>>(std::string_view)>;

std::vector<Segment> segments_of(std::string_view text, const Matcher& match, bool invert) {
  std::vector<Segment> segs;
  size_t last = 0;
  for (const auto& [b, e] : match(text)) {
    if (b > last) segs.push_back({last, b, invert});
    segs.push_back({b, e, !invert});
    last = e;
  }
  if (last < text.size()) segs.push_back({last, text.size(), invert});
  return segs;
}

/// Applies `behavior` to the segments (tokenizers' NormalizedString::split semantics).
std::vector<std::pair<size_t, size_t>> apply_behavior(const std::vector<Segment>& segs,
                                                      Behavior behavior) {
  std::vector<std::pair<size_t, size_t>> out;
  switch (behavior) {
    case Behavior::kIsolated:
      for (const auto& s : segs) out.emplace_back(s.begin, s.end);
      break;
    case Behavior::kRemoved:
      for (const auto& s : segs)
        if (!s.is_match) out.emplace_back(s.begin, s.end);
      break;
    case Behavior::kContiguous: {
      bool prev_match = false;
      for (const auto& s : segs) {
        if (s.is_match && prev_match && !out.empty()) {
          out.back().second = s.end;
        } else {
          out.emplace_back(s.begin, s.end);
        }
        prev_match = s.is_match;
      }
      break;
    }
    case Behavior::kMergedWithPrevious: {
      bool prev_match = false;
      for (const auto& s : segs) {
        if (s.is_match && !prev_match && !out.empty()) {
          out.back().second = s.end;
        } else {
          out.emplace_back(s.begin, s.end);
        }
        prev_match = s.is_match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool prev_match = false;
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->is_match && !prev_match && !out.empty()) {
          out.back().first = it->begin;
        } else {
          out.emplace_back(it->begin, it->end);
        }
        prev_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
  }
  return out;
}

void split_pieces(std::vector<Piece>& pieces, const Matcher& match, bool invert,
                  Behavior behavior) {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (auto& p : pieces) {
    const auto ranges = apply_behavior(segments_of(p.text, match, invert), behavior);
    for (const auto& [b, e] : ranges) {
      if (e > b) out.push_back({p.text.substr(b, e - b), p.at_start && b == 0});
    }
  }
  pieces = std::move(out);
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(const std::string& pattern, Behavior behavior, bool invert)
      : regex_(pattern), behavior_(behavior), invert_(invert) {}
  void apply(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [this](std::string_view t) { return regex_.find_all(t); }, invert_,
                 behavior_);
  }

 private:
  Regex regex_;
  Behavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space) {
    if (use_regex) regex_ = std::make_unique<Regex>(kGpt2Pattern);
  }
  void apply(std::vector<Piece>& pieces) const override {
    if (add_prefix_space_) {
      for (auto& p : pieces)
        if (!p.text.empty() && p.text[0] != ' ') p.text = " " + p.text;
    }
    if (regex_) {
      split_pieces(pieces, [this](std::string_view t) { return regex_->find_all(t); }, false,
                   Behavior::kIsolated);
    }
    const ByteLevelTable& table = ByteLevelTable::get();
    for (auto& p : pieces) p.text = table.encode(p.text);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void apply(std::vector<Piece>& pieces) const override {
    for (auto& p : pieces) {
      std::string s;
      for (char c : p.text) {
        if (c == ' ') {
          s += replacement_;
        } else {
          s.push_back(c);
        }
      }
      const bool starts = s.rfind(replacement_, 0) == 0;
      if (!starts && (scheme_ == PrependScheme::kAlways ||
                      (scheme_ == PrependScheme::kFirst && p.at_start))) {
        s = replacement_ + s;
      }
      p.text = std::move(s);
    }
    if (!split_) return;
    const std::string rep = replacement_;
    split_pieces(pieces,
                 [rep](std::string_view t) {
                   std::vector<std::pair<size_t, size_t>> m;
                   for (size_t i = t.find(rep); i != std::string_view::npos; i = t.find(rep, i + rep.size()))
                     m.emplace_back(i, i + rep.size());
                   return m;
                 },
                 false, Behavior::kMergedWithNext);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

/// Digits: numeric characters (Unicode N*, like Rust's char::is_numeric) isolated, one by one
/// or as runs.
class DigitsPreTokenizer final : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual) : individual_(individual) {}
  void apply(std::vector<Piece>& pieces) const override {
    split_pieces(pieces,
                 [](std::string_view t) {
                   std::vector<std::pair<size_t, size_t>> m;
                   for (size_t i = 0; i < t.size();) {
                     const size_t b = i;
                     const int type = u_charType(static_cast<UChar32>(next_cp(t, i)));
                     if (type == U_DECIMAL_DIGIT_NUMBER || type == U_LETTER_NUMBER ||
                         type == U_OTHER_NUMBER)
                       m.emplace_back(b, i);
                   }
                   return m;
                 },
                 false, individual_ ? Behavior::kIsolated : Behavior::kContiguous);
  }

 private:
  bool individual_;
};

/// Whitespace (`\w+|[^\w\s]+` kept) and WhitespaceSplit (white space removed).
class WhitespacePreTokenizer final : public PreTokenizer {
 public:
  explicit WhitespacePreTokenizer(bool split_only)
      : regex_(split_only ? R"(\s+)" : R"(\w+|[^\w\s]+)"), split_only_(split_only) {}
  void apply(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [this](std::string_view t) { return regex_.find_all(t); }, !split_only_,
                 Behavior::kRemoved);
  }

 private:
  Regex regex_;
  bool split_only_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void apply(std::vector<Piece>& pieces) const override {
    for (const auto& p : parts_) p->apply(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

PrependScheme parse_prepend_scheme(const nlohmann::json& j) {
  if (j.contains("prepend_scheme") && j.at("prepend_scheme").is_string()) {
    const std::string s = j.at("prepend_scheme").get<std::string>();
    if (s == "always") return PrependScheme::kAlways;
    if (s == "first") return PrependScheme::kFirst;
    if (s == "never") return PrependScheme::kNever;
    throw_error(ErrorCode::kUnsupported, "tokenizer.json: Metaspace.prepend_scheme '{}' unknown",
                s);
  }
  return j.value("add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = json_string(j, "type", "pre_tokenizer");
  if (type == "Split") {
    return std::make_unique<SplitPreTokenizer>(
        json_pattern(j, "pre_tokenizer.Split"),
        parse_behavior(json_string(j, "behavior", "pre_tokenizer.Split")),
        j.value("invert", false));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(j.value("add_prefix_space", true),
                                                   j.value("use_regex", true));
  }
  if (type == "Metaspace") {
    return std::make_unique<MetaspacePreTokenizer>(
        json_string(j, "replacement", "pre_tokenizer.Metaspace"), parse_prepend_scheme(j),
        j.value("split", true));
  }
  if (type == "Digits") return std::make_unique<DigitsPreTokenizer>(j.value("individual_digits", false));
  if (type == "Whitespace") return std::make_unique<WhitespacePreTokenizer>(false);
  if (type == "WhitespaceSplit") return std::make_unique<WhitespacePreTokenizer>(true);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const auto& p : j.at("pretokenizers")) {
      auto part = make_pre_tokenizer(p);
      if (part) parts.push_back(std::move(part));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  throw_error(ErrorCode::kUnsupported,
              "tokenizer.json: pre_tokenizer type '{}' is not supported (supported: Split, "
              "ByteLevel, Metaspace, Digits, Whitespace, WhitespaceSplit, Sequence)",
              type);
}

}  // namespace pagoda::tokenizer
