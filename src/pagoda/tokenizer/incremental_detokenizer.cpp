#include "pagoda/tokenizer/incremental_detokenizer.h"

#include <algorithm>

#include "pagoda/tokenizer/unicode.h"

namespace pagoda::tokenizer {

namespace {

bool ends_incomplete(std::string_view s) {
  return utf8_complete_prefix(s) < s.size() ||
         (s.size() >= 3 && s.substr(s.size() - 3) == kReplacementChar);
}

/// The part of `now` after what `before` covered. Decoding is prefix-stable for every supported
/// decoder once `before` is complete text, so this is the suffix of `now` past `before`'s length.
std::string delta_of(const std::string& before, const std::string& now) {
  return now.substr(std::min(before.size(), now.size()));
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer,
                                               bool skip_special_tokens,
                                               std::span<const int32_t> context)
    : tokenizer_(tokenizer),
      skip_special_tokens_(skip_special_tokens),
      ids_(context.begin(), context.end()),
      num_context_(context.size()),
      prefix_offset_(context.size() > kContextWindow ? context.size() - kContextWindow : 0),
      read_offset_(context.size()) {}

std::string IncrementalDetokenizer::decode_range(size_t begin, size_t end) const {
  return tokenizer_.decode(std::span<const int32_t>(ids_).subspan(begin, end - begin),
                           skip_special_tokens_);
}

std::string IncrementalDetokenizer::push(int32_t id) {
  ids_.push_back(id);
  const std::string before = decode_range(prefix_offset_, read_offset_);
  const std::string now = decode_range(prefix_offset_, ids_.size());
  if (now.size() <= before.size() || ends_incomplete(now)) return {};
  std::string delta = delta_of(before, now);
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return delta;
}

std::string IncrementalDetokenizer::finish() {
  if (read_offset_ == ids_.size()) return {};
  const std::string before = decode_range(prefix_offset_, read_offset_);
  const std::string now = decode_range(prefix_offset_, ids_.size());
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  if (now.size() <= before.size()) return {};
  return delta_of(before, now);
}

}  // namespace pagoda::tokenizer
