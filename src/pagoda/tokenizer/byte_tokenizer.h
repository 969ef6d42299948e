#pragma once
/// ByteTokenizer: the built-in model's tokenizer. Token id b (0..255) is the byte b; BOS and EOS
/// are ids 256 and 257 by default. No merges, no normalisation: decode(encode(x)) == x for any
/// byte string.

#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda::tokenizer {

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kNumBytes = 256;

  /// bos_id / eos_id: special ids (normally >= 256; -1 for none). An id below 256 is still a
  /// byte in decode (a checkpoint without tokenizer files whose BOS is 1 decodes id 1 as 0x01).
  explicit ByteTokenizer(int32_t bos_id = 256, int32_t eos_id = 257);

  /// One id per byte of `text`, preceded by BOS when `add_special_tokens` and bos_id >= 0.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override;
  /// Bytes of the ids < 256; BOS/EOS and other ids >= 256 are skipped whatever
  /// `skip_special_tokens` says (they have no text); negative ids throw pagoda::Error.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  /// 256 + the special ids: max(bos, eos) + 1, at least 256.
  int32_t vocab_size() const override;
  /// A one-byte token is its byte; "<bos>"/"<eos>" name the special ids.
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  /// Ids >= 256 (they have no text).
  bool is_special(int32_t id) const override { return id >= kNumBytes; }
  std::string_view kind() const override { return "byte"; }

 private:
  int32_t bos_id_;
  int32_t eos_id_;
};

}  // namespace pagoda::tokenizer
