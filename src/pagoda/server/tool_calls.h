#pragma once
/// Internal to the server module: a chat request's required tool call (ApiRequest::tool_call)
/// as structured output. The reply is constrained to {"name": <function>, "arguments": <its
/// parameters>} (grammar/grammar.h) and answered as OpenAI's `tool_calls`. Pure functions.

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "pagoda/server/api_request.h"

namespace pagoda::server {

/// The JSON schema of the call: one {"name": const, "arguments": parameters} object per
/// function (r.tool_call names one, or "" admits any of r.tools: anyOf).
std::string tool_call_schema(const ApiRequest& r);

/// OpenAI's tool_calls entry {"id", "type": "function", "function": {"name", "arguments"
/// (JSON text)}} for a call's text; nullopt when `text` is not a complete call (cut by
/// max_tokens or a stop string).
std::optional<nlohmann::json> tool_call_entry(const std::string& text, const std::string& id);

}  // namespace pagoda::server
