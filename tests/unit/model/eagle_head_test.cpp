// EagleHead / EagleRunner: the head's forward against an independent naive f64 implementation
// (plain loops, written from the EAGLE-1 / EAGLE-3 definitions) on random weights, an extend then
// a tree step with a verify mask; and the loader's named errors (shapes, unknown tensors,
// unknown config fields, target mismatches).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/kv/page_allocator.h"
#include "pagoda/model/eagle_runner.h"
#include "pagoda/model/safetensors.h"
#include "pagoda/platform/platform.h"
#include "naive_llama.h"
#include "pagoda/model/llama_worker.h"
#include "pagoda/model/step_input.h"
#include "test_model.h"

namespace pagoda::model {
namespace {

namespace fs = std::filesystem;
using attention::ForwardMode;
using Vec = std::vector<double>;

Vec rmsnorm(const Vec& x, const std::vector<float>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  Vec out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] * inv * w[i];
  return out;
}

/// y = W x for W [out, in] row-major (f32 weights, f64 math).
Vec matvec(const std::vector<float>& w, const Vec& x, size_t out) {
  Vec y(out, 0.0);
  for (size_t o = 0; o < out; ++o)
    for (size_t i = 0; i < x.size(); ++i) y[o] += static_cast<double>(w[o * x.size() + i]) * x[i];
  return y;
}

/// One head entry: what it is fed and where it sits.
struct Entry {
  int32_t token;
  Vec feature;  ///< target features (from_target) or a head hidden state [H]
  bool from_target;
  int32_t pos;
};

/// The naive head: per entry its attention input, q, k, v, then attention over visible entries.
struct NaiveEagle {
  const EagleHead& head;
  struct Out {
    Vec hidden, logits;
  };

