#include "pagoda/tokenizer/byte_tokenizer.h"

#include <algorithm>

#include "pagoda/core/error.h"

namespace pagoda::tokenizer {

ByteTokenizer::ByteTokenizer(int32_t bos_id, int32_t eos_id) : bos_id_(bos_id), eos_id_(eos_id) {
  PAGODA_REQUIRE(bos_id >= -1 && eos_id >= -1, kInvalidArgument,
                 "byte tokenizer: bos id {} / eos id {} must be >= -1", bos_id, eos_id);
}

std::vector<int32_t> ByteTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() + 1);
  if (add_special_tokens && bos_id_ >= 0) ids.push_back(bos_id_);
  for (char c : text) ids.push_back(static_cast<int32_t>(static_cast<unsigned char>(c)));
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids, bool /*skip_special_tokens*/) const {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    PAGODA_REQUIRE(id >= 0, kOutOfRange, "byte tokenizer: negative token id {}", id);
    if (id < kNumBytes) out.push_back(static_cast<char>(id));
  }
  return out;
}

int32_t ByteTokenizer::vocab_size() const {
  return std::max({kNumBytes, bos_id_ + 1, eos_id_ + 1});
}

std::optional<int32_t> ByteTokenizer::token_to_id(std::string_view token) const {
  if (token.size() == 1) return static_cast<int32_t>(static_cast<unsigned char>(token[0]));
  if (token == "<bos>" && bos_id_ >= 0) return bos_id_;
  if (token == "<eos>" && eos_id_ >= 0) return eos_id_;
  return std::nullopt;
}

}  // namespace pagoda::tokenizer
