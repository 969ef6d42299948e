// The overlap loop (EngineConfig::overlap, docs/design/engine.md "Overlap") against the plain
// loop as the reference: the same requests give the same ids and finish reasons with overlap on
// and off (greedy and seeded sampling, pages 1 and 16, chunked prefill, prefix hits, EOS and
// max_new_tokens at different steps, n > 1, retraction, abort), and no page or row leaks. The
// worker's staging hook (ModelWorker::stage / run_staged): the overlap loop stages each step
// once on the engine's thread at launch and runs it with what was staged, in order, on the step
// thread; the plain loop only calls run().
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine_test_util.h"
#include "pagoda/core/error.h"
#include "pagoda/model/llama_worker.h"
#include "test_seed.h"

namespace pagoda::engine {
namespace {

using testing::backend_named;
using testing::test_model;

struct Workload {
  std::vector<GenerateRequest> first;  ///< added before the first step
  std::vector<GenerateRequest> later;  ///< added after `later_after` steps (prefix hits)
  int later_after = 3;
};

/// Random requests over make_prompts (shared prefixes): greedy or seeded, max_new_tokens 1..24,
/// some ignoring EOS, and n = 3 copies of one prompt with different seeds.
Workload make_workload(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto prompts = testing::make_prompts(seed, 12);
  Workload w;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateRequest g{.prompt = prompts[i],
                      .max_new_tokens = 1 + static_cast<int32_t>(rng() % 24),
                      .ignore_eos = rng() % 4 == 0};
    if (rng() % 2 == 0) g.sampling = {.temperature = 0.9f, .top_k = 50, .seed = rng()};
    (i < 8 ? w.first : w.later).push_back(std::move(g));
  }
  // Greedy and long, so it meets the EOS the test picks from its greedy continuation.
  w.first[0].sampling = {};
  w.first[0].ignore_eos = false;
  w.first[0].max_new_tokens = 24;
  for (uint64_t k = 0; k < 3; ++k)  // n = 3
    w.later.push_back({.prompt = prompts[0],
                       .max_new_tokens = 16,
                       .sampling = {.temperature = 1.f, .seed = seed + k}});
  return w;
}

struct LoopRun {
  std::vector<RequestOutput> outputs;
  int64_t retractions = 0;
  int64_t cached_tokens = 0;
  size_t first_step_tokens = 0;
};

LoopRun run(model::LlamaModel& model, EngineConfig cfg, const Workload& w, bool overlap,
            const WorkerFactory& make_worker = {}) {
  cfg.overlap = overlap;
  Engine engine(model, cfg, nullptr, make_worker);
  std::vector<RequestId> ids;
  for (const auto& g : w.first) ids.push_back(engine.add_request(g));
  LoopRun r;
  r.first_step_tokens = engine.step().tokens.size();
  for (int s = 1; s < w.later_after && engine.has_work(); ++s) engine.step();
  for (const auto& g : w.later) ids.push_back(engine.add_request(g));
  engine.run_until_idle();
  for (RequestId id : ids) r.outputs.push_back(engine.output(id));
  const EngineStats st = engine.stats();
  r.retractions = st.scheduler.retractions;
  r.cached_tokens = st.scheduler.cached_tokens;
  EXPECT_EQ(engine.memory().leaked_pages(), 0);
  EXPECT_EQ(engine.memory().leaked_rows(), 0);
  return r;
}

void expect_same(const LoopRun& plain, const LoopRun& overlap) {
  ASSERT_EQ(plain.outputs.size(), overlap.outputs.size());
  for (size_t i = 0; i < plain.outputs.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "request " << i);
    EXPECT_EQ(overlap.outputs[i].state, RequestState::kFinished);
    EXPECT_EQ(overlap.outputs[i].finish_reason, plain.outputs[i].finish_reason);
    EXPECT_EQ(overlap.outputs[i].output_ids, plain.outputs[i].output_ids);
  }
}

EngineConfig config(int page_size, int64_t pool_tokens) {
  return EngineConfig{.page_size = page_size,
                      .pool_tokens = pool_tokens,
                      .scheduler = SchedulerConfig{.max_running_requests = 8, .chunk_size = 0},
                      .backend = backend_named("reference"),
                      .check_integrity = true};
}

