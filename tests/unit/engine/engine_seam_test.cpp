// The Scheduler → ModelWorker seam: Engine::abort frees everything a request holds at every
// stage (waiting, chunked prefill, decoding) and the others' tokens are unchanged; the worker
// alone runs hand-built WorkerBatches (several logit rows per sequence, non-final chunks) against
// the naive reference and rejects malformed batches without computing anything; the host sampler
// keeps the historical seeded stream; disaggregation's seam: a prefill engine's held KV copied
// page by page into a decode engine's preallocated pages continues exactly like one engine.
#include <gtest/gtest.h>

#include <cstring>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "engine_pd_util.h"
#include "engine_test_util.h"
#include "pagoda/core/error.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/model/host_sampling.h"
#include "pagoda/model/llama_worker.h"
#include "pagoda/model/sampler.h"

namespace pagoda::engine {
namespace {

using testing::backend_named;
using testing::expect_matches_naive;
using testing::naive_greedy;
using testing::test_model;

EngineConfig abort_config(int page_size, int32_t chunk) {
  return EngineConfig{.page_size = page_size,
                      .pool_tokens = 4096,
                      .scheduler = SchedulerConfig{.max_running_requests = 8, .chunk_size = chunk},
                      .backend = backend_named("reference"),
                      .check_integrity = true};
}

TEST(EngineAbort, AbortAtEveryStageFreesEverythingOthersUnchanged) {
  const uint64_t seed = 0xAB0127;
  std::printf("prompt seed %llu\n", static_cast<unsigned long long>(seed));
  const auto prompts = testing::make_prompts(seed, 6);
  const int max_new = 12;
  for (int page_size : {1, 16}) {
    for (int abort_after_steps : {0, 1, 3, 7}) {
      SCOPED_TRACE(::testing::Message() << "page " << page_size << " abort after "
                                        << abort_after_steps << " steps");
      Engine engine(test_model().model, abort_config(page_size, page_size == 1 ? 4 : 32));
      std::vector<RequestId> ids;
      for (const auto& p : prompts)
        ids.push_back(engine.add_request({.prompt = p, .max_new_tokens = max_new}));
      // A long prompt that is chunk-prefilled for several steps, and one that never runs.
      std::vector<int32_t> longp;
      for (int i = 0; i < 500; ++i) longp.push_back((i * 7 + 3) % 256);
      const RequestId chunked = engine.add_request({.prompt = longp, .max_new_tokens = 4});
      for (int s = 0; s < abort_after_steps; ++s) engine.step();
      const RequestId victim = ids[2];
      const RequestState before = engine.output(victim).state;
      EXPECT_TRUE(engine.abort(victim));
      EXPECT_TRUE(engine.abort(chunked));
      EXPECT_FALSE(engine.abort(victim));  // already finished: no effect
      EXPECT_EQ(engine.output(victim).finish_reason, FinishReason::kAbort) << int(before);
      EXPECT_EQ(engine.output(victim).state, RequestState::kFinished);
      EXPECT_EQ(engine.memory().leaked_pages(), 0);
      EXPECT_EQ(engine.memory().leaked_rows(), 0);
      engine.run_until_idle();
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] == victim) continue;
        const RequestOutput out = engine.output(ids[i]);
        EXPECT_EQ(static_cast<int>(out.output_ids.size()), max_new);
        expect_matches_naive(out, naive_greedy(prompts[i], max_new), "req " + std::to_string(i));
      }
      EXPECT_LE(engine.output(victim).output_ids.size(), static_cast<size_t>(abort_after_steps));
      EXPECT_EQ(engine.memory().leaked_pages(), 0);
      EXPECT_EQ(engine.memory().leaked_rows(), 0);
      EXPECT_EQ(engine.stats().aborted_by_user, 2);
      EXPECT_THROW(engine.abort(12345), Error);
      engine.memory().check_integrity();
    }
  }
}

