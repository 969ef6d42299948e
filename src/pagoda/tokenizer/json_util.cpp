#include "pagoda/tokenizer/json_util.h"

#include "pagoda/core/error.h"
#include "pagoda/tokenizer/regex.h"

namespace pagoda::tokenizer {

std::string json_string(const nlohmann::json& j, std::string_view key, std::string_view where) {
  const auto it = j.find(key);
  PAGODA_REQUIRE(it != j.end() && it->is_string(), kInvalidArgument,
                 "tokenizer.json: {}.{} is missing or not a string", where, key);
  return it->get<std::string>();
}

std::string json_pattern(const nlohmann::json& j, std::string_view where) {
  const auto it = j.find("pattern");
  PAGODA_REQUIRE(it != j.end() && it->is_object(), kInvalidArgument,
                 "tokenizer.json: {}.pattern is missing", where);
  if (it->contains("String")) return regex_escape(it->at("String").get<std::string>());
  if (it->contains("Regex")) return it->at("Regex").get<std::string>();
  throw_error(ErrorCode::kUnsupported, "tokenizer.json: {}.pattern must be String or Regex",
              where);
}

void json_require_default(const nlohmann::json& j, std::string_view key,
                          const nlohmann::json& expected, std::string_view where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null() || *it == expected) return;
  throw_error(ErrorCode::kUnsupported, "tokenizer.json: {}.{} = {} is not supported", where, key,
              it->dump());
}

}  // namespace pagoda::tokenizer
