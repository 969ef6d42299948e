// Tensor parallelism on the CPU: an in-process group (LocalTpGroup: one thread per rank over
// LocalGroup) of 2 and 4 ranks runs the sharded model — heads, MLP columns and vocabulary split —
// and must produce the greedy tokens of the naive f64 reference (independent of the decoder) and
// logits within 1e-4 of the unsharded engine, in busy batches with shared prefixes and chunked
// prefill, at page sizes 1 and 16; bad batches are rejected on every rank without desyncing the
// group; sizes that do not divide the model are refused by name; speculative decoding (n-gram,
// a draft model, an EAGLE head; chains and trees, whose commits move K/V on every rank) stays
// lossless on a sharded target.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "engine_test_util.h"
#include "pagoda/core/error.h"
#include "pagoda/engine/tp.h"
#include "pagoda/model/eagle_head.h"
#include "pagoda/model/weights.h"

namespace pagoda::engine {
namespace {

using testing::backend_named;
using testing::NaiveLlama;

/// test_model_config with 4 KV heads (divisible by 4 ranks) and a 320-token vocabulary.
struct TpModel {
  model::ModelConfig config = [] {
    model::ModelConfig c = testing::test_model_config();
    c.num_kv_heads = 4;
    c.vocab_size = 320;
    c.name = "test-tp";
    return c;
  }();
  model::ModelWeights weights = model::make_random_weights(config, 0x7E45);
  model::LlamaModel model{config, weights};
};

TpModel& tp_model() {
  static TpModel m;
  return m;
}

EngineConfig tp_config(int page_size, const std::string& backend) {
  return EngineConfig{.page_size = page_size,
                      .pool_tokens = 8192,
                      .scheduler = SchedulerConfig{.max_running_requests = 8, .chunk_size = 48},
                      .backend = backend_named(backend),
                      .check_integrity = true};
}

struct RunResult {
  std::vector<std::vector<int32_t>> tokens;
  std::map<RequestId, std::vector<std::vector<float>>> logits;
};

RunResult run(int tp, int page_size, const std::string& backend,
              const std::vector<std::vector<int32_t>>& prompts, int max_new) {
  LocalTpGroup group(tp);
  RunResult res;
  {
    Engine engine(tp_model().model, tp_config(page_size, backend), nullptr,
                  tp > 1 ? group.factory() : WorkerFactory{});
    engine.set_logits_observer([&](RequestId id, std::span<const float> l) {
      res.logits[id].emplace_back(l.begin(), l.end());
    });
    std::vector<RequestId> ids;
    for (const auto& p : prompts)
      ids.push_back(engine.add_request({.prompt = p, .max_new_tokens = max_new}));
    engine.run_until_idle();
    for (RequestId id : ids) {
      const RequestOutput out = engine.output(id);
      EXPECT_EQ(out.finish_reason, FinishReason::kLength) << out.error;
      res.tokens.push_back(out.output_ids);
    }
    EXPECT_EQ(engine.memory().leaked_pages(), 0);
  }
  EXPECT_EQ(group.follower_error(), "");
  return res;
}

TEST(EngineTp, ShardedGroupsMatchNaiveAndUnshardedLogits) {
  const uint64_t seed = 0x7E4501;
  std::printf("prompt seed %llu\n", static_cast<unsigned long long>(seed));
  auto prompts = testing::make_prompts(seed, 10);
  std::vector<int32_t> longp;  // chunk-prefilled over several steps
  for (int i = 0; i < 180; ++i) longp.push_back((i * 13 + 5) % 256);
  prompts.push_back(longp);
  const int max_new = 10;
  std::vector<NaiveLlama::Greedy> naive;
  for (const auto& p : prompts)
    naive.push_back(NaiveLlama::generate(tp_model().config, tp_model().weights, p, max_new,
                                         false));
  for (const std::string& backend : testing::exactness_backends()) {
    for (int page_size : {1, 16}) {
      const RunResult base = run(1, page_size, backend, prompts, max_new);
      for (int tp : {2, 4}) {
        SCOPED_TRACE(::testing::Message() << backend << " page " << page_size << " tp " << tp);
        const RunResult got = run(tp, page_size, backend, prompts, max_new);
        for (size_t i = 0; i < prompts.size(); ++i) {
          RequestOutput out;
          out.state = RequestState::kFinished;
          out.finish_reason = FinishReason::kLength;
          out.output_ids = got.tokens[i];
          testing::expect_matches_naive(out, naive[i], "prompt " + std::to_string(i));
        }
        // Same batches, same steps: the logits agree with the unsharded engine's as far as the
        // tokens do (the reduction order differs, so allow f32 rounding).
        double worst = 0;
        for (const auto& [id, rows] : got.logits) {
          const auto& ref = base.logits.at(id);
          const size_t n = std::min(rows.size(), ref.size());
          for (size_t s = 0; s < n; ++s) {
            for (size_t v = 0; v < rows[s].size(); ++v)
              worst = std::max(worst, static_cast<double>(std::fabs(rows[s][v] - ref[s][v])));
            if (got.tokens[static_cast<size_t>(id)][s] != base.tokens[static_cast<size_t>(id)][s])
              break;
          }
        }
        EXPECT_LT(worst, 1e-4);
        std::printf("%s page %d tp %d: max |logit - unsharded| = %.2e\n", backend.c_str(),
                    page_size, tp, worst);
      }
    }
  }
}

TEST(EngineTp, SpeculationOnAShardedTargetStaysLossless) {
  // Self-draft accepts every drafted token, so trees (topk 2) commit off-chain nodes and move
  // their K/V on every rank; a follower that missed a move would read stale K/V for its heads.
  const uint64_t seed = 0x7E4502;
  std::printf("prompt seed %llu\n", static_cast<unsigned long long>(seed));
  const auto prompts = testing::make_prompts(seed, 5);
  const int max_new = 14;
  std::vector<NaiveLlama::Greedy> naive;
  for (const auto& p : prompts)
    naive.push_back(NaiveLlama::generate(tp_model().config, tp_model().weights, p, max_new,
                                         false));
  const model::EagleConfig ec =
      model::eagle_config_for(tp_model().config, model::EagleLayout::kEagle3, 200);
  const model::EagleHead head(ec, model::make_random_eagle_weights(ec, tp_model().config, 78),
                              tp_model().model);
  struct Combo {
    SpecMode mode;
    int topk, page;
  };
  const Combo combos[] = {{SpecMode::kNgram, 1, 16}, {SpecMode::kNgram, 2, 1},
                          {SpecMode::kDraft, 1, 1},  {SpecMode::kDraft, 2, 1},
                          {SpecMode::kDraft, 2, 16}, {SpecMode::kEagle, 1, 16},
                          {SpecMode::kEagle, 2, 1}};
  for (const auto [mode, topk, page] : combos) {
    SCOPED_TRACE(::testing::Message() << spec_mode_name(mode) << " topk " << topk
                                      << " page " << page);
    LocalTpGroup group(2);
    EngineConfig cfg = tp_config(page, "reference");
    cfg.spec.mode = mode;
    cfg.spec.topk = topk;
    cfg.spec.steps = 3;
    cfg.spec.num_draft_tokens = topk == 1 ? 4 : 8;
    cfg.spec.min_accepted = 0.0;  // keep speculating
    if (mode == SpecMode::kEagle) cfg.spec.eagle_head = &head;
    {
      Engine engine(tp_model().model, cfg, nullptr, group.factory());
      std::vector<RequestId> ids;
      for (const auto& p : prompts)
        ids.push_back(engine.add_request({.prompt = p, .max_new_tokens = max_new}));
      engine.run_until_idle();
      for (size_t i = 0; i < ids.size(); ++i)
        testing::expect_matches_naive(engine.output(ids[i]), naive[i],
                                      "prompt " + std::to_string(i));
      const EngineStats st = engine.stats();
      EXPECT_GT(st.spec_steps, 0);
      if (mode == SpecMode::kDraft && topk == 1) {  // a chain accepts all of itself
        EXPECT_EQ(st.spec.accepted, st.spec.draft_tokens);
      }
      EXPECT_EQ(engine.memory().leaked_pages(), 0);
    }
    EXPECT_EQ(group.follower_error(), "");
  }
}

TEST(EngineTp, RejectedBatchKeepsTheGroupInStep) {
  LocalTpGroup group(2);
  kv::ReqToTokenTable table(4, 64);
  const model::WorkerConfig wc{.page_size = 1, .num_pages = 256, .kv_dtype = DType::kF32,
                               .backend = backend_named("reference")};
  std::unique_ptr<model::ModelWorker> w =
      group.factory()(tp_model().model, DType::kF32, wc, table).worker;
  const ReqSlot row = *table.alloc();
  std::vector<int32_t> slots(8);
  for (int i = 0; i < 8; ++i) slots[i] = 10 + i;
  table.write(row, 0, slots);
  model::WorkerBatch b;
  b.forward.mode = attention::ForwardMode::kExtend;
  b.forward.batch_size = 1;
  b.forward.req_pool_indices = {row.value()};
  b.forward.seq_lens = {8};
  b.forward.extend_prefix_lens = {0};
  b.forward.extend_seq_lens = {8};
  b.forward.positions = {0, 1, 2, 3, 4, 5, 6, 7};
  b.forward.out_cache_loc = slots;
  b.input_ids = {1, 2, 3, 4, 5, 6, 7, 999};  // 999 is outside the vocabulary
  b.logit_rows = {1};
  b.sampling = {model::SamplingParams{}};
  b.sample_step = {0};
  b.return_logits = true;
  EXPECT_THROW(w->run(b), Error);
  b.input_ids.back() = 8;
  const model::WorkerOutput out = w->run(b);  // the follower skipped the bad one too
  ASSERT_EQ(out.tokens.size(), 1u);
  NaiveLlama naive(tp_model().config, tp_model().weights);
  std::vector<double> ref;
  for (int32_t t : b.input_ids) ref = naive.feed(t);
  double worst = 0;
  for (size_t v = 0; v < ref.size(); ++v)
    worst = std::max(worst, std::fabs(static_cast<double>(out.logits[v]) - ref[v]));
  EXPECT_LT(worst, 1e-3);
  w.reset();
  EXPECT_EQ(group.follower_error(), "");
}

TEST(EngineTp, SizesThatDoNotDivideTheModelAreRefusedByName) {
  for (int tp : {3, 8}) {
    LocalTpGroup group(tp);
    try {
      Engine engine(tp_model().model, tp_config(16, "reference"), nullptr, group.factory());
      FAIL() << "tp " << tp << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
      EXPECT_NE(std::string(e.what()).find("num_attention_heads"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(LocalTpGroup(0), Error);
}

}  // namespace
}  // namespace pagoda::engine
