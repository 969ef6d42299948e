#pragma once
/// Internal to the server module: what the HTTP handlers share (model, tokenizer, template,
/// engine loop, metrics). Built once by run_server; read-only afterwards except through the
/// thread-safe EngineLoop and ServerMetrics.

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pagoda/grammar/grammar.h"
#include "pagoda/server/api_request.h"
#include "pagoda/server/chat_template.h"
#include "pagoda/server/engine_loop.h"
#include "pagoda/server/metrics.h"
#include "pagoda/server/tool_parser.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace pagoda::server {

struct PdContext;

struct ServerState {
  std::string model_name;
  int32_t vocab_size = 0;
  int32_t max_context_len = 0;
  int64_t pool_tokens = 0;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;
  std::string bos_token, eos_token;  ///< template variables
  bool chat_add_special = false;     ///< encode rendered chats with the tokenizer's BOS
  /// Structured output: llguidance over `tokenizer` (built once), or null and why not.
  std::unique_ptr<grammar::Grammar> grammar;
  std::string grammar_missing;
  /// Tool calls in the model's syntax (--tool-call-parser; unset: tool_choice auto is a 400) and
  /// the special token ids among its markers, with their text.
  std::optional<ToolCallFormat> tool_format;
  std::vector<std::pair<int32_t, std::string>> tool_marker_ids;
  EngineLoop* loop = nullptr;
  ServerMetrics* metrics = nullptr;
  std::atomic<uint64_t> next_id{1};
  uint64_t seed_base = 0;
  std::string api_key;  ///< empty: no authentication
  int64_t max_inflight = 0;  ///< max_running + max_queue (EngineLoop's admission bound)
  /// Disaggregation, decode role: requests come from `pagoda router` (pd.h); else nullptr.
  PdContext* pd_decode = nullptr;
};

/// Whether `req` may use /v1/*: no --api-key, or `Authorization: Bearer <key>`; paths outside
/// /v1/ are always allowed.
bool authorized(const ServerState& s, const httplib::Request& req);

/// The 401 answer of a request that is not authorized.
ApiError unauthorized();

/// POST /v1/completions and /v1/chat/completions. Answers errors as OpenAI JSON.
void handle_generate(ServerState& state, Endpoint endpoint, const httplib::Request& req,
                     httplib::Response& res);
/// POST /v1/tokenize ({"tokens", "count", "max_model_len"}) and /v1/detokenize ({"prompt"}).
void handle_tokenize(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_detokenize(ServerState& state, const httplib::Request& req, httplib::Response& res);

// request_io.cpp: what the handlers share.

/// Writes `e` as the response (status and OpenAI error JSON).
void set_error(httplib::Response& res, const ApiError& e);
/// Throws 401 (unauthorized) or 415 (the body is not declared application/json; a charset
/// parameter is fine).
void check_api_request(const ServerState& s, const httplib::Request& req);
/// Throws 404 naming `model` when it is given and is not the served model.
void check_model(const ServerState& s, const std::optional<std::string>& model);
/// After a request with a large body: returns freed heap pages to the system (malloc_trim).
void release_request_memory(const httplib::Request& req);
/// The ids of a chat rendered by the template, with `tools` (the chat request's, as the
/// template's `tools` variable, when any) (400 naming `messages` on a template or tokenizer
/// error).
std::vector<int32_t> encode_chat(const ServerState& s, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt,
                                 const std::vector<ToolSpec>& tools = {});
/// The ids of a completions prompt (text encoded with the BOS when `add_special`; token ids
/// checked against the vocabulary); 400 naming `field`.
std::vector<int32_t> encode_prompt(const ServerState& s, const PromptInput& p,
                                   const std::string& field, bool add_special);
/// 400 for an empty prompt, 413 when it leaves no room for an output token or exceeds the pool.
void check_prompt_length(const ServerState& s, const std::vector<int32_t>& ids,
                         const std::string& field);

/// Resident set size of this process in bytes (/proc/self/statm), 0 when unknown.
int64_t resident_bytes();

}  // namespace pagoda::server
