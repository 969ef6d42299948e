#pragma once
/// Small helpers to read tokenizer.json fields with errors that name the field.

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace pagoda::tokenizer {

/// j[key] as a string; throws pagoda::Error "tokenizer.json: <where>.<key> ..." when missing or
/// not a string.
std::string json_string(const nlohmann::json& j, std::string_view key, std::string_view where);

/// The regex of a {"pattern": {"String": s}} or {"pattern": {"Regex": r}} field: a String
/// pattern comes back escaped so it matches literally.
std::string json_pattern(const nlohmann::json& j, std::string_view where);

/// Throws pagoda::Error naming `where`.`key` when j[key] is present, not null and not equal to
/// `expected` (a feature pagoda does not implement).
void json_require_default(const nlohmann::json& j, std::string_view key,
                          const nlohmann::json& expected, std::string_view where);

/// Token ids above this are refused (the largest real vocabularies are ~2^18), so an id never
/// sizes a table beyond what a real tokenizer needs and `id + 1` never overflows.
inline constexpr int32_t kMaxTokenId = (int32_t{1} << 24) - 1;

/// `v` as a token id: an integer in [0, kMaxTokenId]; otherwise throws pagoda::Error naming
/// `what` (a float, string, negative or huge number is never narrowed silently).
int32_t json_token_id(const nlohmann::json& v, std::string_view what);

}  // namespace pagoda::tokenizer
