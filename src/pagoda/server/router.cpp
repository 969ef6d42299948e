// `pagoda router`: pair selection, room ids, forwarding with retries before the first token,
// streaming passthrough (router.h).
#include "pagoda/server/router.h"

#include <httplib.h>
#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/server/api_request.h"
#include "pagoda/server/http_server.h"
#include "pagoda/server/pd.h"
#include "pagoda/server/server_state.h"

namespace pagoda::server {

using nlohmann::json;

namespace {

constexpr int kConnectTimeoutS = 5;
constexpr int kHealthTimeoutS = 2;
/// How long a streamed answer waits for the decode server's next chunk before checking again.
constexpr int kRelayWaitMs = 200;

struct Backend {
  std::string url;
  std::atomic<int64_t> inflight{0};
  std::atomic<int64_t> requests{0};
  std::atomic<int64_t> failures{0};
};

class Balancer {
 public:
  Balancer(const std::vector<std::string>& urls, bool least_load) : least_load_(least_load) {
    for (const std::string& u : urls) {
      backends_.push_back(std::make_unique<Backend>());
      backends_.back()->url = u;
    }
  }
  /// The next backend not in `exclude` (any, when all are excluded).
  Backend* pick(const std::set<Backend*>& exclude) {
    const size_t n = backends_.size();
    const size_t start = next_.fetch_add(1) % n;
    Backend* best = nullptr;
    for (size_t i = 0; i < n; ++i) {
      Backend* b = backends_[(start + i) % n].get();
      if (exclude.count(b) != 0) continue;
      if (!least_load_) return b;
      if (best == nullptr || b->inflight < best->inflight) best = b;
    }
    return best != nullptr ? best : backends_[start].get();
  }
  const std::vector<std::unique_ptr<Backend>>& backends() const { return backends_; }

 private:
  bool least_load_;
  std::vector<std::unique_ptr<Backend>> backends_;
  std::atomic<uint64_t> next_{0};
};

struct Router {
  RouterOptions options;
  Balancer prefill, decode;
  std::atomic<int64_t> requests{0}, retries{0}, failed{0};
  std::mutex rng_mu;
  std::mt19937_64 rng{std::random_device{}()};
  Router(const RouterOptions& o)
      : options(o), prefill(o.prefill, o.policy == "least_load"),
        decode(o.decode, o.policy == "least_load") {}
  uint64_t room() {
    std::lock_guard lock(rng_mu);
    return rng() >> 1;  // 63 bits
  }
};

/// One forwarded request: the decode server's answer as its reading thread receives it.
struct Upstream {
  std::mutex mu;
  std::condition_variable cv;
  bool have_status = false, done = false, failed = false;
  int status = 0;
  std::string content_type, error;
  std::deque<std::string> chunks;
  std::atomic<bool> cancel{false};

  /// Waits for the status line (or the end); false when the request failed before it.
  bool wait_status() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return have_status || done; });
    return have_status;
  }
  /// Waits for the end and returns the whole body.
  std::string wait_body() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return done; });
    std::string body;
    for (const std::string& c : chunks) body += c;
    chunks.clear();
    return body;
  }
};

/// Starts the POST on a thread of its own; the returned state fills in as the answer arrives.
std::shared_ptr<Upstream> start_upstream(const Router& r, const std::string& url,
                                         const httplib::Request& in, uint64_t room,
                                         const std::string& prefill_url) {
  auto up = std::make_shared<Upstream>();
  httplib::Request req;
  req.method = "POST";
  req.path = in.path;
  req.body = in.body;
  req.headers.emplace("Content-Type", "application/json");
  if (in.has_header("Authorization"))
    req.headers.emplace("Authorization", in.get_header_value("Authorization"));
  req.headers.emplace(kRoomHeader, std::to_string(room));
  req.headers.emplace(kPrefillHeader, prefill_url);
  const double timeout = r.options.timeout_s;
  std::thread([up, url, timeout, req = std::move(req)]() mutable {
    httplib::Client cli(url);
    cli.set_connection_timeout(kConnectTimeoutS, 0);
    const auto sec = static_cast<time_t>(timeout);
    cli.set_read_timeout(sec, static_cast<time_t>((timeout - static_cast<double>(sec)) * 1e6));
    req.response_handler = [&up](const httplib::Response& res) {
      {
        std::lock_guard lock(up->mu);
        up->status = res.status;
        up->content_type = res.get_header_value("Content-Type");
        up->have_status = true;
      }
      up->cv.notify_all();
      return !up->cancel;
    };
    req.content_receiver = [&up](const char* data, size_t n, uint64_t, uint64_t) {
      {
        std::lock_guard lock(up->mu);
        up->chunks.emplace_back(data, n);
      }
      up->cv.notify_all();
      return !up->cancel;
    };
    const httplib::Result res = cli.send(req);
    {
      std::lock_guard lock(up->mu);
      up->done = true;
      up->failed = !res;
      if (!res) up->error = httplib::to_string(res.error());
    }
    up->cv.notify_all();
  }).detach();
  return up;
}