/// One worker over a private table: the scheduler's part (rows, slots) is done by hand here.
struct WorkerRig {
  explicit WorkerRig(int page_size)
      : platform(platform::make_cpu_platform()), table(4, 512) {
    worker = std::make_unique<model::LlamaWorker>(
        test_model().model, model::make_cpu_ops(*platform, DType::kF32),
        model::WorkerConfig{.page_size = page_size,
                            .num_pages = 4096 / page_size,
                            .kv_dtype = DType::kF32,
                            .backend = backend_named("reference")},
        table);
  }
  std::unique_ptr<platform::Platform> platform;
  kv::ReqToTokenTable table;
  std::unique_ptr<model::LlamaWorker> worker;
};

TEST(ModelWorker, LogitRowsPerSequenceMatchNaiveAndBadBatchesAreRejected) {
  const int page_size = 16;
  WorkerRig rig(page_size);
  const uint64_t seed = 77;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const auto prompts = testing::make_prompts(seed, 2);
  // Two sequences in one extend: sequence 0 wants logits of its last 3 tokens, sequence 1 is a
  // non-final chunk (0 rows). Slots: contiguous pages from page 1 for row 1, page 100 for row 2.
  model::WorkerBatch b;
  attention::ForwardBatch& f = b.forward;
  f.mode = attention::ForwardMode::kExtend;
  f.batch_size = 2;
  int slot_base[2] = {page_size, 100 * page_size};
  for (int s = 0; s < 2; ++s) {
    const ReqSlot row = rig.table.alloc().value();
    const auto& p = prompts[static_cast<size_t>(s)];
    const int n = static_cast<int>(p.size());
    std::vector<int32_t> slots(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) slots[static_cast<size_t>(i)] = slot_base[s] + i;
    rig.table.write(row, 0, slots);
    f.req_pool_indices.push_back(row.value());
    f.seq_lens.push_back(n);
    f.extend_prefix_lens.push_back(0);
    f.extend_seq_lens.push_back(n);
    for (int i = 0; i < n; ++i) f.positions.push_back(i);
    f.out_cache_loc.insert(f.out_cache_loc.end(), slots.begin(), slots.end());
    b.input_ids.insert(b.input_ids.end(), p.begin(), p.end());
    b.logit_rows.push_back(s == 0 ? 3 : 0);
    b.sampling.push_back({});
    b.sample_step.push_back(0);
  }
  b.return_logits = true;

  // Malformed batches throw before anything runs.
  model::WorkerBatch bad = b;
  bad.logit_rows[0] = static_cast<int32_t>(prompts[0].size()) + 1;
  EXPECT_THROW(rig.worker->run(bad), Error);
  bad = b;
  bad.input_ids.pop_back();
  EXPECT_THROW(rig.worker->run(bad), Error);
  bad = b;
  bad.input_ids[0] = test_model().config.vocab_size;
  EXPECT_THROW(rig.worker->run(bad), Error);
  bad = b;
  bad.sampling.pop_back();
  EXPECT_THROW(rig.worker->run(bad), Error);

  const model::WorkerOutput out = rig.worker->run(b);
  ASSERT_EQ(out.tokens.size(), 3u);
  const int vocab = test_model().config.vocab_size;
  ASSERT_EQ(out.logits.size(), 3u * static_cast<size_t>(vocab));
  // Each row r of sequence 0 is the next-token logits of prefix [0, n - 3 + r + 1).
  const auto& p0 = prompts[0];
  testing::NaiveLlama naive(test_model().config, test_model().weights);
  std::vector<std::vector<double>> refs;
  for (size_t i = 0; i < p0.size(); ++i) {
    std::vector<double> l = naive.feed(p0[i]);
    if (i + 3 >= p0.size()) refs.push_back(std::move(l));
  }
  for (int r = 0; r < 3; ++r) {
    const std::vector<double>& ref = refs[static_cast<size_t>(r)];
    double max_err = 0.0;
    for (int v = 0; v < vocab; ++v)
      max_err = std::max(max_err,
                         std::abs(ref[static_cast<size_t>(v)] -
                                  out.logits[static_cast<size_t>(r * vocab + v)]));
    EXPECT_LT(max_err, 2e-3) << "row " << r;
    EXPECT_EQ(out.tokens[static_cast<size_t>(r)],
              model::argmax(std::span<const float>(out.logits).subspan(
                  static_cast<size_t>(r * vocab), static_cast<size_t>(vocab))));
  }
  EXPECT_EQ(rig.worker->stats().steps, 1);
}

