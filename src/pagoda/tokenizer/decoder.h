#pragma once
/// Decoder: the tokenizer.json "decoder" stage, which turns token spellings back into text.
/// Supported types: ByteLevel, Metaspace, Replace (String pattern), ByteFallback, Fuse, Strip and
/// Sequence; null joins the tokens with spaces (what `tokenizers` does). Any other type throws
/// pagoda::Error naming it.

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace pagoda::tokenizer {

class Decoder {
 public:
  virtual ~Decoder() = default;
  /// Rewrites the token strings in place (the `tokenizers` decode_chain step); the caller joins
  /// the result. Strings may hold any bytes until the last step. Const and thread safe.
  virtual void apply(std::vector<std::string>& tokens) const = 0;
};

/// The decoder described by `j`; nullptr for JSON null. Throws pagoda::Error for anything
/// unsupported.
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j);

}  // namespace pagoda::tokenizer
