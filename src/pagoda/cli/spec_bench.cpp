#include "pagoda/cli/spec_bench.h"

#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "pagoda/cli/commands.h"
#include "pagoda/cli/kernel_options_flag.h"
#include "pagoda/core/error.h"

namespace pagoda::cli {

namespace {

std::vector<std::vector<int32_t>> make_prompts(const SpecBenchArgs& a, int32_t bos,
                                               int32_t vocab) {
  std::mt19937_64 rng(a.seed);
  const uint64_t v = static_cast<uint64_t>(std::min<int32_t>(vocab, 32000));
  std::vector<std::vector<int32_t>> out;
  for (int r = 0; r < a.requests; ++r) {
    std::vector<int32_t> p;
    if (bos >= 0) p.push_back(bos);
    if (a.workload == "random") {
      while (static_cast<int>(p.size()) < a.input_len) p.push_back(static_cast<int32_t>(rng() % v));
    } else {  // repeat: span + a prefix of the span (at least half of it)
      const int span = std::max(2, a.input_len * 2 / 3);
      std::vector<int32_t> s(static_cast<size_t>(span));
      for (auto& x : s) x = static_cast<int32_t>(rng() % v);
      p.insert(p.end(), s.begin(), s.end());
      const int cut = span / 2 + static_cast<int>(rng() % static_cast<uint64_t>(span / 2 + 1));
      p.insert(p.end(), s.begin(), s.begin() + std::min(cut, a.input_len - span));
    }
    out.push_back(std::move(p));
  }
  return out;
}

struct RunResult {
  double wall_s = 0.0;
  int64_t out_tokens = 0;
  std::vector<std::vector<int32_t>> outputs;
  engine::EngineStats stats;
  int64_t leaked = 0;
};

RunResult run_once(const SpecBenchArgs& a, model::LlamaModel& llama, platform::Platform& platform,
                   const engine::EngineConfig& cfg,
                   const std::vector<std::vector<int32_t>>& prompts) {
  TpRunner tp = start_tp(a.tp, platform, a.model, a.weight_seed);  // outlives the engine
  engine::Engine eng(llama, cfg, &platform, tp.factory(platform));
  {  // warm-up (first-touch allocations, lazy plans): not timed
    eng.add_request({.prompt = prompts.front(), .max_new_tokens = 8, .ignore_eos = true});
    eng.run_until_idle();
  }
  const engine::EngineStats before = eng.stats();
  std::vector<engine::RequestId> ids;
  for (const auto& p : prompts)
    ids.push_back(eng.add_request({.prompt = p, .max_new_tokens = a.output_len, .ignore_eos = true}));
  const auto t0 = std::chrono::steady_clock::now();
  eng.run_until_idle();
  RunResult r;
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto id : ids) {
    r.outputs.push_back(eng.output(id).output_ids);
    r.out_tokens += static_cast<int64_t>(r.outputs.back().size());
  }
  r.stats = eng.stats();
  // Counters of the timed part only.
  r.stats.spec_steps -= before.spec_steps;
  r.stats.spec -= before.spec;
  r.stats.decode_steps -= before.decode_steps;
  r.stats.spec_graph_steps -= before.spec_graph_steps;
  r.stats.draft_forwards -= before.draft_forwards;
  r.stats.draft_graph_steps -= before.draft_graph_steps;
  r.stats.spec_time -= before.spec_time;
  r.leaked = eng.memory().leaked_pages();
  return r;
}

}  // namespace