TEST(EngineOverlap, SameOutputsAsThePlainLoop) {
  const testing::TestSeed seed;
  const Workload w = make_workload(seed);
  // EOS is a token the first greedy request emits, so requests stop at EOS at different steps.
  model::ModelConfig c = test_model().config;
  c.eos_token_id = testing::naive_greedy(w.first[0].prompt, 6).tokens[4];
  model::LlamaModel eos_model(c, test_model().weights);
  for (int page_size : {1, 16}) {
    for (int chunk : {0, 16}) {
      SCOPED_TRACE(::testing::Message() << "page " << page_size << " chunk " << chunk);
      EngineConfig cfg = config(page_size, 4096);
      cfg.scheduler.chunk_size = chunk;
      const LoopRun plain = run(eos_model, cfg, w, false);
      const LoopRun overlap = run(eos_model, cfg, w, true);
      expect_same(plain, overlap);
      EXPECT_GT(overlap.cached_tokens, 0);  // the later requests hit the prefix cache
      int stops = 0;
      for (const auto& o : plain.outputs) stops += o.finish_reason == FinishReason::kStop;
      EXPECT_GT(stops, 0);
      // One step late: the first step only launches the prefill (unchunked, it samples).
      if (chunk == 0) {
        EXPECT_GT(plain.first_step_tokens, 0u);
      }
      EXPECT_EQ(overlap.first_step_tokens, 0u);
    }
  }
}

TEST(EngineOverlap, RetractionUnderASmallPoolStaysExact) {
  const testing::TestSeed seed;
  Workload w;
  for (const auto& p : testing::make_prompts(seed, 8))
    w.first.push_back({.prompt = p, .max_new_tokens = 20, .ignore_eos = true});
  for (int page_size : {1, 16}) {
    SCOPED_TRACE(::testing::Message() << "page " << page_size);
    EngineConfig cfg = config(page_size, 192);
    cfg.scheduler.new_token_ratio = NewTokenRatio{.init = 0.0, .min = 0.0, .decay = 0.0};
    const LoopRun plain = run(test_model().model, cfg, w, false);
    const LoopRun overlap = run(test_model().model, cfg, w, true);
    expect_same(plain, overlap);
    EXPECT_GT(overlap.retractions, 0);
  }
}

/// What a StagingWorker saw (it outlives the engine that owns the worker).
struct StagingLog {
  std::mutex mu;
  int64_t staged = 0, staged_runs = 0, plain_runs = 0;
  int64_t worker_steps = 0;  ///< the inner worker's steps when the engine let it go
  std::vector<std::string> problems;
};

/// The default worker behind a recorder of the staging hook. stage() hands out the step's
/// launch number and its batch's shape as the staged bytes; run_staged() checks that they come
/// back with that batch, once and in launch order, and where each half ran.
class StagingWorker final : public model::ModelWorker {
 public:
  StagingWorker(std::unique_ptr<model::ModelWorker> inner, std::thread::id engine_thread,
                StagingLog& log)
      : inner_(std::move(inner)), engine_thread_(engine_thread), log_(log) {}
  ~StagingWorker() override { log_.worker_steps = inner_->stats().steps; }
  StagingWorker(const StagingWorker&) = delete;
  StagingWorker& operator=(const StagingWorker&) = delete;

  model::WorkerOutput run(const model::WorkerBatch& batch) override {
    {
      std::lock_guard<std::mutex> lock(log_.mu);
      ++log_.plain_runs;
    }
    return inner_->run(batch);
  }
  std::vector<std::byte> stage(const model::WorkerBatch& batch) override {
    std::lock_guard<std::mutex> lock(log_.mu);
    if (std::this_thread::get_id() != engine_thread_)
      log_.problems.push_back("step " + std::to_string(log_.staged) + " staged off the engine thread");
    const std::array<int64_t, 3> shape = {log_.staged++, batch.batch_size(),
                                          batch.forward.seq_lens_sum()};
    std::vector<std::byte> bytes(sizeof(shape));
    std::memcpy(bytes.data(), shape.data(), sizeof(shape));
    return bytes;
  }
  model::WorkerOutput run_staged(const model::WorkerBatch& batch,
                                 std::span<const std::byte> staged) override {
    {
      std::lock_guard<std::mutex> lock(log_.mu);
      const std::string run = "run " + std::to_string(log_.staged_runs);
      std::array<int64_t, 3> shape{};
      if (staged.size() != sizeof(shape)) {
        log_.problems.push_back(run + " got " + std::to_string(staged.size()) + " staged bytes");
      } else {
        std::memcpy(shape.data(), staged.data(), sizeof(shape));
        if (shape[0] != log_.staged_runs || shape[1] != batch.batch_size() ||
            shape[2] != batch.forward.seq_lens_sum())
          log_.problems.push_back(run + " got step " + std::to_string(shape[0]) + "'s staging");
      }
      if (std::this_thread::get_id() == engine_thread_)
        log_.problems.push_back(run + " ran on the engine thread");
      ++log_.staged_runs;
    }
    return inner_->run(batch);
  }
  kv::KvPool& kv_pool() override { return inner_->kv_pool(); }
  std::string backend_name() const override { return inner_->backend_name(); }
  model::WorkerStats stats() const override { return inner_->stats(); }

