#pragma once
/// The OpenAI-compatible request bodies of `pagoda serve` (POST /v1/completions and
/// /v1/chat/completions) parsed into one validated struct, and OpenAI-shaped errors.
/// Pure functions of their input: no I/O, no engine; thread safe. Contract: docs/design/server.md.

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace pagoda::server {

/// An error a handler answers with: HTTP status, OpenAI error `type`, message and the offending
/// field (`param`, empty when none).
struct ApiError : std::runtime_error {
  int status;
  std::string type;
  std::string param;
  ApiError(int http_status, std::string error_type, const std::string& message,
           std::string field = {})
      : std::runtime_error(message),
        status(http_status),
        type(std::move(error_type)),
        param(std::move(field)) {}
  /// {"error": {"message", "type", "param", "code"}} as OpenAI writes it.
  std::string to_json() const;
};

/// ApiError(400, "invalid_request_error", message, field).
[[noreturn]] void throw_invalid(const std::string& field, const std::string& message);

struct ChatMessage {
  std::string role;     ///< any non-empty string (the template decides what it accepts)
  std::string content;  ///< text; list-of-parts content is joined (text parts only)
  /// An assistant turn's `tool_calls` ([{id, type "function", function {name, arguments}}],
  /// JSON text; empty when none). Its `content` may then be null (`null_content`).
  std::string tool_calls;
  bool null_content = false;
  std::string tool_call_id;  ///< a `tool` message's answer to this call id (empty: none)
};

/// The chat template's `messages` for `messages`, as Hugging Face templates expect them
/// (transformers' apply_chat_template, vLLM and SGLang pass the same): {role, content} plus
/// `tool_calls` with each function's `arguments` given as an object (the JSON text parsed; kept
/// as the string when it is not a JSON object) and `tool_call_id`; null content stays null.
nlohmann::ordered_json template_messages(const std::vector<ChatMessage>& messages);

enum class Endpoint : uint8_t { kCompletions, kChat, kTokenize, kDetokenize };

/// One completions prompt: text, or token ids when `text` is absent.
struct PromptInput {
  std::optional<std::string> text;
  std::vector<int32_t> ids;
};

/// The most choices (prompts × n) one request may ask for (OpenAI's bound on n).
inline constexpr int32_t kMaxChoices = 128;

/// response_format: plain text (none), any JSON object, or JSON matching a JSON schema
/// (structured output through grammar-constrained decoding; docs/design/server.md).
struct ResponseFormat {
  enum class Type : uint8_t { kText, kJsonObject, kJsonSchema };
  Type type = Type::kText;
  std::string schema;  ///< kJsonSchema: json_schema.schema as JSON text
};

/// One function of a chat request's `tools`.
struct ToolSpec {
  std::string name;        ///< [A-Za-z0-9_-]{1,64}, unique within the request
  std::string parameters;  ///< its JSON schema as JSON text ({"type":"object"} when absent)
  std::string json;        ///< the tool object as given, in its key order (template `tools`)
};

/// One request after validation. Unset optional numbers mean "the server's default".
struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::optional<std::string> model;     ///< absent: the served model
  std::vector<PromptInput> prompts;     ///< completions: at least one (a list of prompts)
  std::vector<ChatMessage> messages;    ///< chat: at least one
  int32_t n = 1;                        ///< choices per prompt; prompts × n <= kMaxChoices
  bool echo = false;                    ///< completions: the prompt's text precedes each choice
  std::vector<int32_t> stop_token_ids;  ///< generating one ends the choice (its text not sent)
  std::optional<int32_t> max_tokens;    ///< >= 1
  float temperature = 1.f;              ///< [0, 2]
  float top_p = 1.f;                    ///< (0, 1]
  int32_t top_k = 0;                    ///< -1 or 0 = off
  float min_p = 0.f;                    ///< [0, 1)
  uint64_t seed = 0;
  bool has_seed = false;
  std::vector<std::string> stop;        ///< up to 4 non-empty strings
  bool stream = false;
  bool include_usage = false;           ///< stream_options.include_usage
  bool ignore_eos = false;
  bool add_generation_prompt = true;    ///< chat
  float presence_penalty = 0.f;         ///< [-2, 2]
  float frequency_penalty = 0.f;        ///< [-2, 2]
  float repetition_penalty = 1.f;       ///< (0, 2]
  /// logit_bias: {"token id": bias in [-100, 100]} (ids < the vocabulary: checked by the engine)
  std::vector<std::pair<int32_t, float>> logit_bias;
  /// -1: none; else each output token's log-probability and this many top alternatives
  /// (completions: `logprobs` N; chat: `logprobs: true` with `top_logprobs` N, default 0).
  int32_t logprobs = -1;
  ResponseFormat response_format;
  /// Chat `tools` (rendered by the chat template) and `tool_choice`: `tool_call` is set when the
  /// reply must be a tool call ("required": "" = any of `tools`; a named function: its name);
  /// `tool_auto` for "auto" (also tools without tool_choice): the model may call a function in
  /// its own syntax, which the server's --tool-call-parser reads (tool_parser.h); neither for
  /// "none" (plain text).
  std::vector<ToolSpec> tools;
  std::optional<std::string> tool_call;
  bool tool_auto = false;
  /// parallel_tool_calls (with tools; default true): false allows at most one call per reply
  /// (the grammar of "required", a named function and "auto" admits one).
  bool parallel_tool_calls = true;
};

