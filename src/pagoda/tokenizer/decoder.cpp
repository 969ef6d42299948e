#include "pagoda/tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/tokenizer/json_util.h"
#include "pagoda/tokenizer/unicode.h"

namespace pagoda::tokenizer {

namespace {

/// Code points of a token from the ByteLevel alphabet back to bytes; a token with a character
/// outside the alphabet keeps its UTF-8 bytes. The result is one lossily decoded string.
class ByteLevelDecoder final : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    const ByteLevelTable& table = ByteLevelTable::get();
    std::string bytes;
    for (const auto& t : tokens) {
      std::string mapped;
      bool all = true;
      for (size_t i = 0; i < t.size() && all;) {
        const int b = table.decode_cp(next_cp(t, i));
        if (b < 0) {
          all = false;
        } else {
          mapped.push_back(static_cast<char>(b));
        }
      }
      bytes += all ? mapped : t;
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
};

/// The replacement character becomes a space; on the first token it is dropped (unless the
/// prepend scheme is "never").
class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool drop_first)
      : replacement_(std::move(replacement)), drop_first_(drop_first) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      const std::string& t = tokens[k];
      std::string out;
      for (size_t i = 0; i < t.size();) {
        if (t.compare(i, replacement_.size(), replacement_) == 0) {
          if (!(k == 0 && drop_first_)) out.push_back(' ');
          i += replacement_.size();
        } else {
          out.push_back(t[i++]);
        }
      }
      tokens[k] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool drop_first_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::string pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      std::string out;
      size_t last = 0;
      for (size_t i = t.find(pattern_); i != std::string::npos; i = t.find(pattern_, last)) {
        out.append(t, last, i - last);
        out += content_;
        last = i + pattern_.size();
      }
      out.append(t, last);
      t = std::move(out);
    }
  }

 private:
  std::string pattern_;
  std::string content_;
};

/// Runs of <0xNN> tokens become their bytes when those are valid UTF-8, else one U+FFFD each.
class ByteFallbackDecoder final : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string run;
    size_t run_len = 0;
    auto flush = [&] {
      if (run_len == 0) return;
      if (is_valid_utf8(run)) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run_len; ++i) out.emplace_back(kReplacementChar);
      }
      run.clear();
      run_len = 0;
    };
    for (auto& t : tokens) {
      int byte = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
        const auto hex = [](char c) {
          if (c >= '0' && c <= '9') return c - '0';
          if (c >= 'A' && c <= 'F') return c - 'A' + 10;
          if (c >= 'a' && c <= 'f') return c - 'a' + 10;
          return -1;
        };
        const int hi = hex(t[3]), lo = hex(t[4]);
        if (hi >= 0 && lo >= 0) byte = hi * 16 + lo;
      }
      if (byte >= 0) {
        run.push_back(static_cast<char>(byte));
        ++run_len;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

/// Removes up to `start` leading and `stop` trailing copies of `content` from every token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      size_t b = 0, e = t.size();
      for (size_t k = 0; k < start_ && t.compare(b, content_.size(), content_) == 0 && b < e; ++k)
        b += content_.size();
      for (size_t k = 0; k < stop_ && e >= b + content_.size() &&
                         t.compare(e - content_.size(), content_.size(), content_) == 0;
           ++k)
        e -= content_.size();
      t = t.substr(b, e - b);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->apply(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = json_string(j, "type", "decoder");
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    bool drop_first = j.value("add_prefix_space", true);
    if (j.contains("prepend_scheme") && j.at("prepend_scheme").is_string())
      drop_first = j.at("prepend_scheme").get<std::string>() != "never";
    return std::make_unique<MetaspaceDecoder>(json_string(j, "replacement", "decoder.Metaspace"),
                                              drop_first);
  }
  if (type == "Replace") {
    const auto& pat = j.at("pattern");
    PAGODA_REQUIRE(pat.contains("String"), kUnsupported,
                   "tokenizer.json: decoder.Replace with a Regex pattern is not supported");
    return std::make_unique<ReplaceDecoder>(pat.at("String").get<std::string>(),
                                            json_string(j, "content", "decoder.Replace"));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    return std::make_unique<StripDecoder>(json_string(j, "content", "decoder.Strip"),
                                          j.value("start", size_t{0}), j.value("stop", size_t{0}));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const auto& d : j.at("decoders")) {
      auto p = make_decoder(d);
      if (p) parts.push_back(std::move(p));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  throw_error(ErrorCode::kUnsupported,
              "tokenizer.json: decoder type '{}' is not supported (supported: ByteLevel, "
              "Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence)",
              type);
}

}  // namespace pagoda::tokenizer
