#pragma once
/// Internal to the server module: what the HTTP handlers share (model, tokenizer, template,
/// engine loop, metrics). Built once by run_server; read-only afterwards except through the
/// thread-safe EngineLoop and ServerMetrics.

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "pagoda/server/api_request.h"
#include "pagoda/server/chat_template.h"
#include "pagoda/server/engine_loop.h"
#include "pagoda/server/metrics.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace pagoda::server {

struct ServerState {
  std::string model_name;
  int32_t vocab_size = 0;
  int32_t max_context_len = 0;
  int64_t pool_tokens = 0;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;
  std::string bos_token, eos_token;  ///< template variables
  bool chat_add_special = false;     ///< encode rendered chats with the tokenizer's BOS
  EngineLoop* loop = nullptr;
  ServerMetrics* metrics = nullptr;
  std::atomic<uint64_t> next_id{1};
  uint64_t seed_base = 0;
  std::string api_key;  ///< empty: no authentication
};

/// Whether `req` may use /v1/*: no --api-key, or `Authorization: Bearer <key>`; paths outside
/// /v1/ are always allowed.
bool authorized(const ServerState& s, const httplib::Request& req);

/// The 401 answer of a request that is not authorized.
ApiError unauthorized();

/// POST /v1/completions and /v1/chat/completions. Answers errors as OpenAI JSON.
void handle_generate(ServerState& state, Endpoint endpoint, const httplib::Request& req,
                     httplib::Response& res);

/// Writes `e` as the response (status and OpenAI error JSON).
void set_error(httplib::Response& res, const ApiError& e);

/// Resident set size of this process in bytes (/proc/self/statm), 0 when unknown.
int64_t resident_bytes();

}  // namespace pagoda::server
