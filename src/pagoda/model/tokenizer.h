#pragma once
/// ByteTokenizer: the built-in model's tokenizer. Token id b (0..255) is the byte b; BOS and EOS
/// are ids 256 and 257 by default. No merges, no normalisation: encode(decode(x)) == x for any
/// byte string.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pagoda::model {

class ByteTokenizer {
 public:
  static constexpr int32_t kNumBytes = 256;

  /// bos_id / eos_id: special ids (>= 256 or -1 for none).
  explicit ByteTokenizer(int32_t bos_id = 256, int32_t eos_id = 257)
      : bos_id_(bos_id), eos_id_(eos_id) {}
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  /// One id per byte of `text`, preceded by BOS when `add_bos` and bos_id >= 0.
  std::vector<int32_t> encode(std::string_view text, bool add_bos) const;
  /// Bytes of the ids < 256; special and out-of-range ids are skipped.
  std::string decode(std::span<const int32_t> ids) const;

 private:
  int32_t bos_id_;
  int32_t eos_id_;
};

}  // namespace pagoda::model
