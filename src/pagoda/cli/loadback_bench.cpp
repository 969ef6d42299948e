#include "pagoda/cli/loadback_bench.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "pagoda/cli/commands.h"
#include "pagoda/cli/kernel_options_flag.h"
#include "pagoda/core/error.h"
#include "pagoda/engine/engine.h"
#include "pagoda/model/llama.h"
#include "pagoda/model/weights.h"

namespace pagoda::cli {

namespace {

constexpr const char* kCases[] = {"cold", "device", "host"};

struct Sample {
  double ttft_s = 0.0;
  int64_t computed = 0;    ///< tokens the engine computed for the request
  int64_t host_hit = 0;    ///< prefix tokens the host tier served
  int64_t bytes_h2d = 0;   ///< bytes loaded back for it
};

/// One request of `prompt` with one output token on the idle engine `eng`; its TTFT and the
/// counters it moved.
Sample time_request(engine::Engine& eng, const std::vector<int32_t>& prompt) {
  const engine::EngineStats before = eng.stats();
  const engine::RequestId id =
      eng.add_request({.prompt = prompt, .max_new_tokens = 1, .ignore_eos = true});
  eng.run_until_idle();
  const engine::RequestOutput out = eng.output(id);
  PAGODA_REQUIRE(out.finish_reason != engine::FinishReason::kError, kInternal,
                 "loadback probe: the request failed: {}", out.error);
  eng.release(id);
  const engine::EngineStats after = eng.stats();
  return {.ttft_s = out.first_token_s - out.arrival_s,
          .computed = after.computed_tokens - before.computed_tokens,
          .host_hit = after.tier.host_hit_tokens - before.tier.host_hit_tokens,
          .bytes_h2d = after.tier.transfer.bytes_h2d - before.tier.transfer.bytes_h2d};
}

nlohmann::json spread_ms(std::vector<double> s) {
  std::sort(s.begin(), s.end());
  return {{"median", s[s.size() / 2] * 1e3}, {"min", s.front() * 1e3}, {"max", s.back() * 1e3},
          {"samples", s}};
}

}  // namespace

void run_loadback_bench(const LoadbackBenchArgs& a) {
  PAGODA_REQUIRE(a.engine.hicache.enabled() && a.engine.hicache.storage.empty(), kInvalidArgument,
                 "--workload loadback needs the host tier (--hicache-ratio or --hicache-size) "
                 "and no --hicache-storage");
  PAGODA_REQUIRE(a.engine.page_size >= 1 && a.prefix_len >= a.engine.page_size &&
                     a.prefix_len % a.engine.page_size == 0,
                 kInvalidArgument,
                 "--workload loadback: --input-len (the prefix) must be a positive multiple of "
                 "--page-size ({}), got {}",
                 a.engine.page_size, a.prefix_len);
  PAGODA_REQUIRE(a.extend_len >= 1 && a.rounds >= 1, kInvalidArgument,
                 "--workload loadback: --user-len and --requests (rounds) must be >= 1");
  auto platform = engine::make_platform(a.engine);
  const engine::EngineConfig cfg = engine::make_engine_config(a.engine, *platform);
  model::LoadedModel loaded = model::load_model(a.model, a.weight_seed);
  model::LlamaModel llama(loaded.config, std::move(loaded.weights));
  engine::Engine eng(llama, cfg, platform.get());

  std::mt19937_64 rng(a.seed);
  const auto vocab = static_cast<uint64_t>(loaded.config.vocab_size);
  auto random_tokens = [&](int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
    return t;
  };
  std::vector<std::vector<Sample>> samples(3);
  for (int r = 0; r <= a.rounds; ++r) {  // round 0 warms up
    std::vector<int32_t> prefix = random_tokens(a.prefix_len);
    if (loaded.config.bos_token_id >= 0) prefix.front() = loaded.config.bos_token_id;
    auto prompt = [&] {
      std::vector<int32_t> p = prefix;
      const std::vector<int32_t> s = random_tokens(a.extend_len);
      p.insert(p.end(), s.begin(), s.end());
      return p;
    };
    eng.memory().drain_prefix_cache();
    eng.memory().drain_host_cache();
    const Sample cold = time_request(eng, prompt());
    const Sample device = time_request(eng, prompt());
    eng.memory().drain_prefix_cache();  // the host tier keeps its copies
    const Sample host = time_request(eng, prompt());
    PAGODA_REQUIRE(host.host_hit == a.prefix_len && device.computed == a.extend_len, kInternal,
                   "loadback probe round {}: the host tier served {} of the {} prefix tokens "
                   "and the device case computed {} tokens (expected {}): the cases do not "
                   "time what they name",
                   r, host.host_hit, a.prefix_len, device.computed, a.extend_len);
    if (r == 0) continue;
    samples[0].push_back(cold);
    samples[1].push_back(device);
    samples[2].push_back(host);
  }
  eng.memory().drain_prefix_cache();
  eng.memory().drain_host_cache();
  PAGODA_REQUIRE(eng.memory().leaked_pages() == 0 && eng.memory().leaked_host_pages() == 0,
                 kInternal, "loadback probe: {} device and {} host page references leaked",
                 eng.memory().leaked_pages(), eng.memory().leaked_host_pages());

  auto ttfts = [&](int c) {
    std::vector<double> v;
    for (const Sample& s : samples[static_cast<size_t>(c)]) v.push_back(s.ttft_s);
    return v;
  };
  nlohmann::json j = {{"workload", "loadback"},
                      {"model", loaded.config.name},
                      {"backend", eng.worker().backend_name()},
                      {"kernel_options", kernel_options_json(a.engine.backend.kernels)},
                      {"page_size", a.engine.page_size},
                      {"prefix_tokens", a.prefix_len},
                      {"extend_tokens", a.extend_len},
                      {"rounds", a.rounds},
                      {"load_bytes", samples[2].front().bytes_h2d}};
  for (int c = 0; c < 3; ++c) j["ttft_ms"][kCases[c]] = spread_ms(ttfts(c));
  const double cold = j["ttft_ms"]["cold"]["median"], device = j["ttft_ms"]["device"]["median"],
               host = j["ttft_ms"]["host"]["median"];
  j["host_over_device"] = host / device;
  j["cold_over_host"] = cold / host;
  j["load_gbps_lower_bound"] = static_cast<double>(samples[2].front().bytes_h2d) / (host * 1e6);
  if (a.json) {
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  fmt::print("pagoda bench --workload loadback: model {}, backend {}, prefix {} + extend {} "
             "tokens, {} rounds\n",
             loaded.config.name, eng.worker().backend_name(), a.prefix_len, a.extend_len,
             a.rounds);
  for (const char* c : kCases) {
    const auto& t = j["ttft_ms"][c];
    fmt::print("  {:<8} TTFT {:9.3f} ms  [{:.3f} .. {:.3f}]\n", c, t["median"].get<double>(),
               t["min"].get<double>(), t["max"].get<double>());
  }
  fmt::print("  host / device {:.3f}x, cold / host {:.2f}x, {:.1f} MB loaded back "
             "(>= {:.1f} GB/s)\n",
             host / device, cold / host, static_cast<double>(samples[2].front().bytes_h2d) / 1e6,
             j["load_gbps_lower_bound"].get<double>());
}

}  // namespace pagoda::cli
