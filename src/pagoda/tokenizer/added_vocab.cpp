#include "pagoda/tokenizer/added_vocab.h"

#include <algorithm>

#include <nlohmann/json.hpp>
#include <unicode/uchar.h>

#include "pagoda/core/error.h"
#include "pagoda/tokenizer/json_util.h"
#include "pagoda/tokenizer/unicode.h"

namespace pagoda::tokenizer {

namespace {

bool is_word_cp(char32_t c) { return c == '_' || u_isalnum(static_cast<UChar32>(c)); }

bool is_space_cp(char32_t c) { return u_isUWhiteSpace(static_cast<UChar32>(c)); }

/// Start of the code point that ends just before `pos`.
size_t prev_cp_start(std::string_view s, size_t pos) {
  size_t i = pos - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

}  // namespace

AddedVocab::AddedVocab(const nlohmann::json& added_tokens) {
  if (added_tokens.is_null()) return;
  PAGODA_REQUIRE(added_tokens.is_array(), kInvalidArgument,
                 "tokenizer.json: added_tokens is not an array");
  for (const auto& t : added_tokens) {
    AddedToken a;
    a.id = json_token_id(t.at("id"), "added_tokens[].id");
    a.content = t.at("content").get<std::string>();
    a.special = t.value("special", false);
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.single_word = t.value("single_word", false);
    a.normalized = t.value("normalized", !a.special);
    PAGODA_REQUIRE(a.id >= 0 && !a.content.empty(), kInvalidArgument,
                   "tokenizer.json: added_tokens entry '{}' id {} is invalid", a.content, a.id);
    id_bound_ = std::max(id_bound_, a.id + 1);
    by_id_[a.id] = tokens_.size();
    by_content_[a.content] = tokens_.size();
    tokens_.push_back(std::move(a));
  }
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const auto& t = tokens_[i];
    first_byte_[t.normalized ? 1 : 0][static_cast<unsigned char>(t.content[0])].push_back(i);
  }
  for (auto& set : first_byte_) {
    for (auto& list : set) {
      std::stable_sort(list.begin(), list.end(), [this](size_t a, size_t b) {
        return tokens_[a].content.size() > tokens_[b].content.size();
      });
    }
  }
}

const AddedToken* AddedVocab::by_id(int32_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocab::by_content(std::string_view content) const {
  const auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return tokens_[it->second].id;
}

std::vector<TextSegment> AddedVocab::split(std::string_view text, bool normalized_set) const {
  std::vector<TextSegment> out;
  const auto& index = first_byte_[normalized_set ? 1 : 0];
  size_t done = 0;  // text[0, done) is already emitted
  size_t i = 0;
  while (i < text.size()) {
    const auto& cands = index[static_cast<unsigned char>(text[i])];
    const AddedToken* hit = nullptr;
    for (size_t k : cands) {
      const AddedToken& t = tokens_[k];
      if (text.compare(i, t.content.size(), t.content) != 0) continue;
      if (t.single_word) {
        const size_t e = i + t.content.size();
        size_t p = i > 0 ? prev_cp_start(text, i) : 0;
        if (i > 0 && is_word_cp(next_cp(text, p))) continue;
        size_t q = e;
        if (e < text.size() && is_word_cp(next_cp(text, q))) continue;
      }
      hit = &t;
      break;
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    size_t b = i, e = i + hit->content.size();
    if (hit->lstrip) {
      while (b > done) {
        const size_t p = prev_cp_start(text, b);
        size_t q = p;
        if (!is_space_cp(next_cp(text, q))) break;
        b = p;
      }
    }
    if (hit->rstrip) {
      while (e < text.size()) {
        size_t q = e;
        if (!is_space_cp(next_cp(text, q))) break;
        e = q;
      }
    }
    if (b > done) out.push_back({std::string(text.substr(done, b - done)), -1, done});
    out.push_back({hit->content, hit->id, b});
    done = e;
    i = e;
  }
  if (done < text.size()) out.push_back({std::string(text.substr(done)), -1, done});
  return out;
}

}  // namespace pagoda::tokenizer
