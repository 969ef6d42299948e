// `pagoda replay`: replays a synthetic multi-turn chat workload through the page allocator, the
// request table and the radix cache exactly as a continuous-batching scheduler drives them
// (admit: match capped at len - 1, lock, alloc_extend; decode: alloc_decode per step; finish:
// cache_finished_req inside a free group; evict when an allocation does not fit; retract when
// even eviction cannot make room) and reports what an operator wants to know.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "pagoda/cache/radix_cache.h"
#include "pagoda/cli/commands.h"
#include "pagoda/core/check.h"
#include "pagoda/core/error.h"

namespace pagoda::cli {

namespace {

struct ReplayOptions {
  int64_t requests = 10000;
  int32_t page_size = 16;
  int64_t pool_tokens = 1 << 18;
  uint64_t seed = 1;
  std::string policy = "lru";
  int32_t max_running = 64;
  bool json = false;
};

struct ReplayReport {
  int64_t completed = 0, prompt_tokens = 0, cached_tokens = 0, decode_tokens = 0;
  int64_t evicted_tokens = 0, retractions = 0, steps = 0, cache_ops = 0;
  int32_t pages_total = 0, pages_peak = 0, pages_in_use_end = 0, tree_pages_end = 0;
  double seconds = 0;
};

struct Running {
  cache::CacheRequest req;
  int32_t seq_len = 0;
  int32_t output_left = 0;
  SlotIndex last_slot = -1;
};

class Replay {
 public:
  explicit Replay(const ReplayOptions& o)
      : o_(o),
        rng_(o.seed),
        alloc_(static_cast<int32_t>(o.pool_tokens / o.page_size), o.page_size),
        table_(o.max_running, kMaxContext),
        cache_(alloc_, table_, cache::make_eviction_policy(o.policy)) {
    for (int s = 0; s < kSystemPrompts; ++s) {
      std::vector<int32_t> sys(static_cast<size_t>(uniform(200, 800)));
      for (auto& t : sys) t = uniform(0, 31999);
      system_prompts_.push_back(std::move(sys));
    }
  }

  ReplayReport run() {
    const auto start = std::chrono::steady_clock::now();
    const bool tty = isatty(STDERR_FILENO) != 0;
    int64_t next_progress = 0;
    auto last_draw = start;
    while (report_.completed < o_.requests) {
      admit_waiting();
      decode_step();
      ++report_.steps;
      report_.pages_peak = std::max(report_.pages_peak, alloc_.num_referenced_pages());
      const auto now = std::chrono::steady_clock::now();
      if (tty && now - last_draw > std::chrono::milliseconds(100)) {
        std::fprintf(stderr, "\rreplay: %lld/%lld requests, hit rate %.1f%%  ",
                     static_cast<long long>(report_.completed),
                     static_cast<long long>(o_.requests), 100 * hit_rate());
        last_draw = now;
      } else if (!tty && report_.completed * 10 >= next_progress * o_.requests &&
                 now - start > std::chrono::seconds(2)) {
        std::fprintf(stderr, "replay: %lld%% (%lld requests)\n",
                     static_cast<long long>(next_progress * 10),
                     static_cast<long long>(report_.completed));
        ++next_progress;
      }
    }
    if (tty) std::fprintf(stderr, "\r%60s\r", "");
    report_.pages_in_use_end = alloc_.num_referenced_pages();
    report_.tree_pages_end = static_cast<int32_t>(cache_.total_size() / o_.page_size);
    report_.evicted_tokens = cache_.stats().evicted_tokens;
    // Drain and prove the books balance: all running requests finish, the tree is evicted, and
    // every page is free again.
    while (!running_.empty()) finish(running_.size() - 1);
    cache_.evict_all();
    alloc_.check_integrity();
    cache_.check_integrity();
    PAGODA_CHECK_EQ(alloc_.num_free_pages(), alloc_.num_pages());
    report_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    report_.pages_total = alloc_.num_pages();
    return report_;
  }

  double hit_rate() const {
    return report_.prompt_tokens == 0 ? 0.0
                                      : static_cast<double>(report_.cached_tokens) /
                                            static_cast<double>(report_.prompt_tokens);
  }

 private:
  static constexpr int32_t kMaxContext = 8192;
  static constexpr int kSystemPrompts = 8;

  int32_t uniform(int32_t lo, int32_t hi) {
    return std::uniform_int_distribution<int32_t>(lo, hi)(rng_);
  }

  cache::CacheRequest next_request() {
    if (!waiting_.empty()) {
      auto r = std::move(waiting_.front());
      waiting_.pop_front();
      return r;
    }
    cache::CacheRequest r;
    if (!history_.empty() && uniform(0, 1) == 0) {
      r.tokens = history_[static_cast<size_t>(uniform(0, static_cast<int32_t>(history_.size()) - 1))];
    } else {
      r.tokens = system_prompts_[static_cast<size_t>(uniform(0, kSystemPrompts - 1))];
    }
    const int32_t user = uniform(20, 300);
    for (int32_t i = 0; i < user; ++i) r.tokens.push_back(uniform(0, 31999));
    if (r.tokens.size() > kMaxContext / 2) r.tokens.resize(kMaxContext / 2);
    return r;
  }

