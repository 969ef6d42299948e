#pragma once
/// BpeModel: the tokenizer.json "model" of type BPE. A word (one pre-token) is cut into
/// characters (vocabulary entries; with byte_fallback an unknown character becomes its <0xNN>
/// byte tokens, else unk_token, fused when fuse_unk), then merged pair by pair, lowest merge rank
/// first and leftmost first among equals, like the `tokenizers` package. With ignore_merges a word
/// that is itself in the vocabulary is one token.
///
/// Cost: O(n log n) per word of n characters (a linked list of symbols and a priority queue of
/// candidate merges); words up to 256 bytes are remembered in a bounded cache.
/// Unsupported (pagoda::Error naming the field): dropout, continuing_subword_prefix,
/// end_of_word_suffix.

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace pagoda::tokenizer {

class BpeModel {
 public:
  /// From the "model" object of tokenizer.json (vocab, merges as "a b" strings or [a, b] pairs,
  /// byte_fallback, fuse_unk, ignore_merges, unk_token). Throws pagoda::Error on anything
  /// unsupported or inconsistent (a merge whose parts or result are not in the vocabulary).
  explicit BpeModel(const nlohmann::json& model);

  /// Appends the ids of `word` (one pre-token, valid UTF-8) to `out`. Thread safe.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  /// Id of `token` in the vocabulary.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  /// Spelling of `id`, or nullptr when the vocabulary has no such id.
  const std::string* id_to_token(int32_t id) const;
  /// max id + 1.
  int32_t size() const { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void tokenize_uncached(std::string_view word, std::vector<int32_t>& out) const;

  Vocab vocab_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<uint64_t, Merge> merges_;
  int32_t byte_ids_[256];
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  int32_t unk_id_ = -1;

  static constexpr size_t kCacheCapacity = 20000;
  static constexpr size_t kCacheMaxWordBytes = 256;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>>
      cache_;
};

}  // namespace pagoda::tokenizer