/// Holds a pair's in-flight counts for as long as a forwarded request runs.
struct Lease {
  Backend* p;
  Backend* d;
  Lease(Backend* prefill, Backend* decode) : p(prefill), d(decode) {
    ++p->inflight;
    ++d->inflight;
    ++p->requests;
    ++d->requests;
  }
  ~Lease() {
    --p->inflight;
    --d->inflight;
  }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
};

std::string error_event(const std::string& message) {
  return "data: " + ApiError(502, "server_error", message).to_json() + "\n\ndata: [DONE]\n\n";
}

void forward(Router& r, const httplib::Request& req, httplib::Response& res) {
  ++r.requests;
  const json body = json::parse(req.body, nullptr, false);
  const bool stream = body.is_object() && body.value("stream", false) == true;
  std::set<Backend*> bad_p, bad_d;
  std::string last_error = "no attempt";
  for (int attempt = 0; attempt <= r.options.max_retries; ++attempt) {
    if (attempt > 0) ++r.retries;
    Backend* p = r.prefill.pick(bad_p);
    Backend* d = r.decode.pick(bad_d);
    auto lease = std::make_shared<Lease>(p, d);
    auto up = start_upstream(r, d->url, req, r.room(), p->url);
    if (!up->wait_status()) {  // the decode server is unreachable
      ++d->failures;
      bad_d.insert(d);
      last_error = "decode server " + d->url + " unreachable (" + up->error + ")";
      continue;
    }
    if (up->status == 502 || up->status == 503 || up->status == 504) {
      // Before the first token: the pair failed (no room on the decode server, or the prefill
      // server failed or timed out). Try another pair.
      const std::string answer = up->wait_body();
      (up->status == 503 ? d : p)->failures++;
      (up->status == 503 ? bad_d : bad_p).insert(up->status == 503 ? d : p);
      const json j = json::parse(answer, nullptr, false);
      last_error = j.is_object() && j.contains("error") && j["error"].is_object()
                       ? j["error"].value("message", answer)
                       : answer;
      if (attempt < r.options.max_retries) continue;
      ++r.failed;
      res.status = up->status;
      res.set_content(answer, up->content_type.empty() ? "application/json" : up->content_type);
      return;
    }
    if (up->status != 200 || !stream) {
      const std::string answer = up->wait_body();
      bool failed = false;
      {
        std::lock_guard lock(up->mu);
        failed = up->failed;
      }
      if (failed) {  // the decode server died mid-answer
        ++d->failures;
        ++r.failed;
        set_error(res, ApiError(502, "server_error",
                                "decode server " + d->url + " failed mid-answer (" + up->error + ")"));
        return;
      }
      res.status = up->status;
      res.set_content(answer, up->content_type.empty() ? "application/json" : up->content_type);
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [up, d, &r](size_t, httplib::DataSink& sink) {
          std::unique_lock lock(up->mu);
          up->cv.wait_for(lock, std::chrono::milliseconds(kRelayWaitMs),
                          [&] { return !up->chunks.empty() || up->done; });
          std::deque<std::string> chunks;
          chunks.swap(up->chunks);
          const bool done = up->done, failed = up->failed;
          const std::string error = up->error;
          lock.unlock();
          for (const std::string& c : chunks)
            if (!sink.write(c.data(), c.size())) return false;
          if (done) {
            if (failed) {
              ++d->failures;
              ++r.failed;
              const std::string ev = error_event("decode server " + d->url +
                                                 " failed mid-stream (" + error + ")");
              sink.write(ev.data(), ev.size());
            }
            sink.done();
          }
          return true;
        },
        [up, lease](bool) { up->cancel = true; });
    return;
  }
  ++r.failed;
  set_error(res, ApiError(502, "server_error",
                          "no prefill/decode pair answered (" + last_error + ")"));
}

json health_of(const std::string& url) {
  httplib::Client cli(url);
  cli.set_connection_timeout(kHealthTimeoutS, 0);
  cli.set_read_timeout(kHealthTimeoutS, 0);
  const httplib::Result res = cli.Get("/health");
  if (!res) return {{"url", url}, {"status", "unreachable"}};
  json h = json::parse(res->body, nullptr, false);
  if (!h.is_object()) h = json::object();
  h["url"] = url;
  if (res->status != 200 && !h.contains("status")) h["status"] = "HTTP " + std::to_string(res->status);
  return h;
}

