#include "pagoda/tokenizer/bpe_model.h"

#include <queue>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/tokenizer/json_util.h"
#include "pagoda/tokenizer/unicode.h"

namespace pagoda::tokenizer {

namespace {

/// Left/right parts of one merges entry ("a b" or ["a", "b"]).
std::pair<std::string, std::string> parse_merge(const nlohmann::json& m, size_t rank) {
  if (m.is_array() && m.size() == 2) return {m[0].get<std::string>(), m[1].get<std::string>()};
  PAGODA_REQUIRE(m.is_string(), kInvalidArgument, "tokenizer.json: model.merges[{}] malformed",
                 rank);
  const std::string s = m.get<std::string>();
  const size_t sp = s.find(' ', 1);
  PAGODA_REQUIRE(sp != std::string::npos, kInvalidArgument,
                 "tokenizer.json: model.merges[{}] '{}' has no space", rank, s);
  return {s.substr(0, sp), s.substr(sp + 1)};
}

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  bool alive;
};

struct Candidate {
  int32_t rank;
  int32_t pos;
  int32_t result;
  int32_t right_id;  // id of the right symbol when queued (stale check)
  bool operator>(const Candidate& o) const {
    return rank != o.rank ? rank > o.rank : pos > o.pos;
  }
};

}  // namespace

BpeModel::BpeModel(const nlohmann::json& model) {
  const std::string type = model.value("type", std::string("BPE"));
  PAGODA_REQUIRE(type == "BPE", kUnsupported,
                 "tokenizer.json: model.type '{}' is not supported (only BPE)", type);
  json_require_default(model, "dropout", nullptr, "model");
  json_require_default(model, "continuing_subword_prefix", "", "model");
  json_require_default(model, "end_of_word_suffix", "", "model");
  byte_fallback_ = model.value("byte_fallback", false);
  fuse_unk_ = model.value("fuse_unk", false);
  ignore_merges_ = model.value("ignore_merges", false);

  const auto& vocab = model.at("vocab");
  PAGODA_REQUIRE(vocab.is_object(), kInvalidArgument, "tokenizer.json: model.vocab is not a map");
  int32_t max_id = -1;
  for (const auto& [tok, id] : vocab.items()) {
    const int32_t v = json_token_id(id, fmt::format("model.vocab['{}']", tok));
    vocab_.emplace(tok, v);
    max_id = std::max(max_id, v);
  }
  // The id table is sized by the largest id: vocabularies are dense, so a few holes are allowed
  // but a tiny file cannot ask for a table of millions of entries.
  PAGODA_REQUIRE(int64_t{max_id} < static_cast<int64_t>(vocab.size()) + 65536, kInvalidArgument,
                 "tokenizer.json: model.vocab has {} entries but ids up to {} (more than 65,536 "
                 "unused ids)",
                 vocab.size(), max_id);
  id_to_token_.resize(static_cast<size_t>(max_id + 1));
  for (const auto& [tok, id] : vocab_) id_to_token_[static_cast<size_t>(id)] = tok;

  const auto& merges = model.at("merges");
  merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto [a, b] = parse_merge(merges[r], r);
    const auto ia = vocab_.find(a), ib = vocab_.find(b), ic = vocab_.find(a + b);
    PAGODA_REQUIRE(ia != vocab_.end() && ib != vocab_.end() && ic != vocab_.end(),
                   kInvalidArgument, "tokenizer.json: model.merges[{}] '{} {}' not in the vocab", r,
                   a, b);
    merges_.emplace(pair_key(ia->second, ib->second),
                    Merge{static_cast<int32_t>(r), ic->second});  // first rank wins
  }

  for (int b = 0; b < 256; ++b) {
    const auto it = vocab_.find(fmt::format("<0x{:02X}>", b));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
  if (model.contains("unk_token") && model.at("unk_token").is_string()) {
    const std::string unk = model.at("unk_token").get<std::string>();
    const auto it = vocab_.find(unk);
    PAGODA_REQUIRE(it != vocab_.end(), kInvalidArgument,
                   "tokenizer.json: model.unk_token '{}' is not in the vocab", unk);
    unk_id_ = it->second;
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || id >= size()) return nullptr;
  const std::string& s = id_to_token_[static_cast<size_t>(id)];
  if (s.empty() && vocab_.find(s) == vocab_.end()) return nullptr;
  return &s;
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    const auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  tokenize_uncached(word, out);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) {
      cache_.emplace(std::string(word), std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(first), out.end()));
    }
  }
}

void BpeModel::tokenize_uncached(std::string_view word, std::vector<int32_t>& out) const {
  std::vector<Symbol> syms;
  syms.reserve(word.size());
  bool last_unk = false;
  auto push = [&syms](int32_t id) {
    const auto n = static_cast<int32_t>(syms.size());
    syms.push_back({id, n - 1, -1, true});
  };
  for (size_t i = 0; i < word.size();) {
    const size_t b = i;
    next_cp(word, i);
    const std::string_view ch = word.substr(b, i - b);
    if (const auto it = vocab_.find(ch); it != vocab_.end()) {
      push(it->second);
      last_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : ch) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (char c : ch) push(byte_ids_[static_cast<unsigned char>(c)]);
        last_unk = false;
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (!(fuse_unk_ && last_unk)) push(unk_id_);
      last_unk = true;
    }
  }
  const auto n = static_cast<int32_t>(syms.size());
  for (int32_t k = 0; k + 1 < n; ++k) syms[static_cast<size_t>(k)].next = k + 1;

  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto consider = [&](int32_t pos) {
    if (pos < 0) return;
    const Symbol& s = syms[static_cast<size_t>(pos)];
    if (s.next < 0) return;
    const int32_t right = syms[static_cast<size_t>(s.next)].id;
    const auto it = merges_.find(pair_key(s.id, right));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.result, right});
  };
  for (int32_t k = 0; k + 1 < n; ++k) consider(k);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = syms[static_cast<size_t>(c.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = syms[static_cast<size_t>(left.next)];
    // Stale: the pair changed since it was queued.
    const auto it = merges_.find(pair_key(left.id, right.id));
    if (right.id != c.right_id || it == merges_.end() || it->second.rank != c.rank) continue;
    left.id = c.result;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) syms[static_cast<size_t>(right.next)].prev = c.pos;
    consider(left.prev);
    consider(c.pos);
  }
  for (int32_t k = 0; k >= 0 && k < n; k = syms[static_cast<size_t>(k)].next) {
    out.push_back(syms[static_cast<size_t>(k)].id);
  }
}

}  // namespace pagoda::tokenizer
