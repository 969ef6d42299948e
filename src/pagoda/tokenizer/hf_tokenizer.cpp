#include "pagoda/tokenizer/hf_tokenizer.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/tokenizer/json_util.h"
#include "pagoda/tokenizer/unicode.h"

namespace pagoda::tokenizer {

namespace {

/// Ids a post_processor adds around a single sequence.
struct Wrap {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
};

std::vector<int32_t> special_ids_of(const nlohmann::json& specials, const std::string& name) {
  PAGODA_REQUIRE(specials.contains(name), kInvalidArgument,
                 "tokenizer.json: post_processor.special_tokens has no '{}'", name);
  return specials.at(name).at("ids").get<std::vector<int32_t>>();
}

/// The special-token id of a ["[CLS]", 101]-style pair.
int32_t pair_id(const nlohmann::json& j, std::string_view where) {
  PAGODA_REQUIRE(j.is_array() && j.size() == 2, kInvalidArgument,
                 "tokenizer.json: post_processor.{} malformed", where);
  return json_token_id(j[1], fmt::format("post_processor.{}", where));
}

void add_post_processor(const nlohmann::json& j, Wrap& wrap) {
  if (j.is_null()) return;
  const std::string type = json_string(j, "type", "post_processor");
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    for (const auto& p : j.at("processors")) add_post_processor(p, wrap);
    return;
  }
  if (type == "TemplateProcessing") {
    const auto& specials = j.at("special_tokens");
    bool seen_sequence = false;
    for (const auto& item : j.at("single")) {
      if (item.contains("Sequence")) {
        PAGODA_REQUIRE(!seen_sequence, kUnsupported,
                       "tokenizer.json: post_processor.single with two sequences");
        seen_sequence = true;
      } else if (item.contains("SpecialToken")) {
        const auto ids = special_ids_of(specials, item.at("SpecialToken").at("id").get<std::string>());
        auto& dst = seen_sequence ? wrap.suffix : wrap.prefix;
        dst.insert(dst.end(), ids.begin(), ids.end());
      } else {
        throw_error(ErrorCode::kUnsupported, "tokenizer.json: post_processor.single item {}",
                    item.dump());
      }
    }
    return;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    wrap.prefix.push_back(pair_id(j.at("cls"), "cls"));
    wrap.suffix.insert(wrap.suffix.begin(), pair_id(j.at("sep"), "sep"));
    return;
  }
  throw_error(ErrorCode::kUnsupported,
              "tokenizer.json: post_processor type '{}' is not supported (supported: "
              "TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence)",
              type);
}

}  // namespace

HfTokenizer::HfTokenizer(const nlohmann::json& tj, const HfTokenizerOptions& options)
    : model_(tj.at("model")), added_(tj.value("added_tokens", nlohmann::json::array())) {
  PAGODA_REQUIRE(!tj.contains("truncation") || tj.at("truncation").is_null(), kUnsupported,
                 "tokenizer.json: truncation is not supported (set it to null)");
  PAGODA_REQUIRE(!tj.contains("padding") || tj.at("padding").is_null(), kUnsupported,
                 "tokenizer.json: padding is not supported (set it to null)");
  normalizer_ = make_normalizer(tj.value("normalizer", nlohmann::json()));
  pre_tokenizer_ = make_pre_tokenizer(tj.value("pre_tokenizer", nlohmann::json()));
  decoder_ = make_decoder(tj.value("decoder", nlohmann::json()));

  auto resolve = [this](const std::optional<std::string>& tok, const char* what) {
    if (!tok) return -1;
    const auto id = token_to_id(*tok);
    PAGODA_REQUIRE(id.has_value(), kInvalidArgument,
                   "tokenizer_config.json: {} '{}' is not in the vocabulary", what, *tok);
    return *id;
  };
  bos_id_ = resolve(options.bos_token, "bos_token");
  eos_id_ = resolve(options.eos_token, "eos_token");

  Wrap wrap;
  add_post_processor(tj.value("post_processor", nlohmann::json()), wrap);
  if (options.add_bos_token.has_value() || options.add_eos_token.has_value()) {
    wrap = {};
    if (options.add_bos_token.value_or(false) && bos_id_ >= 0) wrap.prefix.push_back(bos_id_);
    if (options.add_eos_token.value_or(false) && eos_id_ >= 0) wrap.suffix.push_back(eos_id_);
  }
  prefix_ids_ = std::move(wrap.prefix);
  suffix_ids_ = std::move(wrap.suffix);
  // Without tokenizer_config.json, a single special token the template prepends is the BOS.
  if (bos_id_ < 0 && prefix_ids_.size() == 1) bos_id_ = prefix_ids_[0];
}

std::unique_ptr<HfTokenizer> HfTokenizer::from_file(const std::filesystem::path& path,
                                                    const HfTokenizerOptions& options) {
  std::ifstream in(path);
  PAGODA_REQUIRE(in.good(), kInvalidArgument, "cannot open {}", path.string());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw_error(ErrorCode::kInvalidArgument, "{}: {}", path.string(), e.what());
  }
  try {
    return std::make_unique<HfTokenizer>(j, options);
  } catch (const nlohmann::json::exception& e) {
    throw_error(ErrorCode::kInvalidArgument, "{}: malformed tokenizer.json: {}", path.string(),
                e.what());
  }
}

void HfTokenizer::encode_text(std::string_view text, bool at_start,
                              std::vector<int32_t>& out) const {
  const std::string normalized = normalizer_ ? normalizer_->apply(text) : std::string(text);
  for (const TextSegment& seg : added_.split(normalized, true)) {
    if (seg.id >= 0) {
      out.push_back(seg.id);
      continue;
    }
    std::vector<Piece> pieces{{seg.text, at_start && seg.offset == 0}};
    if (pre_tokenizer_) pre_tokenizer_->apply(pieces);
    for (const Piece& p : pieces) model_.tokenize(p.text, out);
  }
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  PAGODA_REQUIRE(is_valid_utf8(text), kInvalidArgument, "tokenizer: input is not valid UTF-8");
  std::vector<int32_t> out;
  if (add_special_tokens) out = prefix_ids_;
  for (const TextSegment& seg : added_.split(text, false)) {
    if (seg.id >= 0) {
      out.push_back(seg.id);
    } else {
      encode_text(seg.text, seg.offset == 0, out);
    }
  }
  if (add_special_tokens) out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
  return out;
}

std::optional<std::string> HfTokenizer::id_to_token(int32_t id) const {
  if (const AddedToken* a = added_.by_id(id)) return a->content;
  if (const std::string* s = model_.id_to_token(id)) return *s;
  return std::nullopt;
}

std::string HfTokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (skip_special_tokens && is_special(id)) continue;
    // Ids outside the vocabulary are left out, as `tokenizers` does (a model's embedding table
    // is often padded past the tokenizer's vocabulary).
    if (auto t = id_to_token(id)) tokens.push_back(std::move(*t));
  }
  std::string out;
  if (!decoder_) {
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  decoder_->apply(tokens);
  for (const auto& t : tokens) out += t;
  return utf8_lossy(out);
}

int32_t HfTokenizer::vocab_size() const { return std::max(model_.size(), added_.id_bound()); }

std::optional<int32_t> HfTokenizer::token_to_id(std::string_view token) const {
  if (auto id = added_.by_content(token)) return id;
  return model_.token_to_id(token);
}

bool HfTokenizer::is_special(int32_t id) const {
  const AddedToken* a = added_.by_id(id);
  return a != nullptr && a->special;
}

}  // namespace pagoda::tokenizer
