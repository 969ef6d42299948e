// A hybrid model (Bamba: Mamba2 layers beside attention layers, docs/design/state_pool.md)
// through the whole engine. A tiny BambaForCausalLM config (4 layers, attention at 1 and 3; the
// Mamba2 layers with 2 groups and SSD chunks of 8) with seeded random weights; prompts of 1 to
// 70 tokens from a printed seed. Each output is checked against the prompt run alone (reference
// backend, page 1, one request per engine), the whole forward of which is checked against an
// independent NumPy float64 forward by model_bamba_numpy. Runs: several requests of different
// lengths together, half of them added while the first decode (mixed batches: prefills beside
// decodes), on the reference and cpu backends at pages 1 and 16, with and without chunked
// prefill; then with a KV pool so small that decoding retracts requests (their state is dropped
// and rebuilt by prefilling prompt + output again) and one request is aborted mid-decode. Every
// run: identical tokens, 0 leaked pages, rows and states (check_integrity after every step,
// which audits the state pool and the snapshots), every state slot free once the prefix cache
// is drained. Multi-turn follow-ups hit the radix cache's state snapshots
// (cache::MambaRadixCache): their outputs equal a cold run of the same prompts without a prefix
// cache. What cannot follow the Mamba2 state is refused naming the hybrid state pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine_test_util.h"
#include "test_seed.h"
#include "pagoda/core/error.h"
#include "pagoda/kv/state_pool.h"
#include "pagoda/model/config.h"

