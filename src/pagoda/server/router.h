#pragma once
/// `pagoda router`: the OpenAI-compatible front of a disaggregated deployment (docs/design/pd.md).
/// For each POST /v1/completions or /v1/chat/completions it picks a prefill and a decode server
/// (round robin, or least load: fewest requests this router has in flight on them), stamps the
/// request with a random 63-bit room id and the prefill server's URL (pd.h's headers) and
/// forwards it to the decode server, streaming its answer back. A pair that fails before the
/// first token (connection refused, or 502 / 503 / 504: the decode server had no room, or the
/// prefill server failed or timed out) is retried on another pair, up to max_retries times;
/// after the first byte of a 200 answer nothing is retried: a decode server that dies mid-stream
/// ends the stream with an OpenAI error event (non-streamed: 502). GET /v1/models comes from a
/// decode server; GET /health checks every server; GET /metrics has the router's counters.
/// Threads: httplib's pool runs the handlers; each forwarded request reads its upstream on a
/// thread of its own; SIGTERM / SIGINT stop the router.

#include <string>
#include <vector>

namespace pagoda::server {

struct RouterOptions {
  std::vector<std::string> prefill;  ///< prefill servers' base URLs (http://host:port)
  std::vector<std::string> decode;   ///< decode servers' base URLs
  std::string host = "127.0.0.1";
  int port = 30000;                  ///< 0: any free port (printed on stdout)
  std::string policy = "round_robin";  ///< or "least_load"
  int max_retries = 2;               ///< other pairs tried before the first token
  double timeout_s = 600;            ///< longest wait for an upstream byte
  int threads = 128;                 ///< HTTP threads
};

/// Validates `o` (Error(kInvalidArgument) naming the option), binds and routes until SIGTERM /
/// SIGINT. Prints "pagoda router: listening on http://HOST:PORT" on stdout once bound. Returns
/// the process exit status.
int run_router(const RouterOptions& o);

}  // namespace pagoda::server