/// The historical per-request stream, written out here independently of host_sampling.cpp:
/// state = seed ^ K; each draw adds φ and mixes (splitmix64); 53 bits as a double.
double historical_draw(uint64_t seed, int64_t n) {
  uint64_t state = seed ^ 0xA0761D6478BD642Full;
  uint64_t z = 0;
  for (int64_t i = 0; i <= n; ++i) {
    z = (state += 0x9E3779B97F4A7C15ull);
  }
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

TEST(HostSampling, CounterUniformIsTheHistoricalStream) {
  for (uint64_t seed : {0ull, 1ull, 99ull, 0xDEADBEEFCAFEull})
    for (int64_t n = 0; n < 64; ++n)
      EXPECT_EQ(model::counter_uniform(seed, n), historical_draw(seed, n))
          << "seed " << seed << " draw " << n;
}

TEST(HostSampling, SampleRowPicksTheInverseCdfTokenOfAnIndependentReference) {
  const uint64_t seed = 5;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> logits(300);
  for (float& x : logits) x = nd(rng);
  const model::SamplingParams sp{.temperature = 0.9f, .top_k = 50, .top_p = 0.95f, .seed = 99,
                                 .min_p = 0.01f};
  // Reference: sort by logit (ties by id), top-k, softmax, top-p prefix, min-p, inverse CDF.
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  order.resize(static_cast<size_t>(sp.top_k));
  std::vector<double> p;
  for (int32_t id : order) p.push_back(std::exp((logits[id] - logits[order[0]]) / 0.9));
  double total = 0.0;
  for (double x : p) total += x;
  size_t keep = p.size();
  double cum = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    cum += p[i] / total;
    if (cum >= sp.top_p) {
      keep = i + 1;
      break;
    }
  }
  size_t cut = 1;
  while (cut < keep && p[cut] >= sp.min_p * p[0]) ++cut;
  keep = cut;
  double kept = 0.0;
  for (size_t i = 0; i < keep; ++i) kept += p[i];
  model::Sampler stateful(sp);
  std::vector<int32_t> scratch_order;
  std::vector<double> scratch_probs;
  int distinct = 0, last = -1;
  for (int64_t step = 0; step < 200; ++step) {
    const double r = historical_draw(sp.seed, step) * kept;
    double c = 0.0;
    int32_t want = order[keep - 1];
    for (size_t i = 0; i < keep; ++i) {
      c += p[i];
      if (r < c) {
        want = order[i];
        break;
      }
    }
    const model::SampleRow row{.temperature = sp.temperature,
                               .top_k = sp.top_k,
                               .top_p = sp.top_p,
                               .min_p = sp.min_p,
                               .seed = sp.seed,
                               .step = step};
    EXPECT_EQ(model::sample_row(logits, row, scratch_order, scratch_probs), want) << step;
    EXPECT_EQ(stateful.sample(logits), want) << step;
    distinct += want != last;
    last = want;
  }
  EXPECT_GT(distinct, 20);  // it really samples
}