/// The most top alternatives `logprobs` / `top_logprobs` may ask for (vLLM's default).
inline constexpr int32_t kMaxTopLogprobs = 20;

/// Bounds of a request body's JSON (checked before any tree is built): nesting depth, the number
/// of values (containers included) and of objects and arrays (the costly nodes: a chat of 65536
/// messages fits). With the body's size (the server's --max-request-bytes) they bound the
/// memory a parse takes.
inline constexpr int kMaxJsonDepth = 16;
inline constexpr int64_t kMaxJsonValues = int64_t{1} << 21;
inline constexpr int64_t kMaxJsonContainers = int64_t{1} << 16;

/// Parses and validates a request body. Throws ApiError(400) naming the field for malformed
/// JSON, wrong types, out-of-range values, a top-level field this server does not implement
/// (e.g. suffix, completions' tools, or a misspelt one; a null
/// value counts as absent) and unsupported values (echo with logprobs, best_of ≠ n,
/// prompts × n > kMaxChoices); ApiError(400) naming `body` past kMaxJsonDepth, kMaxJsonValues or
/// kMaxJsonContainers. A SAX pass checks
/// the fields and the bounds before the tree is built, so parse memory is bounded by the body.
ApiRequest parse_api_request(std::string_view body, Endpoint endpoint);

/// POST /v1/tokenize: `prompt` (a string) or `messages` (rendered by the chat template).
struct TokenizeRequest {
  std::optional<std::string> model;
  std::optional<std::string> prompt;
  std::vector<ChatMessage> messages;
  bool add_generation_prompt = true;  ///< messages only
  bool add_special_tokens = true;     ///< prompt: the tokenizer's BOS, as completions encode it
};
/// POST /v1/detokenize: token ids to text.
struct DetokenizeRequest {
  std::optional<std::string> model;
  std::vector<int32_t> tokens;
};
/// The bodies of /v1/tokenize and /v1/detokenize; errors as parse_api_request.
TokenizeRequest parse_tokenize_request(std::string_view body);
DetokenizeRequest parse_detokenize_request(std::string_view body);

/// The text a client receives for `text` once it is written into a JSON response: invalid UTF-8
/// replaced by U+FFFD the way the server's JSON writer does it (nlohmann's `replace` handler,
/// applied here through that writer). Valid UTF-8 comes back unchanged.
std::string client_text(std::string_view text);

/// StopMatcher: finds the first stop string to complete in streamed text (smallest end; on a
/// tie the earliest start — the result does not depend on how the text is chunked) and holds
/// back the tail that could still become one, so streamed text never contains a stop string.
/// Not thread safe (one per request).
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  /// Appends `text`; returns the text that is safe to emit now. After a stop string is found,
  /// stopped() is true, the returned text ends just before it and later pushes return "".
  std::string push(std::string_view text);
  /// Everything still held back (no stop string can complete any more).
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  size_t max_len_ = 0;
  bool stopped_ = false;
};

}  // namespace pagoda::server
