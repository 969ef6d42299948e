#include "pagoda/tokenizer/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include "pagoda/core/error.h"

namespace pagoda::tokenizer {

SentencePieceTokenizer::SentencePieceTokenizer(const std::filesystem::path& model_path,
                                               const SentencePieceOptions& options)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()), options_(options) {
  const auto status = sp_->Load(model_path.string());
  PAGODA_REQUIRE(status.ok(), kInvalidArgument, "sentencepiece: cannot load {}: {}",
                 model_path.string(), status.ToString());
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text,
                                                    bool add_special_tokens) const {
  std::vector<int> ids;
  const auto status = sp_->Encode(std::string(text), &ids);
  PAGODA_REQUIRE(status.ok(), kInvalidArgument, "sentencepiece: encode failed: {}",
                 status.ToString());
  std::vector<int32_t> out;
  out.reserve(ids.size() + 2);
  if (add_special_tokens && options_.add_bos && sp_->bos_id() >= 0) out.push_back(sp_->bos_id());
  out.insert(out.end(), ids.begin(), ids.end());
  if (add_special_tokens && options_.add_eos && sp_->eos_id() >= 0) out.push_back(sp_->eos_id());
  return out;
}

std::string SentencePieceTokenizer::decode(std::span<const int32_t> ids,
                                           bool skip_special_tokens) const {
  std::vector<int> in;
  in.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;  // outside the vocabulary: left out
    if (skip_special_tokens && is_special(id)) continue;
    in.push_back(id);
  }
  std::string text;
  const auto status = sp_->Decode(in, &text);
  PAGODA_REQUIRE(status.ok(), kInvalidArgument, "sentencepiece: decode failed: {}",
                 status.ToString());
  return text;
}

int32_t SentencePieceTokenizer::vocab_size() const { return sp_->GetPieceSize(); }

std::optional<int32_t> SentencePieceTokenizer::token_to_id(std::string_view token) const {
  const int id = sp_->PieceToId(std::string(token));
  if (id < 0 || sp_->IdToPiece(id) != token) return std::nullopt;
  return id;
}

int32_t SentencePieceTokenizer::bos_id() const { return sp_->bos_id(); }
int32_t SentencePieceTokenizer::eos_id() const { return sp_->eos_id(); }

bool SentencePieceTokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && sp_->IsControl(id);
}

}  // namespace pagoda::tokenizer
