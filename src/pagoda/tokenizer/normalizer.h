#pragma once
/// Normalizer: the tokenizer.json "normalizer" stage. Supported types: NFC, NFD, NFKC, NFKD,
/// Lowercase, StripAccents, Strip, Prepend, Replace (String or Regex pattern) and Sequence of
/// those; null means none. Any other type throws pagoda::Error naming it.

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace pagoda::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  /// `text` (valid UTF-8) normalised. Const and thread safe.
  virtual std::string apply(std::string_view text) const = 0;
};

/// The normalizer described by `j` (the value of tokenizer.json's "normalizer"); nullptr for
/// JSON null. Throws pagoda::Error naming the field for anything unsupported.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j);

}  // namespace pagoda::tokenizer
