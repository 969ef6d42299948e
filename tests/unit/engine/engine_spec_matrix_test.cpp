// Lossless speculative decoding, the full matrix: backends (reference, cpu, hybrid) × page sizes
// 1/16/64 × topk 1/4 × steps 1/3/5 × n-gram / self-draft, in a busy batch with staggered
// arrivals. Greedy output equals the plain engine's token for token; no page leaks; self-draft
// with topk 1 accepts every drafted token. EAGLE heads (random weights: mechanics only) on
// reference / cpu × pages 1/16/64 and hybrid × pages 16/64, × topk 1/4 × steps 1/3 (EAGLE-1 at
// page 16, EAGLE-3 with a draft vocabulary elsewhere). (Label "spec": not repeated under ASan.)
#include "engine_spec_util.h"

namespace pagoda::engine {
namespace {

struct Case {
  std::string backend;
  int page;
  int topk;
  int steps;
  SpecMode mode;
};

std::string case_name(const Case& c) {
  return c.backend + "_p" + std::to_string(c.page) + "_k" + std::to_string(c.topk) + "_s" +
         std::to_string(c.steps) + "_" + spec_mode_name(c.mode);
}

void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const auto& b : testing::spec_backends())
    for (int p : {1, 16, 64})
      for (int k : {1, 4})
        for (int s : {1, 3, 5})
          for (SpecMode m : {SpecMode::kNgram, SpecMode::kDraft}) cases.push_back({b, p, k, s, m});
  for (const auto& b : testing::spec_backends()) {
    const std::vector<int> pages =
        b == "hybrid" ? std::vector<int>{16, 64} : std::vector<int>{1, 16, 64};
    for (int p : pages)
      for (int k : {1, 4})
        for (int s : {1, 3}) cases.push_back({b, p, k, s, SpecMode::kEagle});
  }
  return cases;
}

class SpecMatrix : public ::testing::TestWithParam<Case> {};

TEST_P(SpecMatrix, GreedyIsLosslessInABusyBatch) {
  const Case& c = GetParam();
  const uint64_t seed = 1701;
  SCOPED_TRACE(::testing::Message() << "prompt seed " << seed << " weight seed "
                                    << testing::kWeightSeed);
  const int max_new = 14;
  const auto prompts = testing::repetitive_prompts(seed, 6);
  const auto& plain = testing::plain_outputs(c.backend, c.page, prompts, max_new);
  EngineConfig cfg{.page_size = c.page,
                   .pool_tokens = 8192,
                   .backend = testing::spec_backend(c.backend),
                   .check_integrity = true,
                   .spec = testing::spec_config(
                       c.mode, c.topk, c.steps,
                       c.page == 16 ? model::EagleLayout::kEagle1 : model::EagleLayout::kEagle3)};
  Engine engine(testing::test_model().model, cfg);
  std::vector<RequestId> ids;
  for (int i = 0; i < 6; ++i) {
    ids.push_back(engine.add_request({.prompt = prompts[i], .max_new_tokens = max_new}));
    if (i == 2)
      for (int s = 0; s < 4; ++s) engine.step();  // later arrivals join running speculation
  }
  engine.run_until_idle();
  for (size_t i = 0; i < ids.size(); ++i)
    testing::expect_lossless(engine.output(ids[i]).output_ids, plain[i], prompts[i], max_new,
                             case_name(c) + " request " + std::to_string(i));
  const EngineStats st = engine.stats();
  EXPECT_GT(st.spec_steps, 0);
  EXPECT_EQ(engine.memory().leaked_pages(), 0);
  EXPECT_EQ(engine.memory().leaked_rows(), 0);
  EXPECT_TRUE(engine.memory().idle_pages_accounted());
  testing::report_spec_case(case_name(c), st, c.mode, c.topk);
  if (c.mode == SpecMode::kDraft) {
    EXPECT_GT(st.spec.mean_accept_length(), 1.0);
  }
}

INSTANTIATE_TEST_SUITE_P(All, SpecMatrix, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return case_name(info.param); });

}  // namespace
}  // namespace pagoda::engine
