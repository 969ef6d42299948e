// `pagoda bench`: a synthetic serving workload on the engine (shared system prompts, multi-turn
// follow-ups, mixed prompt and output lengths), a progress bar on stderr, then a summary table
// (or one JSON object with --json).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "pagoda/cli/commands.h"
#include "pagoda/cli/engine_options.h"
#include "pagoda/cli/kernel_options_flag.h"
#include "pagoda/cli/loadback_bench.h"
#include "pagoda/cli/spec_bench.h"
#include "pagoda/cli/spec_options.h"
#include "pagoda/core/error.h"
#include "pagoda/engine/engine.h"
#include "pagoda/model/llama.h"
#include "pagoda/model/model_ops.h"
#include "pagoda/model/ops.h"
#include "pagoda/model/safetensors.h"

namespace pagoda::cli {

namespace {

struct BenchOptions {
  std::string model = "builtin";
  int tp = 1;
  uint64_t weight_seed = 0;
  EngineOptions engine = [] {  // bench's defaults
    EngineOptions e;
    e.args.pool_tokens = 12288;
    e.args.policy = "lpm";
    e.args.chunk_size = 256;
    e.args.max_running = 48;
    return e;
  }();
  int requests = 600;
  uint64_t seed = 1;
  int max_new_tokens = 64;
  bool json = false;
  /// > 0: a fixed workload instead of conversations: `requests` independent prompts of
  /// input_len random tokens, each generating exactly output_len tokens, all queued at once.
  int input_len = 0;
  int output_len = 64;
  /// Speculative decoding: with --spec ngram|draft the bench runs spec_bench.h's A/B instead.
  SpecOptions spec{};
  std::string workload = "chat";
  /// --workload multiturn: conversations x turns over one shared system prompt.
  int conversations = 32;
  int turns = 4;
  int system_len = 256;
  /// multiturn: user message tokens per turn (0: 16..64 at random, a chat's short questions).
  int user_len = 0;
};


/// One conversation: a system prompt, then turns; each turn adds a user message and generates.
struct Conversation {
  int system = 0;
  std::vector<std::vector<int32_t>> user;  ///< per turn
  std::vector<int32_t> output_len;         ///< per turn
  int next_turn = 0;
  std::vector<int32_t> history;            ///< prompt + outputs so far
};

struct Workload {
  std::vector<std::vector<int32_t>> systems;
  std::vector<Conversation> convs;
};

/// --workload multiturn: `conversations` x `turns`, one shared system prompt of system_len
/// tokens, a user message of user_len tokens per turn (16..64 at random when 0) and
/// max_new_tokens answers; each turn's prompt is the conversation so far (every previous
/// answer included).
Workload make_multiturn(const BenchOptions& o, int32_t bos, int32_t vocab) {
  std::mt19937_64 rng(o.seed);
  const auto byte_vocab = static_cast<uint64_t>(std::min<int32_t>(vocab, 256));
  auto tokens = [&](int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(rng() % byte_vocab);
    return t;
  };
  Workload w;
  w.systems.push_back(tokens(o.system_len));
  for (int c = 0; c < o.conversations; ++c) {
    Conversation conv;
    for (int t = 0; t < o.turns; ++t) {
      conv.user.push_back(tokens(o.user_len > 0 ? o.user_len : 16 + static_cast<int>(rng() % 49)));
      conv.output_len.push_back(o.max_new_tokens);
    }
    if (bos >= 0) conv.history.push_back(bos);
    conv.history.insert(conv.history.end(), w.systems[0].begin(), w.systems[0].end());
    w.convs.push_back(std::move(conv));
  }
  return w;
}

Workload make_workload(const BenchOptions& o, int32_t bos, int32_t vocab) {
  if (o.workload == "multiturn") return make_multiturn(o, bos, vocab);
  std::mt19937_64 rng(o.seed);
  if (o.input_len > 0) {  // fixed lengths, independent random prompts (no shared prefix)
    Workload w;
    for (int r = 0; r < o.requests; ++r) {
      Conversation c;
      std::vector<int32_t> prompt(static_cast<size_t>(o.input_len));
      for (auto& x : prompt) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
      if (bos >= 0) prompt[0] = bos;
      c.user.push_back(std::move(prompt));
      c.output_len.push_back(o.output_len);
      w.convs.push_back(std::move(c));
    }
    return w;
  }
  const int32_t byte_vocab = std::min<int32_t>(vocab, 256);
  auto tokens = [&](int lo, int hi) {
    std::vector<int32_t> t(lo + static_cast<int>(rng() % static_cast<uint64_t>(hi - lo + 1)));
    for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(byte_vocab));
    return t;
  };
  Workload w;
  for (int s = 0; s < 4; ++s) w.systems.push_back(tokens(128, 384));
  int turns = 0;
  while (turns < o.requests) {
    Conversation c;
    c.system = static_cast<int>(rng() % w.systems.size());
    const int n = std::min(o.requests - turns, 1 + static_cast<int>(rng() % 3));
    for (int t = 0; t < n; ++t) {
      c.user.push_back(t == 0 ? tokens(16, 160) : tokens(8, 64));
      c.output_len.push_back(
          std::max(1, 8 + static_cast<int>(rng() % static_cast<uint64_t>(
                                                std::max(1, o.max_new_tokens - 7)))));
      c.output_len.back() = std::min(c.output_len.back(), o.max_new_tokens);
    }
    if (bos >= 0) c.history.push_back(bos);
    c.history.insert(c.history.end(), w.systems[c.system].begin(), w.systems[c.system].end());
    turns += n;
    w.convs.push_back(std::move(c));
  }
  return w;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double idx = p / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(idx);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
}

void progress(int done, int total, double elapsed, int64_t out_tokens) {
  const int width = 30;
  const int fill = total == 0 ? width : done * width / total;
  std::fprintf(stderr, "\r[%s%s] %d/%d requests  %.1f s  %.0f out tok/s ",
               std::string(fill, '#').c_str(), std::string(width - fill, '.').c_str(), done,
               total, elapsed, elapsed > 0 ? static_cast<double>(out_tokens) / elapsed : 0.0);
  std::fflush(stderr);
}

void run_bench(const BenchOptions& o) {
  prepare_host_threads();
  const engine::EngineArgs args = o.engine.resolve();
  if (o.workload == "loadback") {
    PAGODA_REQUIRE(o.spec.mode == "none" && o.tp == 1, kInvalidArgument,
                   "--workload loadback runs without --spec and at --tp 1");
    run_loadback_bench({.model = o.model,
                        .weight_seed = o.weight_seed,
                        .engine = args,
                        .prefix_len = o.input_len,
                        .extend_len = o.user_len > 0 ? o.user_len : 256,
                        .rounds = o.requests,
                        .seed = o.seed,
                        .json = o.json});
    return;
  }
  const bool engine_workload = o.workload == "chat" || o.workload == "multiturn";
  PAGODA_REQUIRE(!args.hicache.enabled() || (o.spec.mode == "none" && engine_workload),
                 kInvalidArgument,
                 "--hicache-* runs with the chat or multiturn workload and no --spec");
  PAGODA_REQUIRE(o.workload != "multiturn" || o.spec.mode == "none", kInvalidArgument,
                 "--workload multiturn runs without --spec");
  if (o.spec.mode != "none" || !engine_workload) {
    SpecBenchArgs a;
    a.model = o.model;
    a.weight_seed = o.weight_seed;
    a.engine = args;
    a.requests = o.requests;
    a.seed = o.seed;
    a.workload = o.workload == "chat" ? "random" : o.workload;
    a.input_len = o.input_len > 0 ? o.input_len : 256;
    a.output_len = o.output_len;
    a.json = o.json;
    a.spec = o.spec;
    a.tp = o.tp;
    run_spec_bench(a);
    return;
  }
  PAGODA_REQUIRE(o.requests >= 1, kInvalidArgument, "--requests must be >= 1");
  PAGODA_REQUIRE(o.max_new_tokens >= 1, kInvalidArgument, "--max-new-tokens must be >= 1");
  PAGODA_REQUIRE(o.input_len >= 0 && o.output_len >= 1, kInvalidArgument,
                 "--input-len must be >= 0 and --output-len >= 1");
  PAGODA_REQUIRE(o.workload != "multiturn" ||
                     (o.conversations >= 1 && o.turns >= 1 && o.system_len >= 1 &&
                      o.user_len >= 0 && o.input_len == 0),
                 kInvalidArgument,
                 "--workload multiturn needs --conversations, --turns, --system-len >= 1, "
                 "--user-len >= 0 and no --input-len");
  auto platform = engine::make_platform(args);
  // Checked before the (possibly large) model is loaded.
  const engine::EngineConfig cfg = engine::make_engine_config(args, *platform);
  TpRunner tp = start_tp(o.tp, *platform, o.model, o.weight_seed);
  // Load time: the checkpoint read, the weights packed and uploaded and the engine built (the
  // CPU oneDNN modes pack every GEMM weight here, so no request's TTFT pays for it).
  const auto load_t0 = std::chrono::steady_clock::now();
  model::LoadedModel loaded =
      model::load_model(o.model, o.weight_seed, engine::load_options(args, *platform, o.tp > 1));
  model::LlamaModel llama(loaded.config, std::move(loaded.weights));
  engine::Engine eng(llama, cfg, platform.get(), tp.factory(*platform));
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_t0).count();

