// Speculative decoding in the engine: losslessness with chunked prefill, the radix cache and
// follow-ups; forced retraction and abort in the middle of speculation; a tree forwarded in two
// parts (a drafter's frontier over cached ancestors) matching the whole-tree forward; exact
// sampling at temperature > 0 (randomised PIT against the target's distributions, fixed seed); a
// draft model that differs from the target; the switch-off; bad settings.
#include <cmath>
#include <cstdio>

#include "engine_spec_util.h"
#include "pagoda/core/error.h"
#include "pagoda/model/host_sampling.h"
#include "pagoda/model/llama_worker.h"
#include "pagoda/model/model_ops.h"
#include "pagoda/model/step_input.h"
#include "pagoda/spec/draft_tree.h"

namespace pagoda::engine {
namespace {

using testing::expect_lossless;
using testing::test_model;

TEST(EngineSpec, ChunkedPrefillRadixAndFollowUpsStayLossless) {
  for (SpecMode mode : {SpecMode::kNgram, SpecMode::kDraft}) {
    for (int page : {1, 16}) {
      SCOPED_TRACE(::testing::Message() << spec_mode_name(mode) << " page " << page);
      const int max_new = 12;
      const auto prompts = testing::make_prompts(77, 6);
      EngineConfig cfg{.page_size = page,
                       .pool_tokens = 4096,
                       .scheduler = SchedulerConfig{.max_running_requests = 8, .chunk_size = 16},
                       .backend = testing::backend_named("reference"),
                       .check_integrity = true,
                       .spec = testing::spec_config(mode, 2, 3)};
      Engine engine(test_model().model, cfg);
      std::vector<std::pair<RequestId, std::vector<int32_t>>> ids;
      for (int i = 0; i < 6; ++i) {
        ids.emplace_back(engine.add_request({.prompt = prompts[i], .max_new_tokens = max_new}),
                         prompts[i]);
        engine.step();
      }
      engine.run_until_idle();
      for (int i = 0; i < 2; ++i) {  // follow-ups reuse the cached conversation (spec KV included)
        auto follow = ids[i].second;
        const auto out = engine.output(ids[i].first).output_ids;
        follow.insert(follow.end(), out.begin(), out.end());
        follow.push_back(7 + i);
        ids.emplace_back(engine.add_request({.prompt = follow, .max_new_tokens = max_new}),
                         follow);
      }
      engine.run_until_idle();
      for (const auto& [id, prompt] : ids)
        testing::expect_matches_naive(engine.output(id), testing::naive_greedy(prompt, max_new),
                                      "request " + std::to_string(id));
      const EngineStats st = engine.stats();
      EXPECT_GT(st.spec_steps, 0);
      EXPECT_GT(st.scheduler.cached_tokens, 0);
      EXPECT_EQ(engine.memory().leaked_pages(), 0);
      EXPECT_TRUE(engine.memory().idle_pages_accounted());
    }
  }
}

TEST(EngineSpec, RetractionInTheMiddleOfSpeculation) {
  for (SpecMode mode : {SpecMode::kNgram, SpecMode::kDraft, SpecMode::kEagle}) {
    for (int page : {1, 16}) {
      SCOPED_TRACE(::testing::Message() << spec_mode_name(mode) << " page " << page);
      EngineConfig cfg{.page_size = page,
                       .pool_tokens = 192,
                       .scheduler = SchedulerConfig{.max_running_requests = 8},
                       .backend = testing::backend_named("reference"),
                       .check_integrity = true,
                       .spec = testing::spec_config(mode, 1, 3)};
      cfg.scheduler.new_token_ratio = NewTokenRatio{.init = 0.0, .min = 0.0, .decay = 0.0};
      Engine engine(test_model().model, cfg);
      // Three requests fit at admission and speculate; growing, they run the pool dry.
      const auto prompts = testing::make_prompts(99, 3);
      const int max_new = 40;
      std::vector<RequestId> ids;
      for (const auto& p : prompts)
        ids.push_back(engine.add_request({.prompt = p, .max_new_tokens = max_new}));
      bool retracted_after_spec = false;
      while (engine.has_work()) {
        const int64_t spec_before = engine.stats().spec_steps;
        const int64_t retr_before = engine.stats().scheduler.retractions;
        engine.step();
        retracted_after_spec |=
            spec_before > 0 && engine.stats().scheduler.retractions > retr_before;
      }
      EXPECT_TRUE(retracted_after_spec);
      for (size_t i = 0; i < ids.size(); ++i) {
        const RequestOutput out = engine.output(ids[i]);
        EXPECT_EQ(static_cast<int>(out.output_ids.size()), max_new);
        testing::expect_matches_naive(out, testing::naive_greedy(prompts[i], max_new),
                                      "req " + std::to_string(i));
      }
      EXPECT_EQ(engine.memory().leaked_pages(), 0);
      EXPECT_EQ(engine.memory().leaked_rows(), 0);
      EXPECT_TRUE(engine.memory().idle_pages_accounted());
    }
  }
}

TEST(EngineSpec, AbortBetweenSpeculativeRounds) {
  EngineConfig cfg{.page_size = 16,
                   .pool_tokens = 2048,
                   .backend = testing::backend_named("reference"),
                   .check_integrity = true,
                   .spec = testing::spec_config(SpecMode::kDraft, 2, 2)};
  Engine engine(test_model().model, cfg);
  const auto prompts = testing::make_prompts(5, 4);
  std::vector<RequestId> ids;
  for (const auto& p : prompts) ids.push_back(engine.add_request({.prompt = p, .max_new_tokens = 16}));
  while (engine.stats().spec_steps < 2) engine.step();
  EXPECT_TRUE(engine.abort(ids[1]));
  engine.run_until_idle();
  EXPECT_EQ(engine.output(ids[1]).finish_reason, FinishReason::kAbort);
  for (size_t i : {0u, 2u, 3u})
    testing::expect_matches_naive(engine.output(ids[i]), testing::naive_greedy(prompts[i], 16),
                                  "req " + std::to_string(i));
  EXPECT_EQ(engine.memory().leaked_pages(), 0);
  EXPECT_TRUE(engine.memory().idle_pages_accounted());
}

TEST(EngineSpec, EagleEchoHeadAcceptsExactlyTheTargetsRepeats) {
  // An EAGLE-1 head that passes the target's feature through (fc = [0 | I], o_proj = 0,
  // down_proj = 0) predicts lm_head(final_norm(f_p)) = the target's own greedy token at p + 1:
  // it drafts the root token S times. So a round accepts exactly the number of times the
  // target's continuation repeats the root (at most S) — which checks that every position is
  // fed the target feature of the right token, through prefill, verify and draft extend.
  auto& t = test_model();
  const model::EagleConfig ec = model::eagle_config_for(t.config, model::EagleLayout::kEagle1);
  const model::EagleHead head(ec, testing::echo_eagle_weights(ec, t.config), t.model);
  for (int page : {1, 16}) {
    const int steps = 3, max_new = 24;
    SpecConfig sc = testing::spec_config(SpecMode::kEagle, 1, steps);
    sc.eagle_head = &head;
    Engine engine(t.model, EngineConfig{.page_size = page,
                                        .pool_tokens = 4096,
                                        .backend = testing::backend_named("cpu"),
                                        .check_integrity = true,
                                        .spec = sc});
    // The target repeats itself on these prompts (a token run in the prompt).
    std::vector<std::vector<int32_t>> prompts;
    for (int32_t tok : {5, 17, 113, 200}) prompts.push_back(std::vector<int32_t>(12, tok));
    const auto& plain = testing::plain_outputs("cpu", page, prompts, max_new);
    const auto& longer = testing::plain_outputs("cpu", page, prompts, max_new + steps + 1);
    int64_t expected = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const RequestId id = engine.add_request({.prompt = prompts[i], .max_new_tokens = max_new});
      engine.run_until_idle();  // one request at a time: every step after its prefill is a round
      const auto& out = engine.output(id).output_ids;
      expect_lossless(out, plain[i], prompts[i], max_new, "req " + std::to_string(i));
      // The rounds: root full[j], its repeats accepted (a round may accept past max_new; the
      // emission stops there), next root after them.
      const auto& full = longer[i];
      for (size_t j = 0; j + 1 < out.size();) {
        size_t a = 0;
        while (a < static_cast<size_t>(steps) && full[j + 1 + a] == full[j]) ++a;
        expected += static_cast<int64_t>(a);
        j += a + 1;
      }
    }
    std::printf("[eagle-echo] page %d: accepted %lld, expected %lld\n", page,
                static_cast<long long>(engine.stats().spec.accepted), static_cast<long long>(expected));
    EXPECT_GT(expected, 0);
    EXPECT_EQ(engine.stats().spec.accepted, expected);
    EXPECT_EQ(engine.memory().leaked_pages(), 0);
  }
}

TEST(EngineSpec, DifferentDraftModelAndEosStayLossless) {
  // A draft with other random weights: few drafts are accepted, the output does not change.
  const model::ModelConfig dc = testing::test_model_config();
  const model::ModelWeights dw = model::make_random_weights(dc, 4242);
  model::LlamaModel draft(dc, dw);
  SpecConfig sc = testing::spec_config(SpecMode::kDraft, 4, 3);
  sc.draft_model = &draft;
  EngineConfig cfg{.page_size = 16,
                   .pool_tokens = 4096,
                   .backend = testing::backend_named("cpu"),
                   .check_integrity = true,
                   .spec = sc};
  Engine engine(test_model().model, cfg);
  const auto prompts = testing::repetitive_prompts(11, 5);
  const auto& plain = testing::plain_outputs("cpu", 16, prompts, 12);
  std::vector<RequestId> ids;
  for (const auto& p : prompts) ids.push_back(engine.add_request({.prompt = p, .max_new_tokens = 12}));
  engine.run_until_idle();
  for (size_t i = 0; i < ids.size(); ++i)
    expect_lossless(engine.output(ids[i]).output_ids, plain[i], prompts[i], 12,
                    "req " + std::to_string(i));
  EXPECT_GT(engine.stats().spec_steps, 0);
  EXPECT_EQ(engine.memory().leaked_pages(), 0);
}

TEST(EngineSpec, SamplingFollowsTheTargetDistribution) {
  // Token 2 of each request comes from one speculative round (self-draft, a topk-2 tree). Its
  // randomised PIT under the target's distribution p(· | prompt, token 1) must be uniform.
  // (Temperature 0.6 with top-k 12 keeps the distributions peaked enough that a biased rule —
  // accepting a draft with probability 2·p — scores 58 here; the exact rule scores ~11.)
  const uint64_t seed = 8080;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const model::SamplingParams base{.temperature = 0.6f, .top_k = 12, .top_p = 0.95f};
  const auto prompts = testing::make_prompts(seed, 4);
  const int n = 1536;
  EngineConfig cfg{.page_size = 16,
                   .pool_tokens = 8192,
                   .scheduler = SchedulerConfig{.max_running_requests = 64},
                   .backend = testing::backend_named("cpu"),
                   .spec = testing::spec_config(SpecMode::kDraft, 2, 2)};
  Engine engine(test_model().model, cfg);
  std::vector<RequestId> ids;
  for (int wave = 0; wave < n / 64; ++wave) {
    for (int i = 0; i < 64; ++i) {
      model::SamplingParams sp = base;
      sp.seed = static_cast<uint64_t>(wave * 64 + i) * 7919 + seed;
      ids.push_back(engine.add_request(
          {.prompt = prompts[static_cast<size_t>(i % 4)],
           .max_new_tokens = 2,
           .sampling = sp,
           .ignore_eos = true}));
    }
    engine.run_until_idle();  // prefill (token 1), then one spec round (token 2)
  }
  EXPECT_EQ(engine.stats().spec_steps, n / 64);
  // The target distributions: a plain engine's logits after prompt + token 1.
  Engine ref(test_model().model, EngineConfig{.page_size = 16,
                                              .pool_tokens = 8192,
                                              .backend = testing::backend_named("cpu")});
  std::map<RequestId, std::vector<float>> logits;
  ref.set_logits_observer([&](RequestId id, std::span<const float> l) {
    logits[id].assign(l.begin(), l.end());
  });
  std::vector<RequestId> ref_ids;
  for (int i = 0; i < n; ++i) {
    auto p = prompts[static_cast<size_t>(i % 4)];
    p.push_back(engine.output(ids[static_cast<size_t>(i)]).output_ids.at(0));
    ref_ids.push_back(ref.add_request({.prompt = p, .max_new_tokens = 1}));
  }
  ref.run_until_idle();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> v(0.0, 1.0);
  std::vector<int64_t> bins(10, 0);
  std::vector<double> probs;
  for (int i = 0; i < n; ++i) {
    const int32_t t2 = engine.output(ids[static_cast<size_t>(i)]).output_ids.at(1);
    model::sampling_probs(logits.at(ref_ids[static_cast<size_t>(i)]),
                          model::SampleRow{.temperature = base.temperature, .top_k = base.top_k, .top_p = base.top_p},
                          probs);
    ASSERT_GT(probs[static_cast<size_t>(t2)], 0.0) << "token outside the target's support";
    double below = 0.0;
    for (int32_t x = 0; x < t2; ++x) below += probs[static_cast<size_t>(x)];
    const double u = below + v(rng) * probs[static_cast<size_t>(t2)];
    ++bins[std::min<size_t>(9, static_cast<size_t>(u * 10.0))];
  }
  double chi2 = 0.0;
  for (int64_t b : bins) chi2 += (b - n / 10.0) * (b - n / 10.0) / (n / 10.0);
  std::printf("[stat] spec sampling PIT chi-square %.2f (9 dof, limit 27.9)\n", chi2);
  EXPECT_LT(chi2, 27.9);
  EXPECT_EQ(engine.memory().leaked_pages(), 0);
}

TEST(EngineSpec, SpeculatesWhileRequestsWaitForARunningSlot) {
  // max_running_requests 1: the others wait, yet no prefill can be admitted, so the running
  // request speculates (a waiting queue alone must not switch speculation off).
  EngineConfig cfg{.page_size = 16,
                   .pool_tokens = 2048,
                   .scheduler = SchedulerConfig{.max_running_requests = 1},
                   .backend = testing::backend_named("reference"),
                   .check_integrity = true,
                   .spec = testing::spec_config(SpecMode::kDraft, 1, 3)};
  Engine engine(test_model().model, cfg);
  const auto prompts = testing::make_prompts(21, 3);
  std::vector<RequestId> ids;
  for (const auto& p : prompts) ids.push_back(engine.add_request({.prompt = p, .max_new_tokens = 12}));
  engine.run_until_idle();
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.decode_steps, 0);  // every decode was a speculative round
  EXPECT_GE(st.spec_steps, 3);
  for (size_t i = 0; i < ids.size(); ++i)
    testing::expect_matches_naive(engine.output(ids[i]), testing::naive_greedy(prompts[i], 12),
                                  "req " + std::to_string(i));
  EXPECT_EQ(engine.memory().leaked_pages(), 0);
}

