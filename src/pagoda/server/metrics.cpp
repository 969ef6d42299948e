// Prometheus text for `pagoda serve`.
#include "pagoda/server/metrics.h"

#include <fmt/format.h>

#include <initializer_list>
#include <utility>

namespace pagoda::server {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds(std::move(upper_bounds)), counts(bounds.size() + 1, 0) {}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds.size() && v > bounds[i]) ++i;
  ++counts[i];
  sum += v;
  ++count;
}

namespace {

std::vector<double> latency_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

void render_histogram(std::string& out, const char* name, const char* help, const Histogram& h) {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  int64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cumulative += h.counts[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, h.bounds[i], cumulative);
  }
  cumulative += h.counts.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cumulative,
                     name, h.sum, name, h.count);
}

void render_gauge(std::string& out, const char* name, const char* help, double v) {
  out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, v);
}

/// A counter family is named with its `_total` suffix in HELP, TYPE and the sample alike (text
/// format 0.0.4: the TYPE line names the samples that follow).
void render_counter(std::string& out, const char* name, const char* help, int64_t v) {
  out += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, v);
}

/// A counter family with one sample per label value.
void render_labeled_counter(std::string& out, const char* name, const char* help, const char* label,
                            std::initializer_list<std::pair<const char*, int64_t>> samples) {
  out += fmt::format("# HELP {} {}\n# TYPE {} counter\n", name, help, name);
  for (const auto& [value, n] : samples)
    out += fmt::format("{}{{{}=\"{}\"}} {}\n", name, label, value, n);
}

/// The hierarchical KV cache's gauges and counters (docs/design/tier.md).
void render_hicache(std::string& out, const tier::TierStats& t) {
  render_gauge(out, "pagoda_hicache_host_pages_used", "Host-tier KV pages holding a prefix page.",
               static_cast<double>(t.host_pages));
  render_gauge(out, "pagoda_hicache_host_pages_free", "Host-tier KV pages free.",
               static_cast<double>(t.host_capacity_pages - t.host_pages));
  render_labeled_counter(out, "pagoda_hicache_hit_tokens_total",
                         "Admitted prefix tokens by the tier they were found in.", "tier",
                         {{"device", t.device_hit_tokens},
                          {"host", t.host_hit_tokens},
                          {"storage", t.storage_hit_tokens}});
  render_labeled_counter(out, "pagoda_hicache_copied_bytes_total",
                         "KV bytes copied between the device and the host tier.", "direction",
                         {{"backup", t.transfer.bytes_d2h}, {"load", t.transfer.bytes_h2d}});
  render_counter(out, "pagoda_hicache_load_stalls_total",
                 "Layer waits that found their load-back unfinished.", t.transfer.load_stalls);
  render_counter(out, "pagoda_hicache_load_skipped_tokens_total",
                 "Host or storage hits recomputed: no device room for the load-back.",
                 t.load_skipped_tokens);
  render_counter(out, "pagoda_hicache_host_evicted_pages_total",
                 "Pages evicted from the host tier (kept in storage when there is one).",
                 t.host_evicted_pages);
  if (!t.has_storage) return;
  render_labeled_counter(out, "pagoda_hicache_storage_bytes_total",
                         "KV page bytes read from and written to the storage tier.", "direction",
                         {{"read", t.storage.bytes_read}, {"written", t.storage.bytes_written}});
  render_labeled_counter(out, "pagoda_hicache_storage_errors_total",
                         "Storage-tier failures: io (unreachable, timed out, an error answer), "
                         "put (a failed write), corrupt (a page failing its checksum).",
                         "kind",
                         {{"io", t.storage.errors},
                          {"put", t.storage.put_errors},
                          {"corrupt", t.storage.corrupt_pages}});
  render_counter(out, "pagoda_hicache_prefetch_pages_total",
                 "Pages the storage read-ahead brought into the host tier.", t.prefetch_pages);
}

}  // namespace

ServerMetrics::ServerMetrics()
    : ttft_(latency_bounds()), tpot_(latency_bounds()), e2e_(latency_bounds()) {}

void ServerMetrics::observe_request(int64_t prompt_tokens, int64_t output_tokens, double ttft_s,
                                    double tpot_s, double e2e_s) {
  std::lock_guard lock(mu_);
  prompt_tokens_ += prompt_tokens;
  generation_tokens_ += output_tokens;
  ++finished_;
  if (ttft_s >= 0) ttft_.observe(ttft_s);
  if (tpot_s >= 0) tpot_.observe(tpot_s);
  if (e2e_s >= 0) e2e_.observe(e2e_s);
}

void ServerMetrics::count_response(int status) {
  std::lock_guard lock(mu_);
  ++responses_[status];
}

std::string ServerMetrics::render(const EngineSnapshot& snap) const {
  std::lock_guard lock(mu_);
  std::string out;
  const engine::EngineStats& s = snap.stats;
  render_gauge(out, "pagoda_requests_running", "Requests prefilling or decoding.",
               static_cast<double>(s.num_running));
  render_gauge(out, "pagoda_requests_waiting", "Requests queued in the engine.",
               static_cast<double>(s.num_waiting));
  render_gauge(out, "pagoda_requests_inflight", "Requests accepted and not finished.",
               static_cast<double>(snap.inflight));
  render_gauge(out, "pagoda_kv_pages_total", "Usable KV pages.", static_cast<double>(s.pages_total));
  render_gauge(out, "pagoda_kv_pages_used", "KV pages not on the free list.",
               static_cast<double>(s.pages_total - s.pages_free));
  render_gauge(out, "pagoda_kv_pages_cached", "KV pages held by the prefix cache.",
               static_cast<double>(s.pages_cached));
  render_gauge(out, "pagoda_kv_pages_leaked", "Page references held by nobody (0 unless a bug).",
               static_cast<double>(snap.leaked_pages));
  render_gauge(out, "pagoda_prefix_hit_rate", "Prompt tokens reused from the prefix cache / requested.",
               s.prefix_hit_rate());
  render_counter(out, "pagoda_prompt_tokens_total", "Prompt tokens of finished requests.", prompt_tokens_);
  render_counter(out, "pagoda_generation_tokens_total", "Tokens generated for finished requests.",
                 generation_tokens_);
  render_counter(out, "pagoda_requests_finished_total", "Requests the engine finished (any reason).",
                 finished_);
  render_counter(out, "pagoda_retractions_total",
                 "Running requests moved back to the queue for lack of KV memory (their KV is "
                 "recomputed).",
                 s.scheduler.retractions);
  out += "# HELP pagoda_http_responses_total HTTP answers of the API endpoints by status.\n"
         "# TYPE pagoda_http_responses_total counter\n";
  for (const auto& [status, n] : responses_)
    out += fmt::format("pagoda_http_responses_total{{status=\"{}\"}} {}\n", status, n);
  if (s.hicache) render_hicache(out, s.tier);
  render_histogram(out, "pagoda_time_to_first_token_seconds", "Arrival to first token.", ttft_);
  render_histogram(out, "pagoda_time_per_output_token_seconds",
                   "Mean time between output tokens of a request.", tpot_);
  render_histogram(out, "pagoda_e2e_request_latency_seconds", "Arrival to finish.", e2e_);
  return out;
}

}  // namespace pagoda::server
