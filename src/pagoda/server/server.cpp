// `pagoda serve`: model setup, routes, authentication, signals and the drain.
#include "pagoda/server/server.h"

#include <httplib.h>
#include <malloc.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/core/log.h"
#include "pagoda/engine/engine.h"
#include "pagoda/model/llama.h"
#include "pagoda/model/safetensors.h"
#include "pagoda/server/http_server.h"
#include "pagoda/server/pd.h"
#include "pagoda/server/server_state.h"
#include "pagoda/tokenizer/load.h"

namespace pagoda::server {

using nlohmann::json;

namespace {

void validate(const ServeOptions& o) {
  PAGODA_REQUIRE(o.port >= 0 && o.port <= 65535, kInvalidArgument, "--port must be in [0, 65535]");
  PAGODA_REQUIRE(o.max_queue >= 0, kInvalidArgument, "--max-queue must be >= 0");
  PAGODA_REQUIRE(o.threads >= 0 && o.threads <= 4096, kInvalidArgument,
                 "--threads must be in [0, 4096]");
  PAGODA_REQUIRE(o.max_request_bytes >= 1024, kInvalidArgument,
                 "--max-request-bytes must be >= 1024");
  PAGODA_REQUIRE(o.listen_backlog >= 1 && o.listen_backlog <= 65535, kInvalidArgument,
                 "--listen-backlog must be in [1, 65535]");
  PAGODA_REQUIRE(!o.host.empty(), kInvalidArgument, "--host must not be empty");
  PAGODA_REQUIRE(o.disaggregation_mode == "null" || o.disaggregation_mode == "prefill" ||
                     o.disaggregation_mode == "decode",
                 kInvalidArgument, "--disaggregation-mode must be null, prefill or decode (got '{}')",
                 o.disaggregation_mode);
  PAGODA_REQUIRE(o.disaggregation_timeout_s > 0, kInvalidArgument,
                 "--disaggregation-timeout must be > 0");
  PAGODA_REQUIRE(o.disaggregation_staging_tokens >= 0, kInvalidArgument,
                 "--disaggregation-staging-tokens must be >= 0 (0: the context length)");
  PAGODA_REQUIRE(o.disaggregation_transfer_backend == "ucx", kUnsupported,
                 "--disaggregation-transfer-backend '{}' is not built (have: ucx)",
                 o.disaggregation_transfer_backend);
  PAGODA_REQUIRE(o.tool_call_parser.empty() || tool_call_format(o.tool_call_parser).has_value(),
                 kInvalidArgument, "--tool-call-parser '{}' is not one of: {}", o.tool_call_parser,
                 fmt::join(tool_call_format_names(), ", "));
}

/// Tool calls in the model's syntax (tool_parser.h): the --tool-call-parser format and the
/// special tokens among its markers (written back into replies, where detokenizing skips them).
void load_tool_parser(ServerState& s, const ServeOptions& o) {
  if (o.tool_call_parser.empty()) return;
  s.tool_format = tool_call_format(o.tool_call_parser);
  for (const std::string& m : tool_call_markers(*s.tool_format))
    if (std::optional<int32_t> id = s.tokenizer->token_to_id(m); id && s.tokenizer->is_special(*id))
      s.tool_marker_ids.emplace_back(*id, m);
}

std::string read_file(const std::filesystem::path& p, const char* what) {
  std::ifstream in(p, std::ios::binary);
  PAGODA_REQUIRE(in.good(), kInvalidArgument, "cannot read {} '{}'", what, p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Structured output (grammar/grammar.h): llguidance from --grammar-library, else from where
/// configure found it. Without --grammar-library a failure only leaves response_format
/// answered with a 400 saying why; a library the user named must load.
void load_grammar(ServerState& s, const ServeOptions& o, int32_t eos) {
  const std::string library =
      o.grammar_library.empty() ? grammar::Grammar::default_library() : o.grammar_library;
  try {
    s.grammar = grammar::Grammar::load(library, *s.tokenizer, s.vocab_size, eos);
    PAGODA_LOG_INFO("structured output: llguidance {} ({})", s.grammar->version(), library);
  } catch (const Error& e) {
    if (!o.grammar_library.empty()) throw;
    s.grammar_missing = e.message();
    PAGODA_LOG_WARN("structured output unavailable (response_format answers 400): {}", e.message());
  }
}

/// A special token of tokenizer_config.json: a string or {"content": ...}.
std::string token_string(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return {};
}

/// The chat template and special tokens of a checkpoint folder (tokenizer_config.json).
void load_chat_template(ServerState& s, const ServeOptions& o) {
  std::string source;
  if (o.model == "builtin") {
    source = std::string(builtin_chat_template());
    s.chat_add_special = true;  // the byte tokenizer's BOS id; the template has no BOS text
  } else {
    const std::filesystem::path cfg_path = std::filesystem::path(o.model) / "tokenizer_config.json";
    if (std::filesystem::exists(cfg_path)) {
      const json cfg = json::parse(read_file(cfg_path, "tokenizer config"), nullptr, false);
      PAGODA_REQUIRE(!cfg.is_discarded() && cfg.is_object(), kInvalidArgument,
                     "'{}' is not a JSON object", cfg_path.string());
      s.bos_token = token_string(cfg, "bos_token");
      s.eos_token = token_string(cfg, "eos_token");
      auto it = cfg.find("chat_template");
      if (it != cfg.end() && it->is_string()) {
        source = it->get<std::string>();
      } else if (it != cfg.end() && it->is_array()) {  // [{"name": "default", "template": ...}]
        for (const json& t : *it)
          if (t.is_object() && t.value("name", "") == "default" && t.contains("template") &&
              t["template"].is_string())
            source = t["template"].get<std::string>();
      }
    }
  }
  if (!o.chat_template.empty()) source = read_file(o.chat_template, "--chat-template");
  if (source.empty()) return;
  try {
    s.chat_template.emplace(source);
  } catch (const TemplateError& e) {
    throw_error(ErrorCode::kInvalidArgument, "chat template: {}", e.what());
  }
}

constexpr int kMmapThresholdBytes = 1 << 20;

int g_signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe[1], &b, 1);
}

/// Whether the request carries a body that httplib reads before routing to a handler.
bool has_body(const httplib::Request& req) {
  return req.get_header_value<uint64_t>("Content-Length") > 0 ||
         req.has_header("Transfer-Encoding");
}

}  // namespace

int run_server(const ServeOptions& o, const TpStart& tp) {
  validate(o);
  // SIGTERM / SIGINT may land on any thread (OpenBLAS starts its own before main): the handler
  // only writes the signal number to a pipe that the signal thread reads.
  PAGODA_REQUIRE(::pipe(g_signal_pipe) == 0, kInternal, "pipe() failed");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  // Request bodies (up to --max-request-bytes) and their copies are large, short-lived buffers:
  // a fixed mmap threshold keeps them out of the heap (glibc's dynamic threshold would grow past
  // them after the first one is freed and then keep their pages in every thread's arena).
  ::mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes);