/// Copies the K and V of pages src[i] of `from` into pages dst[i] of `to` (host pools, same shape).
void copy_pages(const kv::KvPool& from, const std::vector<PageId>& src, kv::KvPool& to,
                const std::vector<PageId>& dst) {
  ASSERT_EQ(src.size(), dst.size());
  const size_t elem = dtype_size(from.config().dtype);
  for (int32_t l = 0; l < from.num_layers(); ++l) {
    for (bool v : {false, true}) {
      const LayerId layer{l};
      const size_t page = static_cast<size_t>(from.page_size()) * elem *
                          static_cast<size_t>(v ? from.v_row_elems() : from.k_row_elems());
      auto* out = static_cast<char*>((v ? to.v_view(layer) : to.k_view(layer)).data());
      const auto* in = static_cast<const char*>((v ? from.v_view(layer) : from.k_view(layer)).data());
      for (size_t i = 0; i < src.size(); ++i)
        std::memcpy(out + static_cast<size_t>(dst[i].value()) * page,
                    in + static_cast<size_t>(src[i].value()) * page, page);
    }
  }
}

TEST(EngineTransfer, HeldKvMovedIntoPreallocatedPagesDecodesLikeOneEngine) {
  const uint64_t seed = 0x7D15A6;
  std::printf("prompt seed %llu\n", static_cast<unsigned long long>(seed));
  const auto prompts = testing::make_prompts(seed, 6);
  const int max_new = 9;
  for (int page_size : {1, 16}) {
    SCOPED_TRACE(::testing::Message() << "page " << page_size);
    Engine colocated(test_model().model, abort_config(page_size, 0));
    Engine prefill(test_model().model, abort_config(page_size, 0));
    Engine decode(test_model().model, abort_config(page_size, 0));
    std::vector<RequestId> want, got;
    for (const auto& p : prompts) want.push_back(colocated.add_request({.prompt = p, .max_new_tokens = max_new}));
    colocated.run_until_idle();
    for (const auto& p : prompts) {
      const RequestId pid = prefill.add_request({.prompt = p, .max_new_tokens = 1, .hold_kv = true});
      prefill.run_until_idle();
      const RequestOutput po = prefill.output(pid);
      ASSERT_TRUE(po.kv_held);
      ASSERT_EQ(po.output_ids.size(), 1u);
      EXPECT_THROW(prefill.release(pid), Error);  // its KV is still held
      const RequestId did = decode.transfer().add_request({.prompt = p, .max_new_tokens = max_new});
      ASSERT_TRUE(decode.transfer().preallocate(did));
      EXPECT_THROW(decode.transfer().preallocate(did), Error);
      const testing::PdPages pages = testing::pd_pages(prefill, pid, decode, did);
      copy_pages(prefill.worker().kv_pool(), pages.src, decode.worker().kv_pool(), pages.dst);
      EXPECT_THROW(decode.transfer().commit(did, 1 << 30), Error);  // outside the vocabulary
      EXPECT_FALSE(testing::pd_commit(prefill, pid, decode, did));
      got.push_back(did);
      decode.step();  // requests join a running batch one by one
    }
    decode.run_until_idle();
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(decode.output(got[i]).output_ids, colocated.output(want[i]).output_ids) << i;
    // Preallocation admits like the scheduler (8 running slots here) and an abort gives the
    // pages back; a refused one changes nothing.
    std::vector<RequestId> parked;
    for (int i = 0; i < 9; ++i) {
      parked.push_back(decode.transfer().add_request({.prompt = prompts[i % 6], .max_new_tokens = 4}));
      EXPECT_EQ(decode.transfer().preallocate(parked.back()), i < 8) << i;
    }
    EXPECT_TRUE(decode.memory().idle_pages_accounted());
    for (RequestId id : parked) EXPECT_TRUE(decode.abort(id));
    for (Engine* e : {&prefill, &decode}) {
      EXPECT_EQ(e->memory().leaked_pages(), 0);
      EXPECT_TRUE(e->memory().idle_pages_accounted());
      e->memory().drain_prefix_cache();
      EXPECT_EQ(e->memory().free_pages(), e->memory().total_pages());
    }
  }
}

}  // namespace
}  // namespace pagoda::engine
