// `pagoda generate`: one generation through the engine, streamed to the terminal (or one JSON
// object with --json).
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "pagoda/cli/commands.h"
#include "pagoda/cli/engine_options.h"
#include "pagoda/cli/spec_options.h"
#include "pagoda/core/error.h"
#include "pagoda/engine/engine.h"
#include "pagoda/model/llama.h"
#include "pagoda/model/safetensors.h"
#include "pagoda/tokenizer/byte_tokenizer.h"
#include "pagoda/tokenizer/incremental_detokenizer.h"
#include "pagoda/tokenizer/load.h"

namespace pagoda::cli {

namespace {

struct GenerateOptions {
  std::string model = "builtin";
  uint64_t weight_seed = 0;
  std::string prompt;
  std::string token_ids;
  std::string batch_file;
  int max_new_tokens = 32;
  float temperature = 0.f;
  int top_k = 0;
  float top_p = 1.f;
  uint64_t seed = 0;
  /// The engine; a pool_tokens or max_running of 0 (the defaults) is sized to the prompts.
  EngineOptions engine = [] {
    EngineOptions e;
    e.args.pool_tokens = 0;
    e.args.max_running = 0;
    return e;
  }();
  bool ignore_eos = false;
  bool json = false;
  bool dump_logits = false;
  float min_p = 0.f;
  int tp = 1;
  SpecOptions spec{};
};

std::vector<int32_t> parse_token_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    try {
      size_t used = 0;
      const long v = std::stol(item, &used);
      PAGODA_REQUIRE(used == item.size() && v >= 0 && v <= INT32_MAX, kInvalidArgument,
                     "bad token id '{}'", item);
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::logic_error&) {
      throw_error(ErrorCode::kInvalidArgument, "bad token id '{}'", item);
    }
  }
  return ids;
}

/// The engine configuration of the options. The pool holds at least `pool_tokens` (>= 4096)
/// and `max_running` requests run at once, unless --pool-tokens (or --kv-cache-memory /
/// --mem-fraction-static) / --max-running say otherwise.
engine::EngineConfig engine_config_for(const GenerateOptions& o, const platform::Platform& platform,
                                       int64_t pool_tokens, int32_t max_running,
                                       SpecDraft& draft,
                                       const model::LlamaModel* target = nullptr) {
  engine::EngineArgs args = o.engine.resolve();
  const bool from_memory = args.kv_cache_memory > 0 || args.mem_fraction_static > 0;
  if (args.pool_tokens == 0 && !from_memory)
    args.pool_tokens = std::max<int64_t>(4096, pool_tokens);
  if (args.max_running == 0) args.max_running = max_running;
  engine::EngineConfig cfg = engine::make_engine_config(args, platform);
  cfg.spec = make_spec_config(o.spec, draft, target);
  cfg.validate();
  return cfg;
}

/// --batch-file: every line's prompt (comma-separated ids) runs as one request of a single
/// batch; one JSON object per line on stdout, in file order.
void run_batch_file(const GenerateOptions& o, platform::Platform& platform,
                    model::LlamaModel& llama, const model::LoadedModel& loaded) {
  std::ifstream in(o.batch_file);
  PAGODA_REQUIRE(in.good(), kInvalidArgument, "cannot read --batch-file '{}'", o.batch_file);
  std::vector<std::vector<int32_t>> prompts;
  int64_t total = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    prompts.push_back(parse_token_ids(line));
    total += static_cast<int64_t>(prompts.back().size()) + o.max_new_tokens;
  }
  PAGODA_REQUIRE(!prompts.empty(), kInvalidArgument, "--batch-file '{}' has no prompts",
                 o.batch_file);
  SpecDraft draft;
  const engine::EngineConfig cfg = engine_config_for(
      o, platform, (total + o.engine.args.page_size * 2 * static_cast<int64_t>(prompts.size())) * 2,
      static_cast<int32_t>(std::min<size_t>(prompts.size(), 64)), draft, &llama);
  TpRunner tp = start_tp(o.tp, platform, o.model, o.weight_seed);
  engine::Engine eng(llama, cfg, &platform, tp.factory(platform));
  std::map<engine::RequestId, nlohmann::json> logits;
  if (o.dump_logits)
    eng.set_logits_observer([&](engine::RequestId id, std::span<const float> l) {
      logits[id].push_back(std::vector<float>(l.begin(), l.end()));
    });
  std::vector<engine::RequestId> ids;
  for (const auto& p : prompts)
    ids.push_back(eng.add_request(engine::GenerateRequest{
        .prompt = p,
        .max_new_tokens = o.max_new_tokens,
        .sampling = {.temperature = o.temperature, .top_k = o.top_k, .top_p = o.top_p,
                     .seed = o.seed, .min_p = o.min_p},
        .ignore_eos = o.ignore_eos,
        .extra_key = {}}));
  eng.run_until_idle();
  for (engine::RequestId id : ids) {
    const engine::RequestOutput out = eng.output(id);
    nlohmann::json j = {{"model", loaded.config.name},
                        {"backend", eng.worker().backend_name()},
                        {"output_token_ids", out.output_ids},
                        {"finish_reason", engine::finish_reason_name(out.finish_reason)}};
    if (!out.error.empty()) j["error"] = out.error;
    if (o.dump_logits) j["logits"] = std::move(logits[id]);
    std::printf("%s\n", j.dump().c_str());
  }
}