std::string render_metrics(const Router& r) {
  std::string out = fmt::format(
      "# HELP pagoda_router_requests_total Requests received.\n"
      "# TYPE pagoda_router_requests_total counter\npagoda_router_requests_total {}\n"
      "# HELP pagoda_router_retries_total Requests retried on another pair before the first "
      "token.\n# TYPE pagoda_router_retries_total counter\npagoda_router_retries_total {}\n"
      "# HELP pagoda_router_failed_total Requests answered with an error by the router.\n"
      "# TYPE pagoda_router_failed_total counter\npagoda_router_failed_total {}\n",
      r.requests.load(), r.retries.load(), r.failed.load());
  out += "# HELP pagoda_router_backend_inflight Requests in flight per server.\n"
         "# TYPE pagoda_router_backend_inflight gauge\n";
  std::string requests = "# HELP pagoda_router_backend_requests_total Requests routed per server.\n"
                         "# TYPE pagoda_router_backend_requests_total counter\n";
  std::string failures = "# HELP pagoda_router_backend_failures_total Failures seen per server.\n"
                         "# TYPE pagoda_router_backend_failures_total counter\n";
  for (const auto* bal : {&r.prefill, &r.decode}) {
    const char* role = bal == &r.prefill ? "prefill" : "decode";
    for (const auto& b : bal->backends()) {
      const std::string labels = fmt::format("{{role=\"{}\",url=\"{}\"}}", role, b->url);
      out += fmt::format("pagoda_router_backend_inflight{} {}\n", labels, b->inflight.load());
      requests += fmt::format("pagoda_router_backend_requests_total{} {}\n", labels,
                              b->requests.load());
      failures += fmt::format("pagoda_router_backend_failures_total{} {}\n", labels,
                              b->failures.load());
    }
  }
  return out + requests + failures;
}

void validate(const RouterOptions& o) {
  PAGODA_REQUIRE(!o.prefill.empty(), kInvalidArgument, "--prefill: at least one server URL");
  PAGODA_REQUIRE(!o.decode.empty(), kInvalidArgument, "--decode: at least one server URL");
  for (const auto* list : {&o.prefill, &o.decode})
    for (const std::string& u : *list)
      PAGODA_REQUIRE(httplib::Client(u).is_valid() && u.rfind("http://", 0) == 0,
                     kInvalidArgument, "'{}' is not an http://HOST:PORT URL", u);
  PAGODA_REQUIRE(o.policy == "round_robin" || o.policy == "least_load", kInvalidArgument,
                 "--policy must be round_robin or least_load (got '{}')", o.policy);
  PAGODA_REQUIRE(o.port >= 0 && o.port <= 65535, kInvalidArgument, "--port must be in [0, 65535]");
  PAGODA_REQUIRE(o.max_retries >= 0 && o.max_retries <= 16, kInvalidArgument,
                 "--max-retries must be in [0, 16]");
  PAGODA_REQUIRE(o.timeout_s > 0, kInvalidArgument, "--timeout must be > 0");
  PAGODA_REQUIRE(o.threads >= 1 && o.threads <= 4096, kInvalidArgument,
                 "--threads must be in [1, 4096]");
}

}  // namespace

int run_router(const RouterOptions& o) {
  validate(o);
  // SIGTERM / SIGINT go to one thread (sigwait): every thread started from here blocks them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  Router router(o);
  httplib::Server svr;
  svr.new_task_queue = [&o] { return new httplib::ThreadPool(static_cast<size_t>(o.threads)); };
  svr.set_read_timeout(30);
  svr.set_write_timeout(30);
  for (const char* path : {"/v1/completions", "/v1/chat/completions"})
    svr.Post(path, [&](const httplib::Request& req, httplib::Response& res) {
      forward(router, req, res);
    });
  svr.Get("/v1/models", [&](const httplib::Request& req, httplib::Response& res) {
    for (const auto& d : router.decode.backends()) {
      httplib::Client cli(d->url);
      cli.set_connection_timeout(kHealthTimeoutS, 0);
      httplib::Headers h;
      if (req.has_header("Authorization"))
        h.emplace("Authorization", req.get_header_value("Authorization"));
      if (const httplib::Result r = cli.Get("/v1/models", h)) {
        res.status = r->status;
        res.set_content(r->body, "application/json");
        return;
      }
    }
    set_error(res, ApiError(502, "server_error", "no decode server answered /v1/models"));
  });
  svr.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    json h = {{"status", "ok"}, {"prefill", json::array()}, {"decode", json::array()}};
    for (const auto* bal : {&router.prefill, &router.decode})
      for (const auto& b : bal->backends()) {
        json one = health_of(b->url);
        if (one.value("status", "") != "ok") h["status"] = "degraded";
        h[bal == &router.prefill ? "prefill" : "decode"].push_back(std::move(one));
      }
    res.status = h["status"] == "ok" ? 200 : 503;
    res.set_content(h.dump(), "application/json");
  });
  svr.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(render_metrics(router), "text/plain; version=0.0.4");
  });

  const int port = bind_listener(svr, o.host, o.port);
  std::printf("pagoda router: listening on http://%s:%d (%zu prefill, %zu decode, %s)\n",
              o.host.c_str(), port, o.prefill.size(), o.decode.size(), o.policy.c_str());
  std::fflush(stdout);
  std::atomic<bool> signalled{false};
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    signalled = true;
    svr.stop();
  });
  const bool ok = svr.listen_after_bind();
  if (!signalled) pthread_kill(signal_thread.native_handle(), SIGTERM);  // wakes sigwait
  signal_thread.join();
  return ok ? 0 : 1;
}

}  // namespace pagoda::server