  // The engine settings are checked before the model loads; the tensor-parallel ranks (if any)
  // load theirs meanwhile.
  std::unique_ptr<platform::Platform> platform = engine::make_platform(o.engine);
  const engine::EngineConfig cfg = engine::make_engine_config(o.engine, *platform);
  const engine::WorkerFactory make_worker = tp ? tp(*platform) : engine::WorkerFactory{};
  model::LoadedModel loaded = model::load_model(
      o.model, o.weight_seed, engine::load_options(o.engine, *platform, static_cast<bool>(tp)));
  model::LlamaModel llama(loaded.config, std::move(loaded.weights));
  ServerState state;
  state.model_name = !o.served_model_name.empty() ? o.served_model_name
                     : o.model == "builtin"
                         ? std::string("builtin")
                         : std::filesystem::path(o.model).lexically_normal().filename().string();
  if (state.model_name.empty()) state.model_name = std::filesystem::path(o.model).parent_path().filename().string();
  PAGODA_REQUIRE(o.model == "builtin" || tokenizer::has_tokenizer(o.model), kInvalidArgument,
                 "--model '{}' has no tokenizer.json or tokenizer.model (the server needs one)",
                 o.model);
  state.tokenizer = tokenizer::make_tokenizer_for(o.model);
  state.vocab_size = loaded.config.vocab_size;
  load_chat_template(state, o);
  load_grammar(state, o, loaded.config.eos_token_id);
  load_tool_parser(state, o);

  engine::Engine engine(llama, cfg, platform.get(), make_worker);
  state.max_context_len = engine.max_context_len();
  state.pool_tokens = engine.stats().pool_tokens;
  state.seed_base = std::random_device{}();
  state.api_key = o.api_key;
  state.max_inflight = static_cast<int64_t>(o.engine.max_running) + o.max_queue;

  ServerMetrics metrics;
  EngineLoop loop(engine, metrics, state.max_inflight);
  state.loop = &loop;
  state.metrics = &metrics;
  std::unique_ptr<PdContext> pd;
  if (o.disaggregation_mode != "null") {
    pd = make_pd_context(o.disaggregation_mode == "prefill" ? PdRole::kPrefill : PdRole::kDecode,
                         engine, *platform, loop, state.model_name,
                         o.model == "builtin" ? o.weight_seed : 0, o.disaggregation_timeout_s,
                         o.disaggregation_staging_tokens);
    if (pd->role == PdRole::kDecode) state.pd_decode = pd.get();
  }

  HttpServer svr;
  const int threads =
      o.threads > 0 ? o.threads : std::min(512, o.engine.max_running + o.max_queue + 8);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  svr.set_payload_max_length(static_cast<size_t>(o.max_request_bytes));
  svr.set_keep_alive_max_count(1000);
  svr.set_read_timeout(30);
  svr.set_write_timeout(30);

