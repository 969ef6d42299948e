// `pagoda router`: options → server::run_router (src/pagoda/server/router.h), or a clear error in
// a build without cpp-httplib.
#include <memory>

#include "pagoda/cli/commands.h"
#include "pagoda/cli/engine_options.h"
#include "pagoda/core/error.h"
#ifdef PAGODA_CLI_HAVE_SERVER
#include "pagoda/server/router.h"
#endif

namespace pagoda::cli {

namespace {
struct RouterCliOptions {
  std::vector<std::string> prefill, decode;
  std::string host = "127.0.0.1";
  int port = 30000;
  std::string policy = "round_robin";
  int max_retries = 2;
  double timeout = 600;
  int threads = 128;
};
}  // namespace

void add_router_command(CLI::App& app) {
  auto o = std::make_shared<RouterCliOptions>();
  auto* cmd = app.add_subcommand(
      "router", "OpenAI-compatible front of prefill–decode disaggregation: picks a prefill and a "
                "decode `pagoda serve` per request and streams the decode server's answer");
  cmd->add_option("--prefill", o->prefill, "prefill servers (http://HOST:PORT, one or more)")
      ->required();
  cmd->add_option("--decode", o->decode, "decode servers (http://HOST:PORT, one or more)")
      ->required();
  add_listen_options(cmd, o->host, o->port, o->threads, "HTTP threads");
  cmd->add_option("--policy", o->policy, "round_robin or least_load")
      ->check(CLI::IsMember({"round_robin", "least_load"}))
      ->capture_default_str();
  cmd->add_option("--max-retries", o->max_retries,
                  "other pairs tried when one fails before the first token")
      ->capture_default_str();
  cmd->add_option("--timeout", o->timeout, "seconds to wait for an upstream byte")
      ->capture_default_str();
  cmd->callback([o] {
#ifdef PAGODA_CLI_HAVE_SERVER
    server::RouterOptions r;
    r.prefill = o->prefill;
    r.decode = o->decode;
    r.host = o->host;
    r.port = o->port;
    r.policy = o->policy;
    r.max_retries = o->max_retries;
    r.timeout_s = o->timeout;
    r.threads = o->threads;
    const int rc = server::run_router(r);
    if (rc != 0) throw_error(ErrorCode::kInternal, "the router stopped with an error");
#else
    throw_error(ErrorCode::kUnsupported,
                "`pagoda router` is unavailable in this build: cpp-httplib was not found at "
                "configure time (apt install libcpp-httplib-dev, then reconfigure)");
#endif
  });
}

}  // namespace pagoda::cli
