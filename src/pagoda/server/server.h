#pragma once
/// `pagoda serve`: an OpenAI-compatible HTTP server (cpp-httplib) over one engine.
/// Endpoints: POST /v1/completions, POST /v1/chat/completions (streaming as server-sent events
/// ending with `data: [DONE]`), POST /v1/tokenize, POST /v1/detokenize, GET /v1/models,
/// GET /health, GET /metrics (Prometheus text); with --disaggregation-mode prefill also
/// POST /pd/bootstrap and POST /pd/abort (pd.h).
/// Threads: httplib's pool runs the handlers (HttpServer: httplib with a configurable backlog
/// and client-disconnect detection); one EngineLoop thread owns the model and engine;
/// a signal thread turns SIGTERM / SIGINT into a drain (new requests get 503, running ones
/// finish, then the process exits 0). Contract: docs/design/server.md.

#include <cstdint>
#include <optional>
#include <string>

#include <functional>

#include "pagoda/engine/engine.h"
#include "pagoda/engine/engine_args.h"
#include "pagoda/platform/platform.h"

namespace pagoda::server {

struct ServeOptions {
  std::string model = "builtin";      ///< builtin, or a Hugging Face checkpoint folder
  uint64_t weight_seed = 0;
  std::string served_model_name;      ///< empty: "builtin" or the folder's name
  std::string host = "127.0.0.1";
  int port = 30000;                   ///< 0: any free port (printed on stdout)
  std::string api_key;                ///< empty: no authentication
  int max_queue = 256;                ///< requests accepted beyond max_running before 503
  int threads = 0;                    ///< HTTP threads; 0 = engine.max_running + max_queue + 8
                                      ///< (at most 512)
  /// The engine (engine_args.h): serve's defaults are a 65,536-token pool and chunked prefill
  /// of 256 tokens; engine.max_running also bounds the HTTP threads and the in-flight count.
  engine::EngineArgs engine = [] {
    engine::EngineArgs a;
    a.pool_tokens = 65536;
    a.chunk_size = 256;
    return a;
  }();
  std::string chat_template;          ///< file overriding the checkpoint's template
  int64_t max_request_bytes = 8 << 20;  ///< larger request bodies get 413 (unread)
  int listen_backlog = 1024;          ///< listen queue length (the kernel caps it at somaxconn)
  double drain_timeout_s = 60;        ///< SIGTERM: longest wait for running requests
  /// Prefill–decode disaggregation (docs/design/pd.md): "null" (colocated), "prefill" (serves
  /// POST /pd/bootstrap) or "decode" (takes requests from `pagoda router`).
  std::string disaggregation_mode = "null";
  /// Room timeout: decode waits this long for pages + prefill + transfer; prefill for its part.
  double disaggregation_timeout_s = 30;
  std::string disaggregation_transfer_backend = "ucx";  ///< only "ucx" is built
  /// Pinned staging pages of the KV transfer, in tokens (0: the context length): on the decode
  /// side the most prompt KV one room may receive, on the prefill side its chunk (pd.md).
  int64_t disaggregation_staging_tokens = 0;
  /// Structured output (response_format): llguidance's shared object. Empty: the one found at
  /// configure time, and if it cannot load, response_format gets a 400 saying why; a library
  /// given here that cannot load stops the server (Error(kUnsupported)).
  std::string grammar_library;
  /// Tool calls in the model's own syntax for chat tool_choice "auto" (tool_parser.h): qwen25
  /// (qwen, hermes), llama3 or mistral. Empty: "auto" gets a 400 naming this option.
  std::string tool_call_parser;
};

/// Tensor parallelism for run_server: starts the group on the server's platform (before the
/// model loads) and returns the engine's worker factory (cli::start_tp); keep the group alive
/// until run_server returns.
using TpStart = std::function<engine::WorkerFactory(platform::Platform& platform)>;

/// Validates `o` (Error(kInvalidArgument) naming the option), loads the model, binds and serves
/// until SIGTERM / SIGINT. Prints "pagoda serve: listening on http://HOST:PORT" on stdout once
/// bound. Returns the process exit status. `tp` empty: one rank.
int run_server(const ServeOptions& o, const TpStart& tp = {});

}  // namespace pagoda::server