  Workload w = make_workload(o, loaded.config.bos_token_id, loaded.config.vocab_size);
  int total_requests = 0;
  for (const Conversation& c : w.convs) total_requests += static_cast<int>(c.user.size());
  std::unordered_map<engine::RequestId, size_t> conv_of;
  std::unordered_map<engine::RequestId, int> turn_of;  // the turn each request is
  auto submit = [&](size_t ci) {
    Conversation& c = w.convs[ci];
    const auto& user = c.user[c.next_turn];
    c.history.insert(c.history.end(), user.begin(), user.end());
    const engine::RequestId id = eng.add_request(engine::GenerateRequest{
        .prompt = c.history,
        .max_new_tokens = c.output_len[c.next_turn],
        .sampling = {},
        .ignore_eos = true,
        .extra_key = {}});
    conv_of[id] = ci;
    turn_of[id] = c.next_turn;
  };
  for (size_t ci = 0; ci < w.convs.size(); ++ci) submit(ci);
  const bool rounds = o.workload == "multiturn";

  const bool tty = isatty(STDERR_FILENO) != 0;
  std::vector<double> ttft, tpot;
  std::vector<std::vector<double>> ttft_by_turn;  // per turn index (a conversation's n-th turn)
  int64_t in_tokens = 0, out_tokens = 0;
  int done = 0, failed = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double last_print = -1.0;
  double decode_s = 0.0;  // wall time of pure decode steps
  int64_t decode_steps = 0, decode_rows = 0, decode_batch_max = 0;
  double extend_min_s = 0.0;  // fastest pure extend step (a prefill alone: its compute time)
  int64_t extend_min_tokens = 0;
  while (eng.has_work()) {
    const double step_start = elapsed();
    const engine::StepOutput step = eng.step();
    const double step_s = elapsed() - step_start;
    if (step.mode == attention::ForwardMode::kDecode) {
      decode_s += step_s;
      ++decode_steps;
      decode_rows += step.num_seqs;
      decode_batch_max = std::max<int64_t>(decode_batch_max, step.num_seqs);
    } else if (step.mode == attention::ForwardMode::kExtend &&
               (extend_min_tokens == 0 || step_s < extend_min_s)) {
      extend_min_s = step_s;
      extend_min_tokens = step.num_tokens;
    }
    for (engine::RequestId id : step.finished) {
      const engine::RequestOutput out = eng.output(id);
      ++done;
      if (out.finish_reason == engine::FinishReason::kError) {
        ++failed;
        std::fprintf(stderr, "\nrequest %lld failed: %s\n", static_cast<long long>(id),
                     out.error.c_str());
      } else {
        in_tokens += out.prompt_len;
        out_tokens += static_cast<int64_t>(out.output_ids.size());
        ttft.push_back(out.first_token_s - out.arrival_s);
        const auto turn = static_cast<size_t>(turn_of.at(id));
        if (ttft_by_turn.size() <= turn) ttft_by_turn.resize(turn + 1);
        ttft_by_turn[turn].push_back(ttft.back());
        if (out.output_ids.size() > 1)
          tpot.push_back((out.finish_s - out.first_token_s) /
                         static_cast<double>(out.output_ids.size() - 1));
      }
      Conversation& c = w.convs[conv_of.at(id)];
      c.history.insert(c.history.end(), out.output_ids.begin(), out.output_ids.end());
      eng.release(id);
      if (++c.next_turn < static_cast<int>(c.user.size()) &&
          out.finish_reason != engine::FinishReason::kError) {
        if (!rounds) submit(conv_of.at(id));
      } else if (c.next_turn < static_cast<int>(c.user.size())) {
        done += static_cast<int>(c.user.size()) - c.next_turn;  // skipped follow-ups
      }
    }
    // multiturn: the next turn of every conversation starts once the whole round is done, so
    // each conversation comes back after all the others (live KV: every history).
    if (rounds && !eng.has_work()) {
      for (size_t ci = 0; ci < w.convs.size(); ++ci)
        if (w.convs[ci].next_turn < static_cast<int>(w.convs[ci].user.size())) submit(ci);
    }
    const double t = elapsed();
    if (t - last_print > (tty ? 0.1 : 2.0)) {
      progress(done, total_requests, t, out_tokens);
      last_print = t;
    }
  }
  const double wall = elapsed();
  progress(done, total_requests, wall, out_tokens);
  std::fprintf(stderr, "\n");