  bool try_extend(Running& run, int32_t pre, int32_t seq) {
    const std::vector<int32_t> pre_v{pre}, seq_v{seq};
    const std::vector<SlotIndex> last_v{pre == 0 ? -1 : run.req.prefix_slots.back()};
    ++report_.cache_ops;
    auto out = alloc_.alloc_extend(pre_v, seq_v, last_v);
    if (!out) {
      cache_.evict((seq - pre) + o_.page_size - alloc_.available_size());
      ++report_.cache_ops;
      out = alloc_.alloc_extend(pre_v, seq_v, last_v);
      if (!out) return false;
    }
    table_.write(run.req.req_slot, pre, *out);
    run.last_slot = out->empty() ? last_v[0] : out->back();
    return true;
  }

  void admit_waiting() {
    while (static_cast<int32_t>(running_.size()) < o_.max_running &&
           report_.completed + static_cast<int64_t>(running_.size()) < o_.requests) {
      Running run;
      run.req = next_request();
      const auto len = static_cast<int32_t>(run.req.tokens.size());
      cache_.admit(run.req, cache::scheduler_prefix_limit(len));
      ++report_.cache_ops;
      run.req.req_slot = *table_.alloc();
      table_.write(run.req.req_slot, 0, run.req.prefix_slots);
      const auto pre = static_cast<int32_t>(run.req.prefix_slots.size());
      if (!try_extend(run, pre, len)) {  // does not fit now: undo and retry next step
        cache_.dec_lock_ref(run.req.last_node);
        run.req.last_node = cache::NodeHandle{};
        table_.free(run.req.req_slot);
        run.req.req_slot = ReqSlot::invalid();
        waiting_.push_front(std::move(run.req));
        return;
      }
      report_.prompt_tokens += len;
      report_.cached_tokens += pre;
      run.seq_len = len;
      run.output_left = uniform(16, 256);
      running_.push_back(std::move(run));
    }
  }

  void decode_step() {
    std::vector<int32_t> seq_lens;
    std::vector<SlotIndex> last;
    std::vector<SlotIndex> out;
    for (;;) {
      seq_lens.clear();
      last.clear();
      int64_t new_pages = 0;
      for (const auto& r : running_) {
        seq_lens.push_back(r.seq_len + 1);
        last.push_back(r.last_slot);
        new_pages += r.seq_len % o_.page_size == 0 ? 1 : 0;
      }
      out.resize(seq_lens.size());
      ++report_.cache_ops;
      if (alloc_.alloc_decode(seq_lens, last, out)) break;
      cache_.evict(new_pages * o_.page_size - alloc_.available_size());
      ++report_.cache_ops;
      if (alloc_.alloc_decode(seq_lens, last, out)) break;
      retract(running_.size() - 1);  // nothing evictable is left: give one request's memory back
      if (running_.empty()) return;
    }
    alloc_.free_group_begin();
    for (size_t i = 0; i < running_.size();) {
      auto& r = running_[i];
      table_.write(r.req.req_slot, r.seq_len, std::span(out).subspan(i, 1));
      r.req.tokens.push_back(uniform(0, 31999));
      r.last_slot = out[i];
      ++r.seq_len;
      ++report_.decode_tokens;
      if (--r.output_left == 0 || r.seq_len + 1 >= kMaxContext) {
        out.erase(out.begin() + static_cast<int64_t>(i));
        finish(i);
      } else {
        ++i;
      }
    }
    alloc_.free_group_end();
  }

  void finish(size_t index) {
    Running& r = running_[index];
    cache_.cache_finished_req(r.req, r.seq_len);
    ++report_.cache_ops;
    table_.free(r.req.req_slot);
    if (history_.size() < 512) {
      history_.push_back(r.req.tokens);
    } else {
      history_[static_cast<size_t>(uniform(0, 511))] = r.req.tokens;
    }
    running_.erase(running_.begin() + static_cast<int64_t>(index));
    ++report_.completed;
  }

  void retract(size_t index) {
    Running& r = running_[index];
    cache_.cache_finished_req(r.req, r.seq_len, cache::FinishPolicy::kNoInsert);
    table_.free(r.req.req_slot);
    ++report_.retractions;
    cache::CacheRequest again;  // re-queued: its prompt is everything it has so far
    again.tokens = std::move(r.req.tokens);
    again.tokens.resize(static_cast<size_t>(r.seq_len));
    waiting_.push_front(std::move(again));
    running_.erase(running_.begin() + static_cast<int64_t>(index));
  }