  // Authentication: a request without a body is refused here, before routing; one with a body
  // is refused by its handler (or the 404 below) once httplib has read the body (at most
  // --max-request-bytes), so a refused body never stays on a keep-alive connection.
  svr.set_pre_routing_handler([&](const httplib::Request& req, httplib::Response& res) {
    if (!has_body(req) && !authorized(state, req)) {
      set_error(res, unauthorized());
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  svr.set_error_handler(httplib::Server::HandlerWithResponse(
      [&](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (res.status == 404 && !authorized(state, req))
      set_error(res, unauthorized());
    else if (res.status == 404)
      set_error(res, ApiError(404, "NotFoundError", "no route for " + req.method + " " + req.path));
    else if (res.status == 413)
      set_error(res, ApiError(413, "invalid_request_error", "the request body is too large", "body"));
    else
      set_error(res, ApiError(res.status, "invalid_request_error",
                              "HTTP error " + std::to_string(res.status)));
    return httplib::Server::HandlerResponse::Handled;
  }));
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
    }
    set_error(res, ApiError(500, "server_error", msg));
  });
  svr.set_logger([&](const httplib::Request& req, const httplib::Response& res) {
    if (req.path.rfind("/v1/", 0) == 0) metrics.count_response(res.status);
  });

  svr.Post("/v1/completions", [&](const httplib::Request& req, httplib::Response& res) {
    handle_generate(state, Endpoint::kCompletions, req, res);
  });
  svr.Post("/v1/chat/completions", [&](const httplib::Request& req, httplib::Response& res) {
    handle_generate(state, Endpoint::kChat, req, res);
  });
  svr.Post("/v1/tokenize", [&](const httplib::Request& req, httplib::Response& res) {
    handle_tokenize(state, req, res);
  });
  svr.Post("/v1/detokenize", [&](const httplib::Request& req, httplib::Response& res) {
    handle_detokenize(state, req, res);
  });
  svr.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
    const json model = {{"id", state.model_name},
                        {"object", "model"},
                        {"created", 0},
                        {"owned_by", "pagoda"},
                        {"max_model_len", state.max_context_len}};
    res.set_content(json{{"object", "list"}, {"data", json::array({model})}}.dump(),
                    "application/json");
  });
  std::atomic<bool> draining{false};
  svr.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    const EngineSnapshot snap = loop.snapshot();
    const json h = {{"status", draining ? "draining" : "ok"},
                    {"inflight", snap.inflight},
                    {"running", snap.stats.num_running},
                    {"waiting", snap.stats.num_waiting},
                    {"kv_pages_total", snap.stats.pages_total},
                    {"kv_pages_free", snap.stats.pages_free},
                    {"kv_pages_cached", snap.stats.pages_cached},
                    {"leaked_pages", snap.leaked_pages},
                    {"leaked_rows", snap.leaked_rows},
                    {"resident_bytes", resident_bytes()}};
    res.status = draining ? 503 : 200;
    res.set_content(h.dump(), "application/json");
  });
  if (pd != nullptr && pd->role == PdRole::kPrefill) {
    svr.Post("/pd/bootstrap", [&](const httplib::Request& req, httplib::Response& res) {
      handle_pd_bootstrap(*pd, req, res);
    });
    svr.Post("/pd/abort", [&](const httplib::Request& req, httplib::Response& res) {
      handle_pd_abort(*pd, req, res);
    });
  }
  svr.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    std::string text = metrics.render(loop.snapshot());
    if (pd != nullptr) text += render_pd_metrics(*pd);
    text += "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
            "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes " +
            std::to_string(resident_bytes()) + "\n";
    res.set_content(text, "text/plain; version=0.0.4");
  });

  const int port = bind_listener(svr, o.host, o.port);
  PAGODA_REQUIRE(svr.set_listen_backlog(o.listen_backlog), kInternal,
                 "listen() with backlog {} failed", o.listen_backlog);
  std::printf("pagoda serve: listening on http://%s:%d (model %s, backend %s, context %d, "
              "disaggregation %s)\n",
              o.host.c_str(), port, state.model_name.c_str(), engine.worker().backend_name().c_str(),
              state.max_context_len, o.disaggregation_mode.c_str());
  std::fflush(stdout);

  // SIGTERM / SIGINT: stop admitting (503), let running requests finish, then stop listening.
  std::atomic<bool> done{false};
  std::thread signal_thread([&] {
    unsigned char b = 0;
    while (::read(g_signal_pipe[0], &b, 1) < 0 && errno == EINTR) {
    }
    const int sig = b;
    if (done) return;
    draining = true;
    std::fprintf(stderr, "pagoda serve: signal %d, draining %lld request(s)\n", sig,
                 static_cast<long long>(loop.inflight()));
    loop.stop_accepting();
    const bool idle = loop.wait_idle(o.drain_timeout_s);
    if (!idle) std::fprintf(stderr, "pagoda serve: drain timed out; aborting the rest\n");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // last chunks go out
    svr.stop();
  });
  const bool ok = svr.listen_after_bind();
  done = true;
  if (signal_thread.joinable()) {
    if (!draining) on_signal(0);  // wakes the signal thread, which sees `done`
    signal_thread.join();
  }
  const EngineSnapshot last = loop.snapshot();
  std::fprintf(stderr, "pagoda serve: stopped (leaked pages %lld)\n",
               static_cast<long long>(last.leaked_pages));
  return ok ? 0 : 1;
}

}  // namespace pagoda::server