  const engine::EngineStats st = eng.stats();
  const int completed = done - failed;
  // The KV every conversation would keep alive (the shared system prompt counted once).
  int64_t live_kv = w.systems.empty() ? 0 : static_cast<int64_t>(w.systems[0].size());
  for (const Conversation& c : w.convs) {
    const size_t sys = w.systems.empty() ? 0 : w.systems[static_cast<size_t>(c.system)].size();
    live_kv += static_cast<int64_t>(c.history.size() - std::min(sys, c.history.size()));
  }
  const int64_t leaked_host = eng.memory().leaked_host_pages();
  // Every conversation's final history (prompts + every answer) hashed in order: two runs
  // of one workload gave identical outputs iff their digests agree.
  uint64_t digest = 0xcbf29ce484222325ull;
  for (const Conversation& c : w.convs) {
    for (int32_t t : c.history) digest = (digest ^ static_cast<uint32_t>(t)) * 0x100000001b3ull;
    digest = (digest ^ 0xffffffffull) * 0x100000001b3ull;
  }
  // Drained: every page reference is the tree's, and free + cached pages are the whole pool.
  const int64_t leaked = eng.memory().leaked_pages();
  const bool accounted = eng.memory().idle_pages_accounted();
  // Then the prefix cache is evicted too: every page must be free again, every refcount 0.
  const int64_t drained_tokens = eng.memory().drain_prefix_cache();  // the loop above left it idle
  const int64_t free_after_drain = eng.memory().free_pages();
  const int64_t referenced_after_drain = eng.memory().referenced_pages();
  const int64_t host_drained_pages = eng.memory().drain_host_cache();
  // Storage counters after the drain: evicting the host tier writes its pages to storage.
  const engine::EngineStats drained = eng.stats();
  const bool drained_clean = free_after_drain == eng.memory().total_pages() &&
                             referenced_after_drain == 0 && eng.memory().leaked_host_pages() == 0 &&
                             eng.memory().swa_free_pages() == eng.memory().swa_total_pages();
  nlohmann::json j = {
      {"model", loaded.config.name},
      {"backend", eng.worker().backend_name()},
      {"kernel_options", kernel_options_json(args.backend.kernels)},
      {"page_size", args.page_size},
      {"pool_tokens", st.pool_tokens},
      {"swa_pool_pages", st.swa_pages_total},
      {"kv_bytes", st.kv_bytes},
      {"swa_kv_bytes", st.swa_kv_bytes},
      {"swa_peak_pages_per_request", st.scheduler.peak_swa_pages_per_request},
      {"requests", completed},
      {"failed_requests", failed},
      {"wall_s", wall},
      {"load_s", load_s},
      {"requests_per_s", completed / wall},
      {"input_tokens", in_tokens},
      {"output_tokens", out_tokens},
      {"input_tokens_per_s", static_cast<double>(in_tokens) / wall},
      {"output_tokens_per_s", static_cast<double>(out_tokens) / wall},
      {"ttft_p50_ms", percentile(ttft, 50) * 1e3},
      {"ttft_p99_ms", percentile(ttft, 99) * 1e3},
      {"tpot_p50_ms", percentile(tpot, 50) * 1e3},
      {"tpot_p99_ms", percentile(tpot, 99) * 1e3},
      {"prefix_hit_rate", st.prefix_hit_rate()},
      {"computed_tokens", st.computed_tokens},
      {"peak_kv_tokens", st.scheduler.peak_used_tokens},
      {"peak_kv_fraction",
       static_cast<double>(st.scheduler.peak_used_tokens) / static_cast<double>(st.pool_tokens)},
      {"evicted_tokens", st.cache.evicted_tokens},
      {"retractions", st.scheduler.retractions},
      {"steps", st.steps},
      {"mixed_steps", st.mixed_steps},
      {"leaked_pages", leaked},
      {"idle_pages_accounted", accounted},
      {"drained_cache_tokens", drained_tokens},
      {"pages_total", eng.memory().total_pages()},
      {"pages_free_after_drain", free_after_drain},
      {"pages_referenced_after_drain", referenced_after_drain},
      {"device_path", st.device_path},
      {"cuda_graph", st.device_path && args.cuda_graph},
      {"cuda_graphs", st.cuda_graphs},
      {"cuda_graph_steps", st.cuda_graph_steps},
      {"decode_steps", st.decode_steps},
      {"dtype", std::string(dtype_name(st.dtype))},
      {"kv_dtype", std::string(dtype_name(st.kv_dtype))},
      {"cpu_gemm", std::string(model::cpu_gemm_name(cfg.cpu_gemm))},
      {"bf16_weights", llama.has_bf16_weights()},  // kept bf16 (model::LoadOptions::keep_bf16)
      {"decode_step_ms", decode_steps > 0 ? decode_s / static_cast<double>(decode_steps) * 1e3 : 0.0},
      {"decode_batch_max", decode_batch_max},
      {"decode_batch_mean", decode_steps > 0 ? static_cast<double>(decode_rows) /
                                                   static_cast<double>(decode_steps)
                                             : 0.0},
      {"decode_tokens_per_s", decode_s > 0 ? static_cast<double>(decode_rows) / decode_s : 0.0},
      {"extend_step_min_ms", extend_min_s * 1e3},
      {"extend_step_min_tokens", extend_min_tokens},
      {"params", loaded.config.num_parameters()},
      {"workload", o.workload},
      {"output_digest", fmt::format("{:016x}", digest)},
      {"live_kv_tokens", live_kv},
      {"live_kv_over_pool", static_cast<double>(live_kv) / static_cast<double>(st.pool_tokens)},
      {"cached_tokens", st.scheduler.cached_tokens},
      {"fill_tokens", st.scheduler.fill_tokens},
  };
  // The median time to first token of each turn index: a follow-up turn (index >= 1) of the
  // multiturn workload starts from its conversation's cached prefix, turn 0 from the system
  // prompt alone.
  j["ttft_by_turn_ms"] = nlohmann::json::array();
  for (const auto& v : ttft_by_turn) j["ttft_by_turn_ms"].push_back(percentile(v, 50) * 1e3);
  if (st.hicache) {
    j["hicache"] = hicache_stats_json(st);
    j["hicache"]["write_policy"] = o.engine.hicache.write_policy;
    j["hicache"]["leaked_host_pages"] = leaked_host;
    j["hicache"]["host_pages_drained"] = host_drained_pages;
    j["hicache"]["storage"] = hicache_stats_json(drained)["storage"];
  }
  // Printed first, then checked: a broken run still shows its numbers.
  auto check_accounting = [&] {
    PAGODA_REQUIRE(leaked == 0 && accounted && leaked_host == 0, kInternal,
                   "KV accounting after draining: {} leaked page references ({} in the host "
                   "tier), free + cached pages {} the pool",
                   leaked, leaked_host, accounted ? "equal" : "do not equal");
    PAGODA_REQUIRE(drained_clean, kInternal,
                   "KV accounting after evicting the prefix cache: {} of {} pages free, {} "
                   "pages still referenced, {} host pages leaked",
                   free_after_drain, eng.memory().total_pages(), referenced_after_drain,
                   eng.memory().leaked_host_pages());
  };
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
    check_accounting();
    return;
  }
  fmt::print("pagoda bench: model {} ({:.1f}M params, {} / KV {}, GEMMs {}), backend {}, page {}, "
             "pool {} tokens, policy {}, chunk {}\n",
             loaded.config.name, static_cast<double>(loaded.config.num_parameters()) / 1e6,
             st.dtype, st.kv_dtype, model::cpu_gemm_name(cfg.cpu_gemm),
             eng.worker().backend_name(), args.page_size, st.pool_tokens, args.policy,
             args.chunk_size);
  auto row = [](const char* name, const std::string& value) {
    fmt::print("  {:<24} {:>16}\n", name, value);
  };
  row("requests", fmt::format("{} ({} failed)", completed, failed));
  row("load time", fmt::format("{:.2f} s", load_s));
  row("wall time", fmt::format("{:.2f} s", wall));
  row("requests/s", fmt::format("{:.2f}", completed / wall));
  row("input tokens/s", fmt::format("{:.0f}", static_cast<double>(in_tokens) / wall));
  row("output tokens/s", fmt::format("{:.0f}", static_cast<double>(out_tokens) / wall));
  row("TTFT p50 / p99", fmt::format("{:.0f} / {:.0f} ms", percentile(ttft, 50) * 1e3,
                                    percentile(ttft, 99) * 1e3));
  row("TPOT p50 / p99", fmt::format("{:.1f} / {:.1f} ms", percentile(tpot, 50) * 1e3,
                                    percentile(tpot, 99) * 1e3));
  row("prefix hit rate", fmt::format("{:.1f} %", st.prefix_hit_rate() * 100));
  row("output digest", fmt::format("{:016x}", digest));
  if (o.workload == "multiturn")
    row("live KV", fmt::format("{} tok ({:.1f} x pool)", live_kv,
                               static_cast<double>(live_kv) / static_cast<double>(st.pool_tokens)));
  if (st.hicache) {
    const tier::TierStats& t = st.tier;
    row("hits device / host", fmt::format("{} / {} tok", t.device_hit_tokens, t.host_hit_tokens));
    row("host tier", fmt::format("{} / {} pages, {} evicted", t.host_pages, t.host_capacity_pages,
                                 t.host_evicted_pages));
    row("moved d2h / h2d", fmt::format("{:.1f} / {:.1f} MB", t.transfer.bytes_d2h / 1e6,
                                       t.transfer.bytes_h2d / 1e6));
    row("load stalls", fmt::format("{} ({:.1f} ms), copy waits {} ({:.1f} ms)",
                                   t.transfer.load_stalls, t.transfer.load_stall_s * 1e3,
                                   t.transfer.copy_waits, t.transfer.d2h_wait_s * 1e3));
    row("skipped loads / backups", fmt::format("{} tok / {} pages", t.load_skipped_tokens,
                                               t.backup_skipped_pages));
    if (t.has_storage)
      row("storage", fmt::format("{} hit tok, {} put, {} errors, {} corrupt",
                                 t.storage_hit_tokens, drained.tier.storage.puts,
                                 drained.tier.storage.put_errors, t.storage.corrupt_pages));
  }
  row("peak KV use", fmt::format("{} tok ({:.0f} %)", st.scheduler.peak_used_tokens,
                                 100.0 * static_cast<double>(st.scheduler.peak_used_tokens) /
                                     static_cast<double>(st.pool_tokens)));
  row("evicted tokens", fmt::format("{}", st.cache.evicted_tokens));
  row("retractions", fmt::format("{}", st.scheduler.retractions));
  row("steps (mixed)", fmt::format("{} ({})", st.steps, st.mixed_steps));
  row("leaked pages", fmt::format("{}{}", leaked, accounted ? "" : " (free + cached != total)"));
  row("pages free after drain", fmt::format("{} / {}, {} referenced", free_after_drain,
                                            eng.memory().total_pages(), referenced_after_drain));
  if (decode_steps > 0)
    row("decode step", fmt::format("{:.3f} ms (batch {:.1f}, {:.0f} tok/s)",
                                   decode_s / static_cast<double>(decode_steps) * 1e3,
                                   static_cast<double>(decode_rows) /
                                       static_cast<double>(decode_steps),
                                   static_cast<double>(decode_rows) / decode_s));
  if (st.device_path)
    row("CUDA graphs", fmt::format("{} captured, {} of {} decode steps replayed", st.cuda_graphs,
                                   st.cuda_graph_steps, st.decode_steps));
  check_accounting();
}

}  // namespace