/// Every engine option (page size, pool, scheduler, speculation, backend names) checked before
/// the model or a draft model is loaded and before anything is allocated for them.
void validate_engine_options(const GenerateOptions& o) {
  GenerateOptions probe = o;
  if (probe.spec.mode == "draft") probe.spec.draft_model.clear();  // loaded later
  if (probe.spec.mode == "eagle") {  // the head is loaded later; check the numbers now
    PAGODA_REQUIRE(!probe.spec.draft_model.empty(), kInvalidArgument,
                   "--spec eagle needs --draft-model (an EAGLE head folder, or builtin)");
    probe.spec.mode = "draft";
    probe.spec.draft_model.clear();
  }
  SpecDraft none;
  auto platform = engine::make_platform(probe.engine.args);
  engine_config_for(probe, *platform, 4096, 4, none).validate();
}

void run_generate(const GenerateOptions& o) {
  prepare_host_threads();
  validate_engine_options(o);
  PAGODA_REQUIRE(o.batch_file.empty() || (o.prompt.empty() && o.token_ids.empty()),
                 kInvalidArgument, "--batch-file excludes --prompt and --token-ids");
  PAGODA_REQUIRE(!o.batch_file.empty() || o.prompt.empty() != o.token_ids.empty(), kInvalidArgument,
                 "give exactly one of --prompt and --token-ids");
  auto platform = engine::make_platform(o.engine.args);
  const model::LoadOptions load = engine::load_options(o.engine.args, *platform, o.tp > 1);
  if (!o.batch_file.empty()) {
    model::LoadedModel loaded = model::load_model(o.model, o.weight_seed, load);
    model::LlamaModel llama(loaded.config, std::move(loaded.weights));
    run_batch_file(o, *platform, llama, loaded);
    return;
  }
  model::LoadedModel loaded = model::load_model(o.model, o.weight_seed, load);
  model::LlamaModel llama(loaded.config, std::move(loaded.weights));
  // The checkpoint's tokenizer (tokenizer.json / tokenizer.model); the builtin model, and a
  // checkpoint without tokenizer files driven by --token-ids, use the byte tokenizer.
  const std::unique_ptr<tokenizer::Tokenizer> tok =
      o.model != "builtin" && (!o.prompt.empty() || tokenizer::has_tokenizer(o.model))
          ? tokenizer::load_tokenizer(o.model)
          : std::make_unique<tokenizer::ByteTokenizer>(loaded.config.bos_token_id,
                                                       loaded.config.eos_token_id);
  const std::vector<int32_t> prompt =
      o.prompt.empty() ? parse_token_ids(o.token_ids) : tok->encode(o.prompt, true);

  SpecDraft draft;
  const engine::EngineConfig cfg = engine_config_for(
      o, *platform,
      (static_cast<int64_t>(prompt.size()) + o.max_new_tokens + o.engine.args.page_size) * 2,
      4, draft, &llama);
  TpRunner tp = start_tp(o.tp, *platform, o.model, o.weight_seed);
  engine::Engine eng(llama, cfg, platform.get(), tp.factory(*platform));

  nlohmann::json logits_json = nlohmann::json::array();
  if (o.dump_logits) {
    eng.set_logits_observer([&](engine::RequestId, std::span<const float> logits) {
      logits_json.push_back(std::vector<float>(logits.begin(), logits.end()));
    });
  }
  const engine::RequestId id = eng.add_request(engine::GenerateRequest{
      .prompt = prompt,
      .max_new_tokens = o.max_new_tokens,
      .sampling = {.temperature = o.temperature, .top_k = o.top_k, .top_p = o.top_p,
                   .seed = o.seed, .min_p = o.min_p},
      .ignore_eos = o.ignore_eos,
      .extra_key = {}});
  if (!o.json && !o.prompt.empty()) {
    std::fputs(o.prompt.c_str(), stdout);
    std::fflush(stdout);
  }
  tokenizer::IncrementalDetokenizer detok(*tok, true, prompt);  // whole UTF-8 characters only
  while (eng.has_work()) {
    const engine::StepOutput step = eng.step();
    if (o.json) continue;
    for (const auto& [rid, token] : step.tokens) {
      const std::string text = detok.push(token);
      if (o.prompt.empty() || text.empty()) {
        std::printf(o.prompt.empty() ? "%d " : "", token);
      } else {
        std::fwrite(text.data(), 1, text.size(), stdout);
      }
      std::fflush(stdout);
    }
  }
  const engine::RequestOutput out = eng.output(id);
  PAGODA_REQUIRE(out.finish_reason != engine::FinishReason::kError, kResourceExhausted, "{}",
                 out.error);
  if (!o.json) {
    if (!o.prompt.empty()) std::fputs(detok.finish().c_str(), stdout);
    std::printf("\n");
    std::fprintf(stderr, "[%zu tokens, finish: %s, ttft %.1f ms, %.1f tok/s, backend %s]\n",
                 out.output_ids.size(), engine::finish_reason_name(out.finish_reason),
                 (out.first_token_s - out.arrival_s) * 1e3,
                 out.output_ids.size() / std::max(1e-9, out.finish_s - out.arrival_s),
                 eng.worker().backend_name().c_str());
    return;
  }
  nlohmann::json j = {
      {"model", loaded.config.name},
      {"backend", eng.worker().backend_name()},
      {"prompt_token_ids", prompt},
      {"output_token_ids", out.output_ids},
      {"output_text", tok->decode(out.output_ids, true)},
      {"finish_reason", engine::finish_reason_name(out.finish_reason)},
      {"ttft_s", out.first_token_s - out.arrival_s},
      {"latency_s", out.finish_s - out.arrival_s},
  };
  const engine::EngineStats st = eng.stats();
  j["device_path"] = st.device_path;
  j["cuda_graphs"] = st.cuda_graphs;
  j["cuda_graph_steps"] = st.cuda_graph_steps;
  if (cfg.spec.mode != engine::SpecMode::kNone) j["spec"] = spec_stats_json(cfg, st);
  if (st.hicache) j["hicache"] = hicache_stats_json(st);
  if (o.dump_logits) j["logits"] = std::move(logits_json);
  // Invalid UTF-8 bytes in output_text are replaced rather than rejected.
  std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto opts = std::make_shared<GenerateOptions>();
  auto* cmd = app.add_subcommand("generate", "Generate from one prompt (greedy or sampled)");
  cmd->add_option("--model", opts->model, "builtin, or a Hugging Face checkpoint folder")
      ->capture_default_str();
  add_tp_option(cmd, opts->tp);
  cmd->add_option("--weight-seed", opts->weight_seed, "seed of the builtin model's weights")
      ->capture_default_str();
  cmd->add_option("--prompt", opts->prompt,
                  "prompt text (the checkpoint's tokenizer, BOS added; builtin: bytes)");
  cmd->add_option("--token-ids", opts->token_ids, "prompt token ids, comma separated");
  cmd->add_option("--batch-file", opts->batch_file,
                  "run every line (comma-separated prompt ids) as one request of one batch; "
                  "prints one JSON object per line");
  cmd->add_option("--max-new-tokens", opts->max_new_tokens)->capture_default_str();
  cmd->add_option("--temperature", opts->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", opts->top_k, "0 = off")->capture_default_str();
  cmd->add_option("--top-p", opts->top_p)->capture_default_str();
  cmd->add_option("--seed", opts->seed, "sampling seed")->capture_default_str();
  cmd->add_option("--min-p", opts->min_p, "drop tokens below min_p * p_max (0 = off)")
      ->capture_default_str();
  add_engine_options(cmd, opts->engine);
  cmd->get_option("--pool-tokens")
      ->description("KV pool capacity in tokens (0 = twice the prompts and outputs, >= 4096)");
  cmd->get_option("--max-running")
      ->description("max running requests (0 = 4, or the --batch-file lines up to 64)");
  add_spec_options(cmd, opts->spec);
  cmd->add_flag("--ignore-eos", opts->ignore_eos, "keep generating after EOS");
  cmd->add_flag("--json", opts->json, "print one JSON object instead of streaming");
  cmd->add_flag("--dump-logits", opts->dump_logits,
                "with --json: add \"logits\", the f32 logits of every generated step");
  cmd->callback([opts] { run_generate(*opts); });
}

}  // namespace pagoda::cli