  ReplayOptions o_;
  std::mt19937_64 rng_;
  kv::PageAllocator alloc_;
  kv::ReqToTokenTable table_;
  cache::RadixCache cache_;
  std::vector<std::vector<int32_t>> system_prompts_;
  std::vector<std::vector<int32_t>> history_;
  std::deque<cache::CacheRequest> waiting_;
  std::vector<Running> running_;
  ReplayReport report_;
};

void print_report(const ReplayOptions& o, const ReplayReport& r, double hit_rate) {
  if (o.json) {
    nlohmann::json j = {
        {"requests", r.completed},         {"page_size", o.page_size},
        {"pool_tokens", o.pool_tokens},     {"policy", o.policy},
        {"seed", o.seed},                   {"prompt_tokens", r.prompt_tokens},
        {"cached_tokens", r.cached_tokens}, {"prefix_hit_rate", hit_rate},
        {"decode_tokens", r.decode_tokens}, {"evicted_tokens", r.evicted_tokens},
        {"retractions", r.retractions},     {"scheduler_steps", r.steps},
        {"pages_total", r.pages_total},     {"pages_peak", r.pages_peak},
        {"pages_in_use_end", r.pages_in_use_end}, {"tree_pages_end", r.tree_pages_end},
        {"cache_ops", r.cache_ops},         {"seconds", r.seconds},
        {"cache_ops_per_second", static_cast<double>(r.cache_ops) / r.seconds},
        {"tokens_per_second",
         static_cast<double>(r.prompt_tokens + r.decode_tokens) / r.seconds}};
    fmt::print("{}\n", j.dump());
    return;
  }
  fmt::print("pagoda replay: {} requests, page size {}, pool {} tokens ({} pages), policy {}, "
             "seed {}\n",
             r.completed, o.page_size, o.pool_tokens, r.pages_total, o.policy, o.seed);
  fmt::print("  prefix hit rate   {:.1f}%  ({} of {} prompt tokens reused)\n", 100 * hit_rate,
             r.cached_tokens, r.prompt_tokens);
  fmt::print("  decode tokens     {}\n", r.decode_tokens);
  fmt::print("  pages in use      peak {} / {} ({:.1f}%), at end {} (tree {})\n", r.pages_peak,
             r.pages_total, 100.0 * r.pages_peak / std::max(1, r.pages_total), r.pages_in_use_end,
             r.tree_pages_end);
  fmt::print("  evictions         {} tokens; retractions {}\n", r.evicted_tokens, r.retractions);
  fmt::print("  speed             {:.2f} s, {:.0f} cache/allocator ops/s, {:.0f} tokens/s, "
             "{} scheduler steps\n",
             r.seconds, static_cast<double>(r.cache_ops) / r.seconds,
             static_cast<double>(r.prompt_tokens + r.decode_tokens) / r.seconds, r.steps);
  fmt::print("  invariants        ok (drained: every page free, tree empty)\n");
}

}  // namespace

void add_replay_command(CLI::App& app) {
  auto opts = std::make_shared<ReplayOptions>();
  auto* cmd = app.add_subcommand(
      "replay", "Replay a synthetic multi-turn chat workload through the KV allocator and radix "
                "cache; report hit rate, memory and speed");
  cmd->add_option("--requests", opts->requests, "Requests to complete")->capture_default_str();
  cmd->add_option("--page-size", opts->page_size, "Tokens per KV page")->capture_default_str();
  cmd->add_option("--pool-tokens", opts->pool_tokens, "KV pool size in tokens")
      ->capture_default_str();
  cmd->add_option("--seed", opts->seed, "Workload seed")->capture_default_str();
  cmd->add_option("--policy", opts->policy, "Eviction policy: lru, lfu, fifo, priority")
      ->capture_default_str();
  cmd->add_option("--max-running", opts->max_running, "Requests decoding at once")
      ->capture_default_str();
  cmd->add_flag("--json", opts->json, "Print one JSON object instead of the table");
  cmd->callback([opts] {
    const auto& o = *opts;
    PAGODA_REQUIRE(o.requests >= 1, kInvalidArgument, "--requests must be >= 1");
    PAGODA_REQUIRE(o.page_size >= 1 && o.page_size <= 1024, kInvalidArgument,
                   "--page-size must be in [1, 1024]");
    PAGODA_REQUIRE(o.max_running >= 1, kInvalidArgument, "--max-running must be >= 1");
    PAGODA_REQUIRE(o.pool_tokens >= int64_t{8192} + o.page_size && o.pool_tokens < (int64_t{1} << 30),
                   kInvalidArgument,
                   "--pool-tokens must hold at least one full context (8192 tokens + a page)");
    Replay replay(o);
    const ReplayReport report = replay.run();
    print_report(o, report, replay.hit_rate());
  });
}

}  // namespace pagoda::cli
