#pragma once
/// Tool calls in a model's own syntax (chat `tool_choice: "auto"`, `serve --tool-call-parser`):
/// the model writes freely and the server splits its reply into text (`content`) and calls
/// (`tool_calls`). One format per model family, named as SGLang names its parsers:
///   qwen25 (also qwen, hermes): <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one
///     block per call;
///   llama3: {"name": ..., "parameters": {...}} (or "arguments"), after <|python_tag|> or as the
///     whole reply, several separated by ';';
///   mistral: [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...].
/// And one that no parser name selects: json_array, the reply of tool_choice "required" or a
/// named function, [{"name": ..., "arguments": {...}}, ...] (forced by a grammar).
/// A call counts only when it is complete JSON naming one of the request's functions with an
/// object of arguments; anything else (malformed JSON, an unknown function, a call cut by
/// max_tokens) stays in the text, verbatim. Nothing is dropped except white space between calls.
/// A call's arguments are the text of its arguments object as the model wrote it.
/// Pure functions and a per-request streaming splitter; no I/O. Contract: docs/design/server.md
/// "Tool calls".

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/server/api_request.h"

namespace pagoda::server {

enum class ToolCallFormat : uint8_t { kQwen25, kLlama3, kMistral, kJsonArray };

/// The format a --tool-call-parser name selects; nullopt for an unknown name.
std::optional<ToolCallFormat> tool_call_format(std::string_view name);
/// The names tool_call_format accepts (for help text and errors).
const std::vector<std::string>& tool_call_format_names();
/// The marker texts that open a call in `f` ("<tool_call>", "<|python_tag|>", "[TOOL_CALLS]";
/// none for kJsonArray).
/// Where a tokenizer has one as a special token, which detokenizing skips, the server writes
/// its text back into the reply so that the parser sees it.
std::vector<std::string> tool_call_markers(ToolCallFormat f);

struct ParsedToolCall {
  std::string name;
  std::string arguments;  ///< the arguments object's JSON text, as written
  bool operator==(const ParsedToolCall&) const = default;
};

/// A reply split into text and calls. `content` keeps every byte that is not part of a call
/// (white space only: "" when there are calls).
struct ParsedReply {
  std::string content;
  std::vector<ParsedToolCall> calls;
};

/// Splits a whole reply; `tools` are the request's functions (a call must name one).
ParsedReply parse_tool_calls(ToolCallFormat f, std::string_view text,
                             const std::vector<ToolSpec>& tools);

/// A piece of a streamed call (OpenAI's `delta.tool_calls[]`): the first piece of call `index`
/// names it (`name` non-empty); every piece adds text to its arguments.
struct ToolCallDelta {
  size_t index = 0;
  std::string name;
  std::string arguments;
  bool operator==(const ToolCallDelta&) const = default;
};

/// What the splitter releases: text to send as content, and pieces of calls.
struct SplitPiece {
  std::string content;
  std::vector<ToolCallDelta> calls;
};

/// Streaming: the text before the first call marker is released as it comes (less a tail that
/// could still become a marker); from the marker on it is held until finish(), and each call is
/// released as it is written: its first piece once its name is complete and its arguments
/// object has begun, then the arguments' text as it grows. The pushed contents followed by
/// finish()'s equal parse_tool_calls(whole text).content, and the pieces join to its calls,
/// however the text was cut into pushes, for every reply whose pieces never name a call that
/// the whole reply does not have: any reply a tool-call grammar admits (tool_calls.h), except
/// one cut short inside a call (then that call's pieces have been sent, and it is text).
/// Not thread safe.
class ToolCallSplitter {
 public:
  ToolCallSplitter(ToolCallFormat f, const std::vector<ToolSpec>& tools);
  /// Appends reply text; returns the content safe to send now and the new pieces of calls.
  SplitPiece push(std::string_view text);
  /// The end of the reply: the rest of the content and the pieces that complete the calls
  /// (`rest`), and the calls, as parse_tool_calls reads the whole reply.
  struct End {
    SplitPiece rest;
    std::vector<ParsedToolCall> calls;
  };
  End finish();

 private:
  /// The pieces of the calls written since the last call.
  std::vector<ToolCallDelta> stream_calls();
  ToolCallFormat format_;
  const std::vector<ToolSpec>& tools_;
  std::vector<std::string> markers_;
  std::string pending_;  ///< text not yet released
  size_t sent_ = 0;      ///< bytes released so far
  bool in_call_ = false; ///< a marker was seen: the rest waits for finish()
  std::vector<size_t> streamed_;  ///< per call streamed: the bytes of its arguments sent
};

}  // namespace pagoda::server
