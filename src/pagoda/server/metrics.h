#pragma once
/// Server metrics in the Prometheus text exposition format (GET /metrics): latency histograms
/// (TTFT, TPOT, end-to-end), token and request counters, and the engine gauges of the last
/// snapshot. Thread safe: every method takes the one mutex.

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "pagoda/engine/engine.h"

namespace pagoda::server {

/// A cumulative histogram with fixed upper bounds (seconds).
struct Histogram {
  std::vector<double> bounds;
  std::vector<int64_t> counts;  ///< per bucket (not cumulative); last = +Inf
  double sum = 0;
  int64_t count = 0;
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
};

/// What the engine thread reports about its state (read between steps).
struct EngineSnapshot {
  engine::EngineStats stats;
  int64_t leaked_pages = 0;
  int64_t leaked_rows = 0;
  int64_t inflight = 0;  ///< requests submitted and not finished
};

class ServerMetrics {
 public:
  ServerMetrics();
  /// One finished request (engine thread): prompt and output lengths, seconds.
  void observe_request(int64_t prompt_tokens, int64_t output_tokens, double ttft_s,
                       double tpot_s, double e2e_s);
  /// One HTTP answer of an API endpoint with `status` (HTTP threads).
  void count_response(int status);
  /// The Prometheus text, with the gauges of `snap`.
  std::string render(const EngineSnapshot& snap) const;

 private:
  mutable std::mutex mu_;
  Histogram ttft_, tpot_, e2e_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0, finished_ = 0;
  std::map<int, int64_t> responses_;
};

}  // namespace pagoda::server
