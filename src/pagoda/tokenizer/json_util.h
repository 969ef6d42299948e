#pragma once
/// Small helpers to read tokenizer.json fields with errors that name the field.

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

}  // namespace pagoda::tokenizer
