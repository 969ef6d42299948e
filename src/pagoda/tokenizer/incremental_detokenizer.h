#pragma once
/// IncrementalDetokenizer: turns a stream of generated ids into text pieces for streaming, emitting
/// only complete UTF-8 text. It decodes a short window of recent ids with and without the new id
/// and emits the difference, so decoders that depend on context (a leading space stripped from the
/// first token, byte fallback, byte-level tokens that split a code point) stream exactly the text
/// a final decode gives; text that still ends in an incomplete sequence or U+FFFD is held back
/// until the next id completes it or finish() is called.
/// Not thread safe (one per request); holds a reference to the tokenizer, which must outlive it.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda::tokenizer {

class IncrementalDetokenizer {
 public:
  /// `context`: ids already seen (e.g. the prompt), used only as decoding context, never emitted.
  IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens,
                         std::span<const int32_t> context = {});

  /// Adds one generated id; returns the text that became complete (possibly empty). Mutates.
  std::string push(int32_t id);
  /// Returns whatever is still held back (possibly with U+FFFD or incomplete bytes). Mutates:
  /// afterwards nothing is held.
  std::string finish();
  /// Every id pushed so far, after the context.
  std::span<const int32_t> generated() const {
    return std::span<const int32_t>(ids_).subspan(num_context_);
  }

 private:
  std::string decode_range(size_t begin, size_t end) const;

  static constexpr size_t kContextWindow = 5;
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;
  size_t num_context_;
  size_t prefix_offset_;  ///< ids_[prefix_offset_, read_offset_) is the decoding context
  size_t read_offset_;    ///< ids_[read_offset_, end) are not emitted yet
};

}  // namespace pagoda::tokenizer
