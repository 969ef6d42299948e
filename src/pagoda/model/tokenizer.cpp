#include "pagoda/model/tokenizer.h"

namespace pagoda::model {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text, bool add_bos) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() + 1);
  if (add_bos && bos_id_ >= 0) ids.push_back(bos_id_);
  for (char c : text) ids.push_back(static_cast<int32_t>(static_cast<unsigned char>(c)));
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids)
    if (id >= 0 && id < kNumBytes) out.push_back(static_cast<char>(id));
  return out;
}

}  // namespace pagoda::model
