#pragma once
/// Internal to the server module: the grammars that constrain a chat request's tool calls
/// (grammar/grammar.h). tool_choice "required" or a named function: the reply is a JSON array of
/// calls [{"name": <function>, "arguments": <its parameters>}, ...] (tool_parser.h's
/// kJsonArray), read back by parse_tool_calls and answered as OpenAI's `tool_calls`. Pure
/// functions. tool_choice "auto" with a --tool-call-parser: free text until the format's call
/// marker, then only calls of the request's functions in that format (a lazy grammar).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "pagoda/server/api_request.h"
#include "pagoda/server/tool_parser.h"

namespace pagoda::server {

/// The JSON schema of a required call's reply: an array of one or more {"name": const,
/// "arguments": parameters} objects, each of a function of r.tools (r.tool_call names one, or ""
/// admits any: anyOf); at most one when !r.parallel_tool_calls.
std::string tool_call_schema(const ApiRequest& r);

/// tool_choice "auto": a grammar in llguidance's Lark-like syntax for replies of format `f`
/// (not kJsonArray) that admits any text until the format's call marker and from it only calls
/// that parse_tool_calls reads back, each naming a function of r.tools with arguments matching
/// its parameters: qwen25 `<tool_call> call </tool_call>` blocks between text; llama3 `call; ...`
/// as the whole reply (it opens with '{') or after `<|python_tag|>`, nothing after the calls;
/// mistral `[TOOL_CALLS] [call, ...]` blocks between text. At most one call (and only white space
/// after it) when !r.parallel_tool_calls. `special`: the markers that are special tokens of the
/// tokenizer (id, text), accepted as that token or as text.
std::string auto_tool_grammar(ToolCallFormat f, const ApiRequest& r,
                              const std::vector<std::pair<int32_t, std::string>>& special);

}  // namespace pagoda::server
