// Lossless speculative decoding crossed with the model features (issue 52): a sliding window
// smaller than the prompts (Mistral layout), q/k/v biases (Qwen2), llama3 RoPE scaling, and
// attention + final-logit soft caps, each × n-gram / self-draft / EAGLE-1 (an echo head that
// drafts the target's own top-k) × topk 1 / 4 × steps 1 / 3 × page 1 / 16, on the cpu backend
// (the reference when cpu is not built), in a batch with a late arrival. The plain engine's
// greedy output must match the naive f64 model of the same config, and the speculative output
// the plain one token for token (a near tie of the f64 model is the only accepted difference).
// Trees of topk 4 × steps 3 are 3 deep with 4-way branches, so tree nodes sit at positions
// (prefix + depth) below their indices. No model family has attention sinks (ModelConfig has
// none); the conformance grid's verify-window cases cover sinks at the kernel level.
// (Label "spec": not repeated under ASan.)
#include <cstdio>
#include <memory>
#include <random>

#include "engine_spec_util.h"
#include "pagoda/core/error.h"

namespace pagoda::engine {
namespace {

/// The features the matrix crosses with speculation (model families' data, ModelConfig).
enum class Feature { kWindow, kQkvBias, kLlama3Rope, kSoftCap };

std::string feature_name(Feature f) {
  switch (f) {
    case Feature::kWindow: return "window";
    case Feature::kQkvBias: return "qkvbias";
    case Feature::kLlama3Rope: return "llama3rope";
    case Feature::kSoftCap: return "softcap";
  }
  return "?";
}

/// A sliding window (HF sliding_window 12) below the prompts' 12..59 tokens plus 16 outputs.
constexpr int kWindow = 11;

model::ModelConfig feature_config(Feature f) {
  model::ModelConfig c = testing::test_model_config();
  switch (f) {
    case Feature::kWindow:
      c.family = model::ModelFamily::kMistral;
      c.layer_window.assign(static_cast<size_t>(c.num_layers), kWindow);
      c.rope.theta = 1e6;
      break;
    case Feature::kQkvBias:
      c = testing::qwen2_test_config();
      break;
    case Feature::kLlama3Rope:
      c.rope.theta = 500000.0;
      c.rope.scaling = model::RopeScalingKind::kLlama3;
      c.rope.factor = 8.0;
      c.rope.low_freq_factor = 1.0;
      c.rope.high_freq_factor = 4.0;
      c.rope.original_max_position = 64;  // so the scaled band covers these short contexts
      break;
    case Feature::kSoftCap:
      c.attn_logit_softcap = 1.0f;
      c.final_logit_softcap = 4.0f;
      break;
  }
  c.name = "test-" + feature_name(f);
  return c;
}

/// The model of a feature, its echo EAGLE-1 head (testing::echo_eagle_weights) and the naive f64 greedy references per
/// prompt (cached).
struct FeatureModel {
  explicit FeatureModel(Feature f)
      : config(feature_config(f)),
        weights(model::make_random_weights(config, testing::kWeightSeed)),
        model(config, weights),
        head_config(model::eagle_config_for(config, model::EagleLayout::kEagle1)),
        head(head_config, testing::echo_eagle_weights(head_config, config), model) {}
  const testing::NaiveLlama::Greedy& naive(const std::vector<int32_t>& prompt, int max_new) {
    auto key = std::make_pair(prompt, max_new);
    auto it = greedy.find(key);
    if (it == greedy.end()) {
      it = greedy.emplace(key, testing::NaiveLlama::generate(config, weights, prompt, max_new, false))
               .first;
    }
    return it->second;
  }
  model::ModelConfig config;
  model::ModelWeights weights;
  model::LlamaModel model;
  model::EagleConfig head_config;
  model::EagleHead head;
  std::map<std::pair<std::vector<int32_t>, int>, testing::NaiveLlama::Greedy> greedy;
};

FeatureModel& feature_model(Feature f) {
  static std::map<Feature, std::unique_ptr<FeatureModel>> models;
  auto& m = models[f];
  if (m == nullptr) m = std::make_unique<FeatureModel>(f);
  return *m;
}

std::string backend_name() { return testing::exactness_backends().back(); }  // cpu if built

constexpr uint64_t kPromptSeed = 5202;
constexpr int kRequests = 4;
constexpr int kMaxNew = 16;

/// Prompts the model partly continues itself: x + g + x + h + y + x + h, with x 8 random tokens,
/// g the naive model's 20-token greedy continuation of x, h = g[0, 4 + i) and y a random token:
/// the n-gram trie then branches at the root (y, the more recent continuation of x + h, comes
/// first; g's continuation after it), so the right path sits at node indices above its depths.
const std::vector<std::vector<int32_t>>& prompts_of(Feature f) {
  static std::map<Feature, std::vector<std::vector<int32_t>>> cache;
  auto it = cache.find(f);
  if (it != cache.end()) return it->second;
  FeatureModel& fm = feature_model(f);
  std::mt19937_64 rng(kPromptSeed);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kRequests; ++i) {
    std::vector<int32_t> x(8);
    for (auto& t : x) t = static_cast<int32_t>(rng() % 256);
    const auto g = fm.naive(x, 20).tokens;
    std::vector<int32_t> p = x;
    p.insert(p.end(), g.begin(), g.end());
    for (int copy = 0; copy < 2; ++copy) {
      p.insert(p.end(), x.begin(), x.end());
      p.insert(p.end(), g.begin(), g.begin() + 4 + i);
      if (copy == 0) p.push_back(static_cast<int32_t>(rng() % 256));
    }
    prompts.push_back(std::move(p));
  }
  return cache.emplace(f, std::move(prompts)).first->second;
}

/// Runs the batch (two requests, four steps, then the rest) and returns the outputs.
std::vector<std::vector<int32_t>> run_batch(Feature f, int page, const SpecConfig& spec,
                                            EngineStats* stats) {
  FeatureModel& fm = feature_model(f);
  const auto& prompts = prompts_of(f);
  Engine engine(fm.model, EngineConfig{.page_size = page,
                                       .pool_tokens = 4096,
                                       .backend = testing::backend_named(backend_name()),
                                       .check_integrity = true,
                                       .spec = spec});
  std::vector<RequestId> ids;
  for (int i = 0; i < kRequests; ++i) {
    ids.push_back(engine.add_request({.prompt = prompts[static_cast<size_t>(i)],
                                      .max_new_tokens = kMaxNew}));
    if (i == 1)
      for (int s = 0; s < 4; ++s) engine.step();
  }
  engine.run_until_idle();
  EXPECT_EQ(engine.memory().leaked_pages(), 0);
  EXPECT_EQ(engine.memory().leaked_rows(), 0);
  EXPECT_TRUE(engine.memory().idle_pages_accounted());
  if (stats != nullptr) *stats = engine.stats();
  std::vector<std::vector<int32_t>> outs;
  for (RequestId id : ids) outs.push_back(engine.output(id).output_ids);
  return outs;
}

/// `got` equals `want` token for token; at the first difference the feature's naive f64 model
/// must show a near tie (< 1e-3), and the comparison stops there. `eos_may_end`: `want` is the
/// naive model's, which does not stop at EOS, so `got` may end early with EOS.
void expect_same(FeatureModel& fm, const std::vector<int32_t>& prompt,
                 const std::vector<int32_t>& got, const std::vector<int32_t>& want,
                 const std::string& what, bool eos_may_end = false) {
  if (eos_may_end && got.size() < want.size()) {
    ASSERT_FALSE(got.empty()) << what;
    ASSERT_EQ(got.back(), fm.config.eos_token_id) << what << ": ended early without EOS";
  } else {
    ASSERT_EQ(got.size(), want.size()) << what;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    const double margin = fm.naive(prompt, kMaxNew).margins[i];
    ASSERT_LT(margin, 1e-3) << what << ": token " << i << " is " << got[i] << ", expected "
                            << want[i] << " (f64 margin " << margin << ")";
    std::printf("[note] %s: near tie at token %zu (margin %.2e), comparison stops\n",
                what.c_str(), i, margin);
    return;
  }
}

/// Plain greedy outputs per (feature, page), checked once against the naive f64 model.
const std::vector<std::vector<int32_t>>& plain_outputs(Feature f, int page) {
  static std::map<std::pair<Feature, int>, std::vector<std::vector<int32_t>>> cache;
  auto it = cache.find({f, page});
  if (it != cache.end()) return it->second;
  FeatureModel& fm = feature_model(f);
  auto outs = run_batch(f, page, SpecConfig{}, nullptr);
  const auto& prompts = prompts_of(f);
  for (size_t i = 0; i < outs.size(); ++i) {
    expect_same(fm, prompts[i], outs[i], fm.naive(prompts[i], kMaxNew).tokens,
                feature_name(f) + " plain p" + std::to_string(page) + " request " +
                    std::to_string(i) + " vs naive",
                /*eos_may_end=*/true);
  }
  return cache.emplace(std::make_pair(f, page), std::move(outs)).first->second;
}

struct Case {
  Feature feature;
  SpecMode mode;
  int topk;
  int steps;
  int page;
};

std::string case_name(const Case& c) {
  return feature_name(c.feature) + "_" + spec_mode_name(c.mode) + "_k" + std::to_string(c.topk) +
         "_s" + std::to_string(c.steps) + "_p" + std::to_string(c.page);
}

/// One CTest entry per (feature, drafter), looping over topk × steps × page inside: a process
/// per case would spend most of its time rebuilding the model and its references.
using Row = std::pair<Feature, SpecMode>;

std::string row_name(const Row& r) {
  return feature_name(r.first) + "_" + spec_mode_name(r.second);
}

std::vector<Row> all_rows() {
  std::vector<Row> rows;
  for (Feature f : {Feature::kWindow, Feature::kQkvBias, Feature::kLlama3Rope, Feature::kSoftCap})
    for (SpecMode m : {SpecMode::kNgram, SpecMode::kDraft, SpecMode::kEagle}) rows.push_back({f, m});
  return rows;
}

class SpecFeatures : public ::testing::TestWithParam<Row> {};

TEST_P(SpecFeatures, GreedyIsLossless) {
  const auto [feature, mode] = GetParam();
  SCOPED_TRACE(::testing::Message() << "prompt seed " << kPromptSeed << " weight seed "
                                    << testing::kWeightSeed << " backend " << backend_name());
  FeatureModel& fm = feature_model(feature);
  const auto& prompts = prompts_of(feature);
  for (int topk : {1, 4}) {
    for (int steps : {1, 3}) {
      for (int page : {1, 16}) {
        const Case c{feature, mode, topk, steps, page};
        SCOPED_TRACE(case_name(c));
        const auto& plain = plain_outputs(feature, page);
        SpecConfig spec = testing::spec_config(mode, topk, steps);
        if (mode == SpecMode::kEagle) spec.eagle_head = &fm.head;
        EngineStats st;
        const auto outs = run_batch(feature, page, spec, &st);
        for (size_t i = 0; i < outs.size(); ++i) {
          expect_same(fm, prompts[i], outs[i], plain[i],
                      case_name(c) + " request " + std::to_string(i));
        }
        EXPECT_GT(st.spec_steps, 0);
        testing::report_spec_case(case_name(c), st, mode, topk);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, SpecFeatures, ::testing::ValuesIn(all_rows()),
                         [](const auto& info) { return row_name(info.param); });

// The window matters here: some prompt is longer than the window (every prompt + output is), and
// the naive model's greedy output changes when the window is dropped (so a backend ignoring it
// would fail the plain-vs-naive check above).
TEST(SpecFeatures, WindowChangesTheOutput) {
  FeatureModel& fm = feature_model(Feature::kWindow);
  model::ModelConfig full = fm.config;
  full.layer_window.clear();
  const auto& prompts = prompts_of(Feature::kWindow);
  int changed = 0, longer = 0;
  for (const auto& p : prompts) {
    longer += static_cast<int>(p.size()) > kWindow + 1;
    const auto windowed = fm.naive(p, kMaxNew).tokens;
    const auto unwindowed = testing::NaiveLlama::generate(full, fm.weights, p, kMaxNew, false).tokens;
    changed += windowed != unwindowed;
  }
  EXPECT_GT(longer, 0) << "every prompt fits in the window";
  EXPECT_GT(changed, 0);
}

// A tree deeper than the window is refused, naming the window: a tree row's window must start
// in the cached prefix (the CUDA kernels' rule; docs/design/spec.md §3).
TEST(SpecFeatures, StepsBeyondTheWindowAreRefused) {
  model::ModelConfig c = feature_config(Feature::kWindow);
  c.layer_window.assign(static_cast<size_t>(c.num_layers), 2);
  const model::ModelWeights w = model::make_random_weights(c, testing::kWeightSeed);
  model::LlamaModel m(c, w);
  for (SpecMode mode : {SpecMode::kNgram, SpecMode::kDraft}) {
    try {
      Engine engine(m, EngineConfig{.page_size = 16,
                                    .pool_tokens = 1024,
                                    .backend = testing::backend_named(backend_name()),
                                    .spec = testing::spec_config(mode, 2, 3)});
      ADD_FAILURE() << spec_mode_name(mode) << ": steps 3 over a window of 2 were accepted";
    } catch (const pagoda::Error& e) {
      EXPECT_EQ(e.code(), pagoda::ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("sliding window 2"), std::string::npos) << e.what();
    }
  }
  // Steps equal to the window are fine.
  Engine ok(m, EngineConfig{.page_size = 16,
                            .pool_tokens = 1024,
                            .backend = testing::backend_named(backend_name()),
                            .spec = testing::spec_config(SpecMode::kDraft, 2, 2)});
  const RequestId id = ok.add_request({.prompt = {1, 2, 3, 4, 5, 6, 7, 8}, .max_new_tokens = 6});
  ok.run_until_idle();
  EXPECT_EQ(ok.output(id).output_ids.size(), 6u);
}

}  // namespace
}  // namespace pagoda::engine