  Vec embed(int32_t t) const {
    const auto& e = head.embed();
    const size_t h = static_cast<size_t>(head.config().hidden_size);
    return Vec(e.begin() + t * static_cast<int64_t>(h), e.begin() + (t + 1) * static_cast<int64_t>(h));
  }
  Vec x0(const Entry& en) const {
    const EagleConfig& c = head.config();
    const EagleWeights& w = head.weights();
    const size_t h = static_cast<size_t>(c.hidden_size);
    if (c.layout == EagleLayout::kEagle1) {
      Vec f = en.feature;
      if (en.from_target)
        f = rmsnorm(f, head.target().final_norm_weights(), head.target().config().rms_norm_eps);
      Vec cat = embed(en.token);
      cat.insert(cat.end(), f.begin(), f.end());
      Vec y = matvec(w.fc, cat, h);
      for (size_t i = 0; i < h && !w.fc_bias.empty(); ++i) y[i] += w.fc_bias[i];
      return y;
    }
    return en.from_target ? matvec(w.fc, en.feature, h) : en.feature;
  }
  Vec attn_in(const Entry& en, const Vec& x) const {
    const EagleConfig& c = head.config();
    if (c.layout == EagleLayout::kEagle1) return x;
    Vec a = rmsnorm(embed(en.token), head.weights().input_norm, c.rms_norm_eps);
    const Vec hn = rmsnorm(x, head.weights().hidden_norm, c.rms_norm_eps);
    a.insert(a.end(), hn.begin(), hn.end());
    return a;
  }
  void rope(Vec& v, int heads, int32_t pos) const {
    const int d = head.config().head_dim;
    for (int hh = 0; hh < heads; ++hh)
      for (int i = 0; i < d / 2; ++i) {
        const double inv = std::pow(head.config().rope.theta, -2.0 * i / d);
        const double a = pos * inv, cs = std::cos(a), sn = std::sin(a);
        double& x1 = v[static_cast<size_t>(hh * d + i)];
        double& x2 = v[static_cast<size_t>(hh * d + i + d / 2)];
        const double y1 = x1 * cs - x2 * sn, y2 = x2 * cs + x1 * sn;
        x1 = y1;
        x2 = y2;
      }
  }
  /// Outputs of `queries` (indices into entries); visible[q] lists the entries query q sees.
  std::vector<Out> run(const std::vector<Entry>& entries, const std::vector<size_t>& queries,
                       const std::vector<std::vector<size_t>>& visible) const {
    const EagleConfig& c = head.config();
    const EagleWeights& w = head.weights();
    const size_t h = static_cast<size_t>(c.hidden_size), d = static_cast<size_t>(c.head_dim);
    const int hq = c.num_q_heads, hkv = c.num_kv_heads;
    std::vector<Vec> xs, qs, ks, vs;
    for (const Entry& en : entries) {
      xs.push_back(x0(en));
      const Vec a = attn_in(en, xs.back());
      qs.push_back(matvec(w.q_proj, a, hq * d));
      ks.push_back(matvec(w.k_proj, a, hkv * d));
      vs.push_back(matvec(w.v_proj, a, hkv * d));
      rope(qs.back(), hq, en.pos);
      rope(ks.back(), hkv, en.pos);
    }
    std::vector<Out> outs;
    for (size_t qi = 0; qi < queries.size(); ++qi) {
      const size_t e = queries[qi];
      Vec o(hq * d, 0.0);
      for (int hh = 0; hh < hq; ++hh) {
        const size_t kh = static_cast<size_t>(hh / (hq / hkv));
        std::vector<double> s;
        double mx = -1e300;
        for (size_t j : visible[qi]) {
          double dot = 0;
          for (size_t i = 0; i < d; ++i) dot += qs[e][hh * d + i] * ks[j][kh * d + i];
          s.push_back(dot / std::sqrt(static_cast<double>(d)));
          mx = std::max(mx, s.back());
        }
        double z = 0;
        for (double& x : s) z += (x = std::exp(x - mx));
        for (size_t n = 0; n < visible[qi].size(); ++n)
          for (size_t i = 0; i < d; ++i) o[hh * d + i] += s[n] / z * vs[visible[qi][n]][kh * d + i];
      }
      Vec r = xs[e];
      const Vec ao = matvec(w.o_proj, o, h);
      for (size_t i = 0; i < h; ++i) r[i] += ao[i];
      const Vec h2 = rmsnorm(r, w.post_norm, c.rms_norm_eps);
      const size_t inter = static_cast<size_t>(c.intermediate_size);
      const Vec g = matvec(w.gate_proj, h2, inter), u = matvec(w.up_proj, h2, inter);
      Vec act(inter);
      for (size_t i = 0; i < inter; ++i) act[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      const Vec m = matvec(w.down_proj, act, h);
      for (size_t i = 0; i < h; ++i) r[i] += m[i];
      const Vec z = c.layout == EagleLayout::kEagle3 ? rmsnorm(r, w.norm, c.rms_norm_eps) : r;
      outs.push_back(Out{r, matvec(head.lm_head(), z, static_cast<size_t>(c.draft_vocab_size))});
    }
    return outs;
  }
};

double max_rel_err(std::span<const float> got, const Vec& ref) {
  double scale = 1e-6, err = 0;
  for (double v : ref) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    err = std::max(err, std::abs(got[i] - ref[i]));
  }
  return err / scale;
}

struct Target {
  ModelConfig config = testing::test_model_config();
  ModelWeights weights = make_random_weights(config, 4242);
  LlamaModel model{config, weights};
};
Target& target() {
  static Target t;
  return t;
}

Vec random_vec(std::mt19937_64& rng, size_t n) {
  std::normal_distribution<double> nd(0.0, 1.0);
  Vec v(n);
  for (double& x : v) x = static_cast<float>(nd(rng));  // exactly representable in f32
  return v;
}

class EagleForward : public ::testing::TestWithParam<std::tuple<EagleLayout, int>> {};

TEST_P(EagleForward, MatchesNaiveF64OnExtendAndTreeStep) {
  const auto [layout, page] = GetParam();
  const uint64_t seed = 7 + page + static_cast<int>(layout);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::printf("[eagle] layout %d page %d seed %llu\n", static_cast<int>(layout), page,
              static_cast<unsigned long long>(seed));
  const LlamaModel& tm = target().model;
  const EagleConfig ec = eagle_config_for(tm.config(), layout, layout == EagleLayout::kEagle3 ? 200 : 0);
  const EagleHead head(ec, make_random_eagle_weights(ec, tm.config(), seed), tm);
  auto platform = platform::make_cpu_platform();
  const int32_t num_pages = 64;
  kv::PageAllocator alloc(num_pages, page);
  kv::ReqToTokenTable table(2, 256);
  EagleRunner runner(head, make_cpu_ops(*platform, DType::kF32),
                     {.page_size = page, .num_pages = num_pages, .kv_dtype = DType::kF32,
                      .backend = {.attention = "reference"}},
                     table);
  // Unused K/V is NaN: reading a slot nobody wrote poisons the output.
  for (auto v : {runner.kv_pool().k_view(LayerId{0}), runner.kv_pool().v_view(LayerId{0})})
    std::fill_n(static_cast<float*>(v.data()), v.numel(), NAN);
  std::mt19937_64 rng(seed);
  const int32_t n = 11;  // extend positions [0, n)
  const size_t h = static_cast<size_t>(ec.hidden_size);
  std::vector<Entry> entries;
  EagleInput ext;
  for (int32_t p = 0; p < n; ++p) {
    entries.push_back({static_cast<int32_t>(rng() % ec.vocab_size),
                       random_vec(rng, static_cast<size_t>(head.feature_dim())), true, p});
    ext.input_ids.push_back(entries.back().token);
    ext.features.insert(ext.features.end(), entries.back().feature.begin(),
                        entries.back().feature.end());
  }
  const ReqSlot row = *table.alloc();
  const int32_t zero = 0, none = -1, total = n + 3;
  const auto slots = *alloc.alloc_extend(std::span(&zero, 1), std::span(&total, 1), std::span(&none, 1));
  table.write(row, 0, slots);
  ext.forward.mode = ForwardMode::kExtend;
  ext.forward.batch_size = 1;
  ext.forward.req_pool_indices = {row.value()};
  ext.forward.seq_lens = {n};
  ext.forward.extend_prefix_lens = {0};
  ext.forward.extend_seq_lens = {n};
  for (int32_t p = 0; p < n; ++p) {
    ext.forward.positions.push_back(p);
    ext.forward.out_cache_loc.push_back(slots[static_cast<size_t>(p)]);
  }
  ext.logit_rows = {n - 1, 3};
  const EagleOutput o1 = runner.run(ext);
  std::vector<size_t> q1;
  std::vector<std::vector<size_t>> vis1;
  for (size_t p = 0; p < static_cast<size_t>(n); ++p) {
    q1.push_back(p);
    vis1.emplace_back();
    for (size_t j = 0; j <= p; ++j) vis1.back().push_back(j);
  }
  const auto ref1 = NaiveEagle{head}.run(entries, q1, vis1);
  for (size_t p = 0; p < static_cast<size_t>(n); ++p)
    ASSERT_LT(max_rel_err(std::span(o1.hidden).subspan(p * h, h), ref1[p].hidden), 1e-4) << "row " << p;
  const size_t vd = static_cast<size_t>(ec.draft_vocab_size);
  EXPECT_LT(max_rel_err(std::span(o1.logits).first(vd), ref1[n - 1].logits), 1e-4);
  EXPECT_LT(max_rel_err(std::span(o1.logits).subspan(vd, vd), ref1[3].logits), 1e-4);

  // Tree step over three nodes: a, b (children of the root), c (child of a); fed head hidden
  // states; node of depth d at position n + d − 1, row position n + i − 1.
  const int32_t parents[3] = {-1, -1, 0};  // among the three (−1 = root)
  const int32_t depth[3] = {1, 1, 2};
  EagleInput tree;
  tree.from_target = false;
  auto& f = tree.forward;
  f.mode = ForwardMode::kTargetVerify;
  f.batch_size = 1;
  f.req_pool_indices = {row.value()};
  f.seq_lens = {n};
  f.extend_prefix_lens = {n};
  f.extend_seq_lens = {3};
  f.spec.num_draft_tokens = 3;
  std::vector<size_t> q2;
  std::vector<std::vector<size_t>> vis2;
  for (int i = 0; i < 3; ++i) {
    entries.push_back({static_cast<int32_t>(rng() % ec.vocab_size), random_vec(rng, h), false,
                       n + depth[i] - 1});
    tree.input_ids.push_back(entries.back().token);
    tree.features.insert(tree.features.end(), entries.back().feature.begin(),
                         entries.back().feature.end());
    f.positions.push_back(n + depth[i] - 1);
    f.out_cache_loc.push_back(slots[static_cast<size_t>(n + i)]);
    q2.push_back(static_cast<size_t>(n + i));
    vis2.emplace_back();
    for (size_t j = 0; j < static_cast<size_t>(n); ++j) vis2.back().push_back(j);
    for (int j = 0; j < n; ++j) f.spec.tree_mask.push_back(1);
    uint8_t cols[3] = {0, 0, 0};
    for (int a = i; a >= 0; a = parents[a]) cols[a] = 1;
    for (int j = 0; j < 3; ++j) {
      f.spec.tree_mask.push_back(cols[j]);
      if (cols[j]) vis2.back().push_back(static_cast<size_t>(n + j));
    }
  }
  tree.logit_rows = {1, 2};
  const EagleOutput o2 = runner.run(tree);
  const auto ref2 = NaiveEagle{head}.run(entries, q2, vis2);
  for (size_t i = 0; i < 3; ++i)
    ASSERT_LT(max_rel_err(std::span(o2.hidden).subspan(i * h, h), ref2[i].hidden), 1e-4) << "node " << i;
  EXPECT_LT(max_rel_err(std::span(o2.logits).first(vd), ref2[1].logits), 1e-4);
  EXPECT_LT(max_rel_err(std::span(o2.logits).subspan(vd, vd), ref2[2].logits), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Layouts, EagleForward,
                         ::testing::Combine(::testing::Values(EagleLayout::kEagle1,
                                                              EagleLayout::kEagle3),
                                            ::testing::Values(1, 16)));

TEST(EagleFeatures, WorkerReturnsRequestedLayerOutputs) {
  const Target& tg = target();
  const uint64_t seed = 99;
  std::printf("[eagle] worker hidden states, seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::vector<int32_t> tokens(13);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % tg.config.vocab_size);
  testing::NaiveLlama naive(tg.config, tg.weights);
  std::vector<std::vector<std::vector<double>>> ref;  // [token][layer]
  for (int32_t t : tokens) {
    naive.feed(t);
    ref.push_back({naive.layer_output(0), naive.layer_output(1)});
  }
  auto platform = platform::make_cpu_platform();
  kv::PageAllocator alloc(32, 16);
  kv::ReqToTokenTable table(2, 256);
  LlamaWorker worker(tg.model, make_cpu_ops(*platform, DType::kF32),
                     {.page_size = 16, .num_pages = 32, .kv_dtype = DType::kF32,
                      .backend = {.attention = "reference"}},
                     table);
  const ReqSlot row = *table.alloc();
  const int32_t zero = 0, none = -1, n = static_cast<int32_t>(tokens.size());
  const auto slots = *alloc.alloc_extend(std::span(&zero, 1), std::span(&n, 1), std::span(&none, 1));
  table.write(row, 0, slots);
  StepInput in{.mode = ForwardMode::kExtend,
               .seqs = {{.req_slot = row.value(), .prefix_len = 0, .tokens = tokens}},
               .out_cache_loc = slots};
  WorkerBatch b;
  b.forward = build_forward_batch(in);
  b.input_ids = tokens;
  b.logit_rows = {1};
  b.sampling = {SamplingParams{}};
  b.sample_step = {0};
  EXPECT_TRUE(worker.run(b).hidden.empty());  // not asked: nothing
  b.hidden_layers = {1, 0};  // order as asked
  const WorkerOutput o = worker.run(b);
  const size_t h = static_cast<size_t>(tg.config.hidden_size);
  ASSERT_EQ(o.hidden.size(), tokens.size() * 2 * h);
  for (size_t t = 0; t < tokens.size(); ++t) {
    EXPECT_LT(max_rel_err(std::span(o.hidden).subspan((2 * t) * h, h), ref[t][1]), 1e-4) << t;
    EXPECT_LT(max_rel_err(std::span(o.hidden).subspan((2 * t + 1) * h, h), ref[t][0]), 1e-4) << t;
  }
  b.hidden_layers = {2};
  EXPECT_THROW(worker.run(b), Error);
}

// ---- loader ----

fs::path temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("pagoda_eagle_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p;
}

/// Rewrites dir/model.safetensors after `edit` changed its tensors (name → shape, values).
using Tensors = std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>;
void rewrite(const fs::path& dir, const std::function<void(Tensors&)>& edit) {
  Tensors t;
  std::map<std::string, DType> dt;
  {
    SafetensorsFile f(dir / "model.safetensors");
    for (const auto& [name, info] : f.tensors()) {
      dt[name] = info.dtype;
      if (dtype_is_float(info.dtype)) {
        t[name] = {info.shape, f.read_f32(name)};
      } else {
        const auto v = f.read_i64(name);
        t[name] = {info.shape, std::vector<float>(v.begin(), v.end())};
      }
    }
  }
  edit(t);
  std::vector<SafetensorToWrite> w;
  for (const auto& [name, sv] : t)
    w.push_back({name, sv.first, sv.second.data(), dt.count(name) ? dt[name] : DType::kF32});
  write_safetensors(dir / "model.safetensors", w);
}

void expect_error(const fs::path& dir, const std::string& needle) {
  try {
    load_eagle_head(dir, target().model);
    ADD_FAILURE() << "no error, expected one naming " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(EagleLoader, RoundTripsBothLayouts) {
  for (EagleLayout layout : {EagleLayout::kEagle1, EagleLayout::kEagle3}) {
    const EagleConfig ec = eagle_config_for(target().config, layout, layout == EagleLayout::kEagle3 ? 100 : 0);
    const EagleWeights w = make_random_eagle_weights(ec, target().config, 3);
    const fs::path dir = temp_dir(layout == EagleLayout::kEagle3 ? "rt3" : "rt1");
    save_eagle_head(dir, ec, w);
    const auto head = load_eagle_head(dir, target().model);
    EXPECT_EQ(head->config().layout, layout);
    EXPECT_EQ(head->weights().fc, w.fc);
    EXPECT_EQ(head->weights().q_proj, w.q_proj);
    EXPECT_EQ(head->weights().d2t, w.d2t);
    EXPECT_EQ(head->config().fc_bias, layout == EagleLayout::kEagle1);
    EXPECT_EQ(head->feature_dim(), (layout == EagleLayout::kEagle3 ? 3 : 1) * target().config.hidden_size);
    // Embedding shared from the target (the checkpoint has none); EAGLE-1's lm_head too.
    EXPECT_EQ(&head->embed(), &target().model.embed_weights());
    if (layout == EagleLayout::kEagle1) {
      EXPECT_EQ(&head->lm_head(), &target().model.lm_head_weights());
    }
    for (size_t d = 0; d < w.d2t.size(); ++d)
      EXPECT_EQ(head->to_target(static_cast<int32_t>(d)), static_cast<int64_t>(d) + w.d2t[d]);
    fs::remove_all(dir);
  }
}

TEST(EagleLoader, NamesTheBadTensorOrField) {
  const EagleConfig ec = eagle_config_for(target().config, EagleLayout::kEagle3, 100);
  const EagleWeights w = make_random_eagle_weights(ec, target().config, 5);
  const fs::path dir = temp_dir("bad");
  auto fresh = [&] {
    fs::remove_all(dir);
    save_eagle_head(dir, ec, w);
  };
  fresh();
  rewrite(dir, [](Tensors& t) {
    auto& q = t["midlayer.self_attn.q_proj.weight"];
    q.first[1] -= 1;
    q.second.resize(static_cast<size_t>(q.first[0] * q.first[1]));
  });
  expect_error(dir, "midlayer.self_attn.q_proj.weight");
  fresh();
  rewrite(dir, [](Tensors& t) { t["midlayer.self_attn.q_norm.weight"] = {{128}, std::vector<float>(128, 1.f)}; });
  expect_error(dir, "midlayer.self_attn.q_norm.weight");
  fresh();
  rewrite(dir, [](Tensors& t) { t.erase("norm.weight"); });
  expect_error(dir, "norm.weight");
  fresh();
  rewrite(dir, [](Tensors& t) { t["d2t"].second[7] = 1e6f; });
  expect_error(dir, "d2t");
  auto edit_config = [&](const std::function<void(nlohmann::json&)>& f) {
    fresh();
    nlohmann::json j = nlohmann::json::parse(std::ifstream(dir / "config.json"));
    f(j);
    std::ofstream(dir / "config.json") << j.dump();
  };
  edit_config([](nlohmann::json& j) { j["eagle_fancy_mode"] = true; });
  expect_error(dir, "eagle_fancy_mode");
  edit_config([](nlohmann::json& j) { j["num_hidden_layers"] = 2; });
  expect_error(dir, "num_hidden_layers");
  edit_config([](nlohmann::json& j) { j["hidden_size"] = 64; });
  expect_error(dir, "hidden_size");
  edit_config([](nlohmann::json& j) { j["eagle_config"] = {{"eagle_aux_hidden_state_layer_ids", {0, 1, 9}}}; });
  expect_error(dir, "layer 9");
  edit_config([](nlohmann::json& j) { j["architectures"] = {"MedusaModel"}; });
  expect_error(dir, "MedusaModel");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pagoda::model