void prepare_host_threads() {
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    std::ifstream in("/proc/self/cmdline", std::ios::binary);
    std::vector<std::string> args;
    for (std::string a; std::getline(in, a, '\0');) args.push_back(a);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::setenv("OMP_WAIT_POLICY", "passive", 1);
    if (args.size() > 0) ::execv("/proc/self/exe", argv.data());
    // execv failed: carry on with the current settings.
  }
  model::set_blas_num_threads(1);
}

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  auto* cmd = app.add_subcommand("bench", "Synthetic serving benchmark on the engine");
  cmd->add_option("--model", o->model, "builtin, or a Hugging Face checkpoint folder")
      ->capture_default_str();
  cmd->add_option("--weight-seed", o->weight_seed)->capture_default_str();
  add_tp_option(cmd, o->tp);
  add_engine_options(cmd, o->engine);
  cmd->add_option("--requests", o->requests, "requests (turns) in the workload")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "workload seed")->capture_default_str();
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "largest output length")
      ->capture_default_str();
  cmd->add_option("--input-len", o->input_len,
                  "fixed workload: prompt length of each of --requests independent requests "
                  "(0 = the multi-turn conversation workload)")
      ->capture_default_str();
  cmd->add_option("--output-len", o->output_len, "fixed workload: tokens generated per request")
      ->capture_default_str();
  cmd->add_option("--workload", o->workload,
                  "chat (multi-turn conversations), multiturn (--conversations x --turns over "
                  "one shared system prompt, every answer kept in the next prompt), or with "
                  "--spec: repeat (prompts that repeat a span: editing / retrieval) or random; "
                  "--spec runs the workload without and with speculation and reports the "
                  "speed-up; loadback (with --hicache-*): the TTFT of --user-len new tokens "
                  "(default 256) on an --input-len-token prefix that is cold, on the device, or "
                  "loaded back from the host tier, --requests rounds (loadback_bench.h)")
      ->check(CLI::IsMember({"chat", "multiturn", "repeat", "random", "loadback"}))
      ->capture_default_str();
  cmd->add_option("--conversations", o->conversations, "multiturn: conversations")
      ->capture_default_str();
  cmd->add_option("--turns", o->turns, "multiturn: turns per conversation")->capture_default_str();
  cmd->add_option("--system-len", o->system_len, "multiturn: shared system prompt tokens")
      ->capture_default_str();
  cmd->add_option("--user-len", o->user_len,
                  "multiturn: user message tokens per turn (0: 16..64 at random)")
      ->capture_default_str();
  add_spec_options(cmd, o->spec);
  cmd->add_flag("--json", o->json, "print one JSON object");
  cmd->callback([o] { run_bench(*o); });
}

}  // namespace pagoda::cli