 private:
  std::unique_ptr<model::ModelWorker> inner_;
  std::thread::id engine_thread_;
  StagingLog& log_;
};

TEST(EngineOverlap, EachStepIsStagedOnceOnTheEngineThreadThenRunWithItsStaging) {
  const testing::TestSeed seed;
  const Workload w = make_workload(seed);
  const EngineConfig cfg = config(16, 4096);
  const LoopRun ref = run(test_model().model, cfg, w, false);  // the default worker, plain loop
  auto platform = platform::make_cpu_platform();
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "overlap " << overlap);
    StagingLog log;
    const WorkerFactory factory = [&](const model::LlamaModel& m, DType dtype,
                                      const model::WorkerConfig& wc, kv::ReqToTokenTable& table) {
      return BuiltWorker(std::make_unique<StagingWorker>(
          std::make_unique<model::LlamaWorker>(m, make_model_ops(*platform, dtype), wc, table),
          std::this_thread::get_id(), log));
    };
    expect_same(ref, run(test_model().model, cfg, w, overlap, factory));
    EXPECT_TRUE(log.problems.empty()) << log.problems.front();
    EXPECT_GT(log.worker_steps, 0);
    EXPECT_EQ(log.staged, overlap ? log.worker_steps : 0);
    EXPECT_EQ(log.staged_runs, overlap ? log.worker_steps : 0);
    EXPECT_EQ(log.plain_runs, overlap ? 0 : log.worker_steps);
  }
}

TEST(EngineOverlap, AbortMidRunKeepsAPrefixAndLeaksNothing) {
  const auto prompts = testing::make_prompts(77, 4);
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "overlap " << overlap);
    EngineConfig cfg = config(16, 2048);
    cfg.overlap = overlap;
    Engine engine(test_model().model, cfg);
    std::vector<RequestId> ids;
    for (const auto& p : prompts)
      ids.push_back(engine.add_request({.prompt = p, .max_new_tokens = 12, .ignore_eos = true}));
    while (engine.output(ids[1]).output_ids.size() < 4) engine.step();
    ASSERT_TRUE(engine.abort(ids[1]));
    engine.run_until_idle();
    for (size_t i = 0; i < ids.size(); ++i) {
      const RequestOutput out = engine.output(ids[i]);
      const auto& ref = testing::naive_greedy(prompts[i], 12);
      EXPECT_EQ(out.finish_reason, i == 1 ? FinishReason::kAbort : FinishReason::kLength);
      // The aborted request keeps at most the token of the step running at the abort.
      if (i == 1) {
        EXPECT_LE(out.output_ids.size(), 5u);
      }
      testing::expect_matches_naive(out, ref, "req " + std::to_string(i));
    }
    EXPECT_EQ(engine.memory().leaked_pages(), 0);
    EXPECT_EQ(engine.memory().leaked_rows(), 0);
  }
}

TEST(EngineOverlap, UnsupportedCombinationsAreRefused) {
  EngineConfig cfg = config(16, 2048);
  cfg.overlap = true;
  cfg.spec.mode = SpecMode::kNgram;
  try {
    cfg.validate();
    FAIL() << "overlap with speculative decoding was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    const std::string what = e.what();
    EXPECT_NE(what.find("overlap"), std::string::npos) << what;
    EXPECT_NE(what.find("speculative"), std::string::npos) << what;
  }
  EXPECT_THROW(Engine(test_model().model, cfg), Error);
  // Disaggregation's hooks are refused too; the engine keeps serving.
  cfg.spec.mode = SpecMode::kNone;
  Engine engine(test_model().model, cfg);
  const std::vector<int32_t> prompt = {1, 2, 3};
  EXPECT_THROW(engine.add_request({.prompt = prompt, .max_new_tokens = 2, .hold_kv = true}),
               Error);
  EXPECT_THROW(engine.transfer().add_request({.prompt = prompt, .max_new_tokens = 2}), Error);
  const RequestId id = engine.add_request({.prompt = prompt, .max_new_tokens = 2});
  engine.run_until_idle();
  EXPECT_EQ(engine.output(id).output_ids.size(), 2u);
}

}  // namespace
}  // namespace pagoda::engine
