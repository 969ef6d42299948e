// `pagoda serve`: options → server::run_server (src/pagoda/server), or a clear error in a build
// without cpp-httplib.
#include <memory>

#include "pagoda/cli/commands.h"
#include "pagoda/cli/engine_options.h"
#include "pagoda/core/error.h"
#ifdef PAGODA_CLI_HAVE_SERVER
#include "pagoda/server/server.h"
#endif

namespace pagoda::cli {

namespace {
struct ServeCliOptions {
  std::string model = "builtin";
  uint64_t weight_seed = 0;
  int tp = 1;
  std::string served_model_name;
  std::string host = "127.0.0.1";
  int port = 30000;
  std::string api_key;
  int max_queue = 256;
  int threads = 0;
  EngineOptions engine = [] {  // serve's defaults (server::ServeOptions::engine)
    EngineOptions e;
    e.args.pool_tokens = 65536;
    e.args.chunk_size = 256;
    return e;
  }();
  std::string chat_template;
  double drain_timeout = 60;
  int64_t max_request_bytes = 8 << 20;
  int listen_backlog = 1024;
  std::string disaggregation_mode = "null";
  double disaggregation_timeout = 30;
  std::string disaggregation_transfer_backend = "ucx";
  int64_t disaggregation_staging_tokens = 0;
  std::string grammar_library;
  std::string tool_call_parser;
};
}  // namespace

void add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeCliOptions>();
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (completions, chat, "
                                          "streaming, /metrics)");
  cmd->add_option("--model", o->model, "builtin, or a Hugging Face checkpoint folder")
      ->capture_default_str();
  cmd->add_option("--weight-seed", o->weight_seed, "seed of the builtin model's weights")
      ->capture_default_str();
  add_tp_option(cmd, o->tp);
  cmd->add_option("--served-model-name", o->served_model_name,
                  "the model id clients send (default: builtin or the folder's name)");
  add_listen_options(cmd, o->host, o->port, o->threads,
                     "HTTP threads (0 = max-running + max-queue + 8)");
  cmd->add_option("--api-key", o->api_key, "require 'Authorization: Bearer KEY' on /v1/*");
  cmd->add_option("--max-queue", o->max_queue,
                  "requests accepted beyond --max-running before answering 503")
      ->capture_default_str();
  add_engine_options(cmd, o->engine);
  cmd->add_option("--chat-template", o->chat_template,
                  "Jinja file overriding the checkpoint's chat template");
  cmd->add_option("--drain-timeout", o->drain_timeout,
                  "seconds SIGTERM waits for running requests")
      ->capture_default_str();
  cmd->add_option("--max-request-bytes", o->max_request_bytes,
                  "largest request body accepted (larger: 413, not read into memory)")
      ->capture_default_str();
  cmd->add_option("--listen-backlog", o->listen_backlog,
                  "listen queue length for bursts of new connections (capped by the kernel's "
                  "net.core.somaxconn)")
      ->capture_default_str();
  cmd->add_option("--disaggregation-mode", o->disaggregation_mode,
                  "prefill–decode disaggregation role: null (colocated), prefill (serves the "
                  "bootstrap) or decode (takes requests from `pagoda router`)")
      ->check(CLI::IsMember({"null", "prefill", "decode"}))
      ->capture_default_str();
  cmd->add_option("--disaggregation-timeout", o->disaggregation_timeout,
                  "seconds a room may take (pages, prefill, KV transfer) before it fails")
      ->capture_default_str();
  cmd->add_option("--disaggregation-transfer-backend", o->disaggregation_transfer_backend,
                  "KV transfer engine (ucx: host memory over TCP / shared memory)")
      ->capture_default_str();
  cmd->add_option("--disaggregation-staging-tokens", o->disaggregation_staging_tokens,
                  "pinned host staging of the KV transfer, in tokens (0: the context length): "
                  "the decode side refuses a room whose prompt KV does not fit, the prefill "
                  "side sends in chunks of it")
      ->capture_default_str();
  cmd->add_option("--grammar-library", o->grammar_library,
                  "llguidance's shared object (_lib.abi3.so of the llguidance Python package) "
                  "for response_format; default: the one found when pagoda was configured");
  cmd->add_option("--tool-call-parser", o->tool_call_parser,
                  "the model's tool-call syntax, read back from replies for chat tool_choice "
                  "\"auto\": qwen25 (also qwen, hermes), llama3 or mistral; without it \"auto\" "
                  "gets a 400");
  cmd->callback([o] {
#ifdef PAGODA_CLI_HAVE_SERVER
    prepare_host_threads();
    server::ServeOptions s;
    s.model = o->model;
    s.weight_seed = o->weight_seed;
    s.served_model_name = o->served_model_name;
    s.host = o->host;
    s.port = o->port;
    s.api_key = o->api_key;
    s.max_queue = o->max_queue;
    s.threads = o->threads;
    s.engine = o->engine.resolve();
    s.chat_template = o->chat_template;
    s.drain_timeout_s = o->drain_timeout;
    s.max_request_bytes = o->max_request_bytes;
    s.listen_backlog = o->listen_backlog;
    s.disaggregation_mode = o->disaggregation_mode;
    s.disaggregation_timeout_s = o->disaggregation_timeout;
    s.disaggregation_transfer_backend = o->disaggregation_transfer_backend;
    s.disaggregation_staging_tokens = o->disaggregation_staging_tokens;
    s.grammar_library = o->grammar_library;
    s.tool_call_parser = o->tool_call_parser;
    TpRunner tp_group;  // outlives run_server's engine
    server::TpStart tp;
    if (o->tp != 1)
      tp = [&](platform::Platform& platform) {
        tp_group = start_tp(o->tp, platform, o->model, o->weight_seed);
        return tp_group.factory(platform);
      };
    const int rc = server::run_server(s, tp);
    if (rc != 0) throw_error(ErrorCode::kInternal, "the server stopped with an error");
#else
    throw_error(ErrorCode::kUnsupported,
                "`pagoda serve` is unavailable in this build: cpp-httplib was not found at "
                "configure time (apt install libcpp-httplib-dev, then reconfigure)");
#endif
  });
}

}  // namespace pagoda::cli
