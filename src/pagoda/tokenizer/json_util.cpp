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

int32_t json_token_id(const nlohmann::json& v, std::string_view what) {
  const bool in_range =
      (v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(kMaxTokenId)) ||
      (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() >= 0 &&
       v.get<int64_t>() <= kMaxTokenId);
  PAGODA_REQUIRE(in_range, kInvalidArgument,
                 "tokenizer.json: {} = {} is not a token id (an integer in [0, {}])", what,
                 v.dump(), kMaxTokenId);
  return static_cast<int32_t>(v.get<int64_t>());
}

}  // namespace pagoda::tokenizer