TEST(EngineSpec, SwitchesItselfOffWhenNothingPays) {
  SpecConfig sc = testing::spec_config(SpecMode::kDraft, 1, 3);
  sc.min_accepted = 1e9;  // no round ever pays: pause after every round, doubling
  EngineConfig cfg{.page_size = 16,
                   .pool_tokens = 2048,
                   .backend = testing::backend_named("reference"),
                   .spec = sc};
  Engine engine(test_model().model, cfg);
  const auto prompts = testing::make_prompts(3, 2);
  std::vector<RequestId> ids;
  for (const auto& p : prompts) ids.push_back(engine.add_request({.prompt = p, .max_new_tokens = 60}));
  engine.run_until_idle();
  const EngineStats st = engine.stats();
  EXPECT_GE(st.spec_steps, 1);
  EXPECT_GE(st.decode_steps, 4 * st.spec_steps);
  for (size_t i = 0; i < ids.size(); ++i)
    testing::expect_matches_naive(engine.output(ids[i]), testing::naive_greedy(prompts[i], 60),
                                  "req " + std::to_string(i));
}

// What a draft model's frontier step relies on: forwarding a tree's nodes first..n−1 over the
// cached K/V of nodes 0..first−1 (mask rows from first_row) gives the logits the whole-tree
// forward gives those nodes. Random trees, prefixes and splits on every exactness backend, two
// workers with their own pools (the split one never ran the whole tree).
TEST(EngineSpec, FrontierForwardMatchesTheWholeTree) {
  const uint64_t seed = 0xF207;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const model::LlamaModel& lm = test_model().model;
  const int64_t vocab = lm.config().vocab_size;
  auto platform = platform::make_cpu_platform();
  for (const std::string& backend : testing::exactness_backends()) {
    for (int iter = 0; iter < 6; ++iter) {
      const int page = iter % 2 == 0 ? 1 : 16;
      const int prefix = 5 + static_cast<int>(rng() % 60);
      const int n = 3 + static_cast<int>(rng() % 10);
      const int first = 1 + static_cast<int>(rng() % static_cast<uint64_t>(n - 1));
      SCOPED_TRACE(::testing::Message() << backend << " page " << page << " prefix " << prefix
                                        << " n " << n << " first " << first);
      spec::DraftTree tree = spec::DraftTree::root_only(static_cast<int32_t>(rng() % 200));
      for (int i = 1; i < n; ++i)
        tree.add(static_cast<int32_t>(rng() % 200), static_cast<int32_t>(rng() % static_cast<uint64_t>(i)));
      std::vector<int32_t> prompt(static_cast<size_t>(prefix));
      for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 200);
      // One worker: prefill the prompt, then forward tree nodes [a, n) after nodes [0, a) (each
      // node j at row position prefix + j, slot page + prefix + j: whole pages from page 1);
      // returns the logits of the last part.
      auto run = [&](std::vector<int> splits) {
        kv::ReqToTokenTable table(2, 256);
        model::LlamaWorker w(lm, make_model_ops(*platform, DType::kF32),
                             model::WorkerConfig{.page_size = page, .num_pages = 512 / page,
                                                 .kv_dtype = DType::kF32,
                                                 .backend = testing::backend_named(backend)},
                             table);
        const ReqSlot row = *table.alloc();
        std::vector<int32_t> slots(static_cast<size_t>(prefix + n));
        for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int32_t>(page + i);
        table.write(row, 0, slots);
        model::WorkerBatch pre;
        pre.forward = model::build_forward_batch(model::StepInput{
            .mode = attention::ForwardMode::kExtend,
            .seqs = {model::StepSequence{.req_slot = row.value(), .prefix_len = 0,
                                         .tokens = prompt, .want_logits = true}},
            .out_cache_loc = std::vector<int32_t>(slots.begin(), slots.begin() + prefix)});
        pre.input_ids = prompt;
        pre.logit_rows = {1};
        pre.sampling = {model::SamplingParams{}};
        pre.sample_step = {0};
        (void)w.run(pre);
        std::vector<float> logits;
        const std::vector<int32_t> depth = tree.depths();
        for (size_t k = 0; k + 1 < splits.size(); ++k) {
          const int a = splits[k], b = splits[k + 1];
          spec::DraftTree part = tree;  // nodes [0, b): parents come first, so a tree
          part.tokens.resize(static_cast<size_t>(b));
          part.parents.resize(static_cast<size_t>(b));
          model::WorkerBatch vb;
          attention::ForwardBatch& f = vb.forward;
          f.mode = attention::ForwardMode::kTargetVerify;
          f.batch_size = 1;
          f.spec.topk = 2;
          f.spec.num_steps = 1;
          f.spec.num_draft_tokens = b - a;
          f.req_pool_indices = {row.value()};
          f.seq_lens = {prefix + a};
          f.extend_prefix_lens = {prefix + a};
          f.extend_seq_lens = {b - a};
          for (int j = a; j < b; ++j) {
            f.positions.push_back(prefix + depth[static_cast<size_t>(j)]);
            f.out_cache_loc.push_back(slots[static_cast<size_t>(prefix + j)]);
            vb.input_ids.push_back(tree.tokens[static_cast<size_t>(j)]);
          }
          spec::append_verify_mask(part, prefix, f.spec.tree_mask, a);
          vb.logit_rows = {b - a};
          vb.sampling = {model::SamplingParams{}};
          vb.sample_step = {0};
          vb.return_logits = true;
          const model::WorkerOutput o = w.run(vb);
          if (k + 2 == splits.size()) logits = o.logits;
        }
        return logits;
      };
      const std::vector<float> whole = run({0, n});
      const std::vector<float> split = run({0, first, n});
      ASSERT_EQ(whole.size(), static_cast<size_t>(n) * static_cast<size_t>(vocab));
      ASSERT_EQ(split.size(), static_cast<size_t>(n - first) * static_cast<size_t>(vocab));
      double worst = 0;
      for (size_t i = 0; i < split.size(); ++i) {
        const double d = std::fabs(static_cast<double>(split[i]) -
                                   whole[static_cast<size_t>(first) * static_cast<size_t>(vocab) + i]);
        ASSERT_TRUE(std::isfinite(split[i])) << "logit " << i;
        worst = std::max(worst, d);
      }
      EXPECT_LT(worst, 1e-4);
    }
  }
}