void run_spec_bench(const SpecBenchArgs& a) {
  PAGODA_REQUIRE(a.workload == "repeat" || a.workload == "random", kInvalidArgument,
                 "--workload must be chat, repeat or random (got '{}')", a.workload);
  PAGODA_REQUIRE(a.requests >= 1 && a.input_len >= 2 && a.output_len >= 1, kInvalidArgument,
                 "--requests >= 1, --input-len >= 2 and --output-len >= 1 are needed");
  auto platform = engine::make_platform(a.engine);
  const engine::EngineConfig cfg = engine::make_engine_config(a.engine, *platform);
  SpecDraft draft;
  engine::EngineConfig spec_cfg = cfg;
  spec_cfg.spec = make_spec_config(a.spec, draft);  // checks the options before loading
  if (spec_cfg.spec.mode != engine::SpecMode::kEagle) spec_cfg.validate();
  model::LoadedModel loaded = model::load_model(a.model, a.weight_seed);
  model::LlamaModel llama(loaded.config, std::move(loaded.weights));
  if (spec_cfg.spec.mode == engine::SpecMode::kEagle) {  // the head needs the target
    spec_cfg.spec = make_spec_config(a.spec, draft, &llama);
    spec_cfg.validate();
  }
  const auto prompts = make_prompts(a, loaded.config.bos_token_id, loaded.config.vocab_size);

  const RunResult base = run_once(a, llama, *platform, cfg, prompts);
  const RunResult spec = run_once(a, llama, *platform, spec_cfg, prompts);
  int identical = 0;
  for (size_t i = 0; i < prompts.size(); ++i) identical += base.outputs[i] == spec.outputs[i];
  const double base_tps = static_cast<double>(base.out_tokens) / base.wall_s;
  const double spec_tps = static_cast<double>(spec.out_tokens) / spec.wall_s;
  nlohmann::json j = {
      {"model", loaded.config.name},
      {"backend", cfg.backend.attention},
      {"kernel_options", kernel_options_json(cfg.backend.kernels)},
      {"page_size", a.engine.page_size},
      {"tp", a.tp},
      {"workload", a.workload},
      {"requests", a.requests},
      {"max_running", a.engine.max_running},
      {"input_len", a.input_len},
      {"output_len", a.output_len},
      {"dtype", std::string(dtype_name(spec.stats.dtype))},
      {"device_path", spec.stats.device_path},
      {"baseline_output_tokens_per_s", base_tps},
      {"spec_output_tokens_per_s", spec_tps},
      {"speedup", spec_tps / base_tps},
      {"baseline_wall_s", base.wall_s},
      {"spec_wall_s", spec.wall_s},
      {"identical_outputs", identical},
      {"spec", spec_stats_json(spec_cfg, spec.stats)},
      {"plain_decode_steps_in_spec_run", spec.stats.decode_steps},
      {"leaked_pages", base.leaked + spec.leaked},
  };
  if (a.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    fmt::print("pagoda bench --spec {}: model {}, backend {}, page {}, tp {}, workload {}, {} "
               "requests ({} running), input {} / output {} tokens\n",
               a.spec.mode, loaded.config.name, cfg.backend.attention, a.engine.page_size, a.tp,
               a.workload, a.requests, a.engine.max_running, a.input_len, a.output_len);
    auto row = [](const char* name, const std::string& value) {
      fmt::print("  {:<28} {:>20}\n", name, value);
    };
    row("output tok/s (no spec)", fmt::format("{:.1f}", base_tps));
    row("output tok/s (spec)", fmt::format("{:.1f}", spec_tps));
    row("speed-up", fmt::format("{:.2f}x", spec_tps / base_tps));
    row("mean accept length", fmt::format("{:.2f}", spec.stats.spec.mean_accept_length()));
    row("accepted / drafted", fmt::format("{} / {}", spec.stats.spec.accepted,
                                          spec.stats.spec.draft_tokens));
    row("spec rounds / plain decodes",
        fmt::format("{} / {}", spec.stats.spec_steps, spec.stats.decode_steps));
    row("identical outputs", fmt::format("{} of {}", identical, a.requests));
    row("leaked pages", fmt::format("{}", base.leaked + spec.leaked));
  }
  PAGODA_REQUIRE(base.leaked == 0 && spec.leaked == 0, kInternal, "leaked KV pages after the run");
}

}  // namespace pagoda::cli