namespace pagoda::engine {
namespace {

testing::TestModel& bamba_model() {
  static testing::TestModel m(model::config_from_hf_json(nlohmann::json::parse(R"({
    "architectures": ["BambaForCausalLM"], "model_type": "bamba", "vocab_size": 300,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
    "num_attention_heads": 2, "num_key_value_heads": 1, "attn_layer_indices": [1, 3],
    "mamba_n_heads": 4, "mamba_d_head": 32, "mamba_n_groups": 2, "mamba_d_state": 8,
    "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 8, "mamba_conv_bias": true,
    "mamba_proj_bias": true, "max_position_embeddings": 1024, "bos_token_id": 1,
    "eos_token_id": 2})")));
  return m;
}

/// The prompts' seed, one per process (alone_outputs caches each prompt's output).
uint64_t hybrid_prompt_seed() { return testing::process_seed(); }

std::vector<std::vector<int32_t>> hybrid_prompts(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> prompts;
  for (int len : {70, 1, 23, 9, 41, 16}) {
    std::vector<int32_t> p(static_cast<size_t>(len));
    for (int32_t& x : p) x = static_cast<int32_t>(3 + rng() % 297);
    prompts.push_back(p);
  }
  return prompts;
}

constexpr int kMaxNew = 12;

EngineConfig hybrid_config(const std::string& backend, int page) {
  return EngineConfig{.page_size = page,
                      .pool_tokens = 2048,
                      .max_context_len = 256,
                      .scheduler = SchedulerConfig{.max_running_requests = 6},
                      .backend = testing::backend_named(backend),
                      .check_integrity = true};
}

/// The engine's audits after a run: nothing leaked; once the prefix cache is drained (its
/// snapshots' slots with it), every state slot free again.
void expect_clean(Engine& engine) {
  EXPECT_EQ(engine.memory().leaked_pages(), 0);
  EXPECT_EQ(engine.memory().leaked_rows(), 0);
  EXPECT_TRUE(engine.memory().leaked_states().empty());
  const kv::StatePool* states = engine.worker().state_pool();
  ASSERT_NE(states, nullptr);
  engine.memory().drain_prefix_cache();
  EXPECT_EQ(states->num_held(), 0);
  states->check_integrity();
  EXPECT_TRUE(engine.memory().leaked_states().empty());
}

/// Each prompt alone on the reference backend at page 1 (`ignore_eos`: every one generates
/// kMaxNew tokens, whatever the random prompts make the model say).
std::vector<std::vector<int32_t>> alone_outputs_of(bool ignore_eos) {
  std::vector<std::vector<int32_t>> o;
  for (const auto& p : hybrid_prompts(hybrid_prompt_seed())) {
    Engine engine(bamba_model().model, hybrid_config("reference", 1));
    const RequestId id =
        engine.add_request({.prompt = p, .max_new_tokens = kMaxNew, .ignore_eos = ignore_eos});
    engine.run_until_idle();
    o.push_back(engine.output(id).output_ids);
    expect_clean(engine);
  }
  return o;
}

const std::vector<std::vector<int32_t>>& alone_outputs() {
  static const std::vector<std::vector<int32_t>> out = alone_outputs_of(false);
  return out;
}

/// Per prompt, the top-2 logprob margin of each token of its alone run (alone_outputs: the same
/// run with logprobs asked for, which change no token).
const std::vector<std::vector<float>>& alone_margins() {
  static const std::vector<std::vector<float>> out = [] {
    std::vector<std::vector<float>> m;
    for (const auto& p : hybrid_prompts(hybrid_prompt_seed())) {
      Engine engine(bamba_model().model, hybrid_config("reference", 1));
      const RequestId id =
          engine.add_request({.prompt = p, .max_new_tokens = kMaxNew, .logprobs = 2});
      engine.run_until_idle();
      m.emplace_back();
      for (const model::TokenLogprobs& t : engine.output(id).logprobs)
        m.back().push_back(t.top.size() < 2 ? 1e9f : t.top[0].second - t.top[1].second);
    }
    return m;
  }();
  return out;
}

TEST(EngineHybrid, ConcurrentRequestsEqualEachRunAlone) {
  const testing::TestSeed seed(hybrid_prompt_seed());
  const auto prompts = hybrid_prompts(seed);
  const auto& want = alone_outputs();
  for (const std::string& backend : testing::exactness_backends()) {
    for (int page : {1, 16}) {
      for (int chunk : {0, 16}) {
        SCOPED_TRACE(::testing::Message() << backend << " page " << page << " chunk " << chunk);
        EngineConfig cfg = hybrid_config(backend, page);
        cfg.scheduler.chunk_size = chunk;
        Engine engine(bamba_model().model, cfg);
        std::vector<RequestId> ids;
        for (size_t i = 0; i < prompts.size(); ++i) {
          if (i == prompts.size() / 2)  // the rest join running decodes
            for (int s = 0; s < 3; ++s) engine.step();
          ids.push_back(engine.add_request({.prompt = prompts[i], .max_new_tokens = kMaxNew}));
        }
        engine.run_until_idle();
        for (size_t i = 0; i < ids.size(); ++i)
          EXPECT_EQ(engine.output(ids[i]).output_ids, want[i]) << "prompt " << i;
        EXPECT_GT(engine.stats().mixed_steps, 0) << "no prefill ran beside decodes";
        EXPECT_EQ(engine.stats().scheduler.cached_tokens, 0) << "a prefix was reused";
        expect_clean(engine);
      }
    }
  }
}

TEST(EngineHybrid, RetractionUnderKvPressureAndAbortKeepOutputsAndLeakNothing) {
  const testing::TestSeed seed(hybrid_prompt_seed());
  const auto prompts = hybrid_prompts(seed);
  // Every request generates kMaxNew tokens (an early EOS, seed 5440705670587409116, left the
  // pool room enough not to retract).
  const auto want = alone_outputs_of(true);
  for (const std::string& backend : testing::exactness_backends()) {
    SCOPED_TRACE(backend);
    EngineConfig cfg = hybrid_config(backend, 4);
    cfg.pool_tokens = 128;  // the prompts and outputs need 232 tokens: decoding retracts
    cfg.scheduler.new_token_ratio = NewTokenRatio{.init = 0.0, .min = 0.0, .decay = 0.0};
    Engine engine(bamba_model().model, cfg);
    std::vector<RequestId> ids;
    for (const auto& p : prompts)
      ids.push_back(
          engine.add_request({.prompt = p, .max_new_tokens = kMaxNew, .ignore_eos = true}));
    // One extra request, aborted once it decodes (ignoring EOS too: with seed
    // 13181314090197140148 its first token was EOS, so it finished before it ever decoded).
    const RequestId victim = engine.add_request(
        {.prompt = prompts[3], .max_new_tokens = 40, .ignore_eos = true});
    while (engine.has_work()) {
      engine.step();
      if (engine.output(victim).state == RequestState::kDecoding) engine.abort(victim);
    }
    EXPECT_EQ(engine.output(victim).finish_reason, FinishReason::kAbort);
    for (size_t i = 0; i < ids.size(); ++i) {
      const RequestOutput out = engine.output(ids[i]);
      EXPECT_EQ(out.output_ids, want[i]) << "prompt " << i << " (" << out.num_retractions
                                         << " retractions) " << out.error;
    }
    EXPECT_GT(engine.stats().scheduler.retractions, 0) << "the pool did not force a retraction";
    expect_clean(engine);
  }
}

/// Adds every prompt (kMaxNew greedy tokens each), runs the engine idle, returns the outputs.
std::vector<std::vector<int32_t>> run_all(Engine& engine,
                                          const std::vector<std::vector<int32_t>>& prompts) {
  std::vector<RequestId> ids;
  for (const auto& p : prompts)
    ids.push_back(engine.add_request({.prompt = p, .max_new_tokens = kMaxNew}));
  engine.run_until_idle();
  std::vector<std::vector<int32_t>> out;
  for (RequestId id : ids) out.push_back(engine.output(id).output_ids);
  return out;
}

TEST(EngineHybrid, MultiTurnFollowUpsRestoreStateSnapshotsAndEqualAColdRun) {
  const testing::TestSeed seed(hybrid_prompt_seed());
  const auto prompts = hybrid_prompts(seed);
  std::mt19937_64 rng(seed ^ 0x7u);
  for (const std::string& backend : testing::exactness_backends()) {
    for (int page : {1, 16}) {
      for (int chunk : {0, 16}) {
        SCOPED_TRACE(::testing::Message() << backend << " page " << page << " chunk " << chunk);
        EngineConfig cfg = hybrid_config(backend, page);
        cfg.scheduler.chunk_size = chunk;
        Engine warm(bamba_model().model, cfg);
        // Turn 1: three conversations.
        const std::vector<std::vector<int32_t>> firsts{prompts[0], prompts[2], prompts[4]};
        const auto turn1 = run_all(warm, firsts);
        // Turn 2: each conversation so far plus new tokens; the first one twice (two branches
        // restore the same snapshot, side by side).
        std::vector<std::vector<int32_t>> follow;
        std::vector<int64_t> turn1_kv;  // the KV each conversation's turn 1 ended with
        for (size_t c = 0; c < firsts.size(); ++c) {
          std::vector<int32_t> t = firsts[c];
          t.insert(t.end(), turn1[c].begin(), turn1[c].end());
          turn1_kv.push_back(static_cast<int64_t>(t.size()) - 1);
          for (int b = 0; b < (c == 0 ? 2 : 1); ++b) {
            std::vector<int32_t> branch = t;
            for (int i = 0; i < 5; ++i) branch.push_back(static_cast<int32_t>(3 + rng() % 297));
            follow.push_back(branch);
          }
        }
        const int64_t cached_before = warm.stats().scheduler.cached_tokens;
        const auto warm_out = run_all(warm, follow);
        const int64_t cached = warm.stats().scheduler.cached_tokens - cached_before;
        EngineConfig cold_cfg = cfg;
        cold_cfg.radix_cache = false;
        Engine cold(bamba_model().model, cold_cfg);
        const auto cold_out = run_all(cold, follow);
        for (size_t i = 0; i < follow.size(); ++i)
          EXPECT_EQ(warm_out[i], cold_out[i]) << "follow-up " << i;
        EXPECT_EQ(cold.stats().scheduler.cached_tokens, 0);
        // Each turn 1 left a snapshot at its KV length rounded down to a page: at page 1 its whole
        // KV; at page 16 the state a step ended at on that page boundary (the aligned-state
        // slot: reached while decoding when the boundary is at or past the prompt, else as a
        // chunk end). Each follow-up restores exactly that.
        int64_t want = 0;
        for (size_t c = 0; c < firsts.size(); ++c) {
          const int64_t f = turn1_kv[c] / page * page;
          const bool kept = f >= static_cast<int64_t>(firsts[c].size()) || chunk > 0;
          want += (c == 0 ? 2 : 1) * (kept ? f : 0);
        }
        EXPECT_EQ(cached, want) << "not every follow-up restored its conversation's state";
        EXPECT_GT(cached, 0);
        expect_clean(warm);
        expect_clean(cold);
      }
    }
  }
}

TEST(EngineHybrid, NgramSpeculationRollsBackTheStateAndEqualsPlainDecoding) {
  const testing::TestSeed seed(hybrid_prompt_seed());
  std::mt19937_64 rng(seed ^ 0x5u);
  // Prompts that repeat a span (the n-gram drafter proposes from them) and the random ones.
  std::vector<std::vector<int32_t>> prompts = hybrid_prompts(seed);
  for (int k = 0; k < 3; ++k) {
    std::vector<int32_t> span(static_cast<size_t>(5 + k * 3)), p;
    for (int32_t& x : span) x = static_cast<int32_t>(3 + rng() % 297);
    for (int r = 0; r < 4; ++r) p.insert(p.end(), span.begin(), span.end());
    prompts.push_back(p);
  }
  constexpr int kNew = 32;
  for (const std::string& backend : testing::exactness_backends()) {
    // Over the backend's runs. Every round copies its last kept node's state back (the root's
    // when no draft is accepted), so a round tests the rollback whatever the random weights
    // accept; accepted drafts (often none) are printed.
    int64_t rounds = 0, accepted = 0;
    for (int page : {1, 16}) {
      for (int topk : {1, 2}) {  // chains, then trees (node states from their parents)
        SCOPED_TRACE(::testing::Message() << backend << " page " << page << " topk " << topk);
        // Plain decoding with the top-2 log-probabilities (the margin of each greedy token), or
        // n-gram speculation (which returns no log-probabilities).
        auto run = [&](bool speculate, std::vector<std::vector<float>>* margins) {
          EngineConfig cfg = hybrid_config(backend, page);
          cfg.scheduler.max_running_requests = static_cast<int32_t>(prompts.size());
          if (speculate) {
            cfg.spec.mode = SpecMode::kNgram;
            cfg.spec.topk = topk;
            cfg.spec.steps = 3;
            cfg.spec.num_draft_tokens = 5;
            cfg.spec.min_accepted = 0.0;  // never pause
          }
          Engine engine(bamba_model().model, cfg);
          std::vector<RequestId> ids;
          for (const auto& p : prompts)
            ids.push_back(engine.add_request(
                {.prompt = p, .max_new_tokens = kNew, .logprobs = speculate ? -1 : 2}));
          engine.run_until_idle();
          std::vector<std::vector<int32_t>> out;
          for (RequestId id : ids) {
            out.push_back(engine.output(id).output_ids);
            if (margins == nullptr) continue;
            margins->emplace_back();
            for (const model::TokenLogprobs& t : engine.output(id).logprobs)
              margins->back().push_back(t.top.size() < 2 ? 1e9f
                                                          : t.top[0].second - t.top[1].second);
          }
          if (const auto* sw = dynamic_cast<const SpecWorker*>(&engine.worker())) {
            rounds += sw->spec_stats().accept.rounds;
            accepted += sw->spec_stats().accept.accepted;
          }
          expect_clean(engine);
          return out;
        };
        std::vector<std::vector<float>> margins;
        const auto plain = run(false, &margins);
        const auto spec = run(true, nullptr);
        for (size_t i = 0; i < prompts.size(); ++i) {
          ASSERT_EQ(spec[i].size(), plain[i].size()) << "prompt " << i;
          for (size_t t = 0; t < spec[i].size(); ++t) {
            if (spec[i][t] == plain[i][t]) continue;
            // Verify runs the attention layers as an extend, decoding as decode steps: f32
            // rounding may flip a near tie, and only that.
            ASSERT_LT(margins[i][t], 1e-3f) << "prompt " << i << " token " << t << ": spec "
                                            << spec[i][t] << ", plain " << plain[i][t];
            std::printf("[note] prompt %zu: near tie at token %zu, comparison stops\n", i, t);
            break;
          }
        }
      }
    }
    std::printf("[note] %s: %lld verify rounds, %lld draft tokens accepted\n", backend.c_str(),
                static_cast<long long>(rounds), static_cast<long long>(accepted));
    EXPECT_GT(rounds, 0) << backend << ": no verify round ran";
  }
}

// The Mamba2 layers run on the linear-attention backend of the selection (--backend NAME gives
// NAME's linear kind) unless --linear-backend names another: each mix gives the outputs of the
// prompts run alone; an unknown name is refused before anything is built, naming it.
TEST(EngineHybrid, LinearBackendFollowsTheSelectionOrItsOwnFlag) {
  const testing::TestSeed seed(hybrid_prompt_seed());
  const auto prompts = hybrid_prompts(seed);
  const auto& want = alone_outputs();
  for (const std::string& attention : testing::exactness_backends()) {
    for (const std::string& linear : testing::exactness_backends()) {
      SCOPED_TRACE(attention + " attention, " + linear + " linear layers");
      EngineConfig cfg = hybrid_config(attention, 16);
      cfg.backend.linear = linear;
      Engine engine(bamba_model().model, cfg);
      std::vector<RequestId> ids;
      for (size_t i = 0; i < 3; ++i)
        ids.push_back(engine.add_request({.prompt = prompts[i], .max_new_tokens = kMaxNew}));
      engine.run_until_idle();
      // Equal to the alone run, but for an f32 flip of a near tie (the alone run's top-2 margin
      // < 1e-3 there), after which the comparison stops.
      for (size_t i = 0; i < ids.size(); ++i) {
        const std::vector<int32_t> got = engine.output(ids[i]).output_ids;
        bool flipped = false;
        for (size_t t = 0; t < std::min(got.size(), want[i].size()) && !flipped; ++t) {
          if (got[t] == want[i][t]) continue;
          ASSERT_LT(alone_margins()[i][t], 1e-3f) << "prompt " << i << " token " << t << ": "
                                                  << got[t] << ", alone " << want[i][t];
          std::printf("[note] prompt %zu: near tie at token %zu, comparison stops\n", i, t);
          flipped = true;
        }
        if (!flipped) {
          EXPECT_EQ(got, want[i]) << "prompt " << i;
        }
      }
    }
  }
  EngineConfig unknown = hybrid_config("reference", 1);
  unknown.backend.linear = "mamba-kernels";
  try {
    Engine engine(bamba_model().model, unknown);
    ADD_FAILURE() << "an unknown --linear-backend was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("linear-attention backend 'mamba-kernels'"),
              std::string::npos)
        << e.what();
  }
}

TEST(EngineHybrid, RefusesWhatCannotFollowTheState) {
  model::LlamaModel& m = bamba_model().model;
  auto refused = [&](EngineConfig cfg, const char* what) {
    try {
      Engine engine(m, cfg);
      ADD_FAILURE() << what << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << what;
      EXPECT_NE(std::string(e.what()).find("hybrid state pool"), std::string::npos)
          << what << ": " << e.what();
    }
  };
  EngineConfig spec = hybrid_config("reference", 1);
  spec.spec.mode = SpecMode::kDraft;  // self-draft: a draft model would need states of its own
  refused(spec, "speculative decoding with a draft model");
  EngineConfig overlap = hybrid_config("reference", 1);
  overlap.overlap = true;
  refused(overlap, "the overlap scheduler");
  EngineConfig hicache = hybrid_config("reference", 1);
  hicache.hicache.host.ratio = 2.0;
  refused(hicache, "the hierarchical cache");
  Engine engine(m, hybrid_config("reference", 1));
  for (bool prefill_side : {false, true}) {
    SCOPED_TRACE(prefill_side ? "hold_kv" : "transfer");
    try {
      if (prefill_side) {
        engine.add_request({.prompt = {3, 4}, .max_new_tokens = 2, .hold_kv = true});
      } else {
        engine.transfer().add_request({.prompt = {3, 4}, .max_new_tokens = 2});
      }
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("hybrid state pool"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace pagoda::engine