TEST(EngineSpec, BadSettingsNameTheField) {
  auto make = [](SpecConfig sc) {
    EngineConfig cfg{.page_size = 16, .pool_tokens = 1024, .spec = sc};
    Engine e(test_model().model, cfg);
  };
  auto expect_field = [&](SpecConfig sc, const std::string& field) {
    try {
      make(sc);
      ADD_FAILURE() << "no error for " << field;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  SpecConfig sc = testing::spec_config(SpecMode::kNgram, 1, 3);
  sc.topk = 0;
  expect_field(sc, "topk");
  sc = testing::spec_config(SpecMode::kDraft, 1, 3);
  sc.steps = 0;
  expect_field(sc, "steps");
  sc = testing::spec_config(SpecMode::kDraft, 1, 3);
  sc.num_draft_tokens = 1;
  expect_field(sc, "num_draft_tokens");
  model::ModelConfig dc = testing::test_model_config();
  dc.vocab_size = 301;
  const model::ModelWeights dw = model::make_random_weights(dc, 1);
  model::LlamaModel draft(dc, dw);
  sc = testing::spec_config(SpecMode::kDraft, 1, 3);
  sc.draft_model = &draft;
  expect_field(sc, "vocabulary");
  // A custom worker (a WorkerFactory, as tensor parallelism builds) speculates like the
  // built-in one (engine_tp_test runs sharded targets).
  auto platform = platform::make_cpu_platform();
  const WorkerFactory factory = [&](const model::LlamaModel& m, DType dt,
                                    const model::WorkerConfig& wc, kv::ReqToTokenTable& table) {
    return std::unique_ptr<model::ModelWorker>(
        new model::LlamaWorker(m, make_model_ops(*platform, dt), wc, table));
  };
  {
    Engine e(test_model().model,
             EngineConfig{.page_size = 16,
                          .pool_tokens = 1024,
                          .spec = testing::spec_config(SpecMode::kNgram, 1, 3)},
             platform.get(), factory);
    const auto prompt = testing::make_prompts(5, 1).front();
    const RequestId id = e.add_request({.prompt = prompt, .max_new_tokens = 8});
    e.run_until_idle();
    testing::expect_matches_naive(e.output(id), testing::naive_greedy(prompt, 8), "custom worker");
    EXPECT_GT(e.stats().spec_steps, 0);
  }
  EXPECT_THROW(parse_spec_mode("medusa"), Error);
  EXPECT_EQ(parse_spec_mode("ngram"), SpecMode::kNgram);
  EXPECT_EQ(parse_spec_mode("eagle"), SpecMode::kEagle);
  // kEagle without a head names it.
  try {
    SpecConfig sc = testing::spec_config(SpecMode::kNgram, 1, 3);
    sc.mode = SpecMode::kEagle;
    sc.validate();
    ADD_FAILURE() << "eagle without a head was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("eagle_head"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pagoda::engine
