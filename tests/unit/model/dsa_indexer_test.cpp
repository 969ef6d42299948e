// DeepSeek sparse attention's indexer (model/dsa_indexer.h) against an oracle written from the
// math in f64: index keys (LayerNorm, half-split RoPE, fp8 e4m3 with a power-of-two scale), the
// scores Σ_h w_h·ReLU(q_h·k) and the top-k sets, over a paged pool whose pages are shuffled, at
// page sizes 1 / 16 / 64, for a prefill step and a decode step of two requests; exact ties (all
// scores 0) go to the lower positions; and the checker catches a top-k missing one token.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "pagoda/backends/reference/reference_backend.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/model/dsa_indexer.h"
#include "pagoda/platform/platform.h"
#include "test_seed.h"

namespace pagoda::model {
namespace {

constexpr int kHidden = 32, kQr = 24, kHeads = 3, kDim = 16, kRope = 8, kTopk = 5;

ModelConfig dsa_test_config() {
  ModelConfig c;
  c.family = ModelFamily::kDeepseekV32;
  c.hidden_size = kHidden;
  c.mla = MlaConfig{.q_lora_rank = kQr, .kv_lora_rank = 16, .qk_nope_head_dim = 8,
                    .qk_rope_head_dim = kRope, .v_head_dim = 8};
  c.dsa = DsaConfig{.index_n_heads = kHeads, .index_head_dim = kDim, .index_topk = kTopk};
  return c;
}

/// x rounded to fp8 e4m3fn (ties to even), |x| <= 448.
double oracle_e4m3(double x) {
  if (x == 0) return 0;
  int e = 0;
  std::frexp(std::fabs(x), &e);  // |x| in [2^(e-1), 2^e)
  const double quantum = std::ldexp(1.0, std::max(e - 1, -6) - 3);
  return std::copysign(std::min(std::nearbyint(std::fabs(x) / quantum) * quantum, 448.0), x);
}

struct Oracle {
  std::vector<float> wq_b, wk, k_norm, k_bias, w_proj, inv_freq;
  std::vector<double> rope(std::vector<double> v, int pos, int groups) const {
    for (int g = 0; g < groups; ++g)
      for (int i = 0; i < kRope / 2; ++i) {
        const double ang = static_cast<float>(pos) * inv_freq[i];
        double& a = v[g * kDim + i];
        double& b = v[g * kDim + i + kRope / 2];
        const double a0 = a, b0 = b;
        a = a0 * std::cos(ang) - b0 * std::sin(ang);
        b = b0 * std::cos(ang) + a0 * std::sin(ang);
      }
    return v;
  }
  /// The key of a token before quantisation.
  std::vector<double> key(const float* h, int pos) const {
    std::vector<double> k(kDim, 0.0);
    for (int j = 0; j < kDim; ++j)
      for (int c = 0; c < kHidden; ++c) k[j] += double(wk[j * kHidden + c]) * h[c];
    const double mean = std::accumulate(k.begin(), k.end(), 0.0) / kDim;
    double var = 0;
    for (double x : k) var += (x - mean) * (x - mean);
    for (int j = 0; j < kDim; ++j)
      k[j] = (k[j] - mean) / std::sqrt(var / kDim + 1e-6) * k_norm[j] + k_bias[j];
    return rope(k, pos, 1);
  }
  /// One row's queries [kHeads, kDim] (RoPE applied) and head weights [kHeads] (scaled).
  std::pair<std::vector<double>, std::vector<double>> query(const float* h, const float* qa,
                                                            int pos) const {
    std::vector<double> q(kHeads * kDim, 0.0), w(kHeads, 0.0);
    for (int o = 0; o < kHeads * kDim; ++o)
      for (int c = 0; c < kQr; ++c) q[o] += double(wq_b[o * kQr + c]) * qa[c];
    q = rope(q, pos, kHeads);
    for (int hh = 0; hh < kHeads; ++hh) {
      for (int c = 0; c < kHidden; ++c) w[hh] += double(w_proj[hh * kHidden + c]) * h[c];
      w[hh] /= std::sqrt(double(kHeads * kDim));
    }
    return {q, w};
  }
  /// score(p) of one query row (the queries and weights the indexer was handed, f32) against
  /// stored keys keys[p]; each query head rounded to the e4m3 grid with its power-of-two scale.
  static std::vector<double> scores(const float* q, const float* w,
                                    const std::vector<std::vector<double>>& keys) {
    std::vector<double> qq(kHeads * kDim);
    for (int hh = 0; hh < kHeads; ++hh) {
      double amax = 0;
      for (int j = 0; j < kDim; ++j) amax = std::max(amax, std::fabs(double(q[hh * kDim + j])));
      const double scale = amax > 0 ? std::exp2(std::ceil(std::log2(amax / 448))) : 1.0;
      for (int j = 0; j < kDim; ++j)
        qq[hh * kDim + j] = oracle_e4m3(q[hh * kDim + j] / scale) * scale;
    }
    std::vector<double> s;
    for (const auto& k : keys) {
      double total = 0;
      for (int hh = 0; hh < kHeads; ++hh) {
        double dot = 0;
        for (int j = 0; j < kDim; ++j) dot += qq[hh * kDim + j] * k[j];
        total += double(w[hh]) * std::max(dot, 0.0);
      }
      s.push_back(total);
    }
    return s;
  }
};

/// "" when `sel` (k entries, -1 = unused) is a top-k of `score` (ties within tol to either side),
/// else what is wrong.
std::string check_topk(std::span<const int32_t> sel, const std::vector<double>& score) {
  const int visible = static_cast<int>(score.size());
  std::set<int32_t> chosen;
  for (int32_t p : sel) {
    if (p < 0) continue;
    if (p >= visible || !chosen.insert(p).second) return "position " + std::to_string(p) + " bad";
  }
  if (static_cast<int>(chosen.size()) != std::min(visible, kTopk))
    return std::to_string(chosen.size()) + " selected of " + std::to_string(visible);
  double hi = 0;
  for (double s : score) hi = std::max(hi, std::fabs(s));
  for (int32_t s : chosen)
    for (int u = 0; u < visible; ++u)
      if (!chosen.count(u) && score[u] > score[s] + 1e-5 * hi)
        return "kept " + std::to_string(s) + " over better " + std::to_string(u);
  return "";
}

/// The reference backend, keeping the last selection the indexer applied (apply_index_topk's
/// default hands it to set_sparse_topk).
struct RecordingBackend : backends::ReferenceBackend {
  using ReferenceBackend::ReferenceBackend;
  void select_index_topk(LayerId layer, const attention::IndexerQuery& q, int k,
                         std::span<int32_t> topk, std::span<float> scores) override {
    const size_t rows = topk.size() / static_cast<size_t>(k);
    queries.assign(q.q, q.q + rows * static_cast<size_t>(q.heads * q.dim));
    weights.assign(q.w, q.w + rows * static_cast<size_t>(q.heads));
    ReferenceBackend::select_index_topk(layer, q, k, topk, scores);
  }
  void set_sparse_topk(std::span<const int32_t> topk, int k) override {
    selection.assign(topk.begin(), topk.end());
    ReferenceBackend::set_sparse_topk(topk, k);
  }
  std::vector<int32_t> selection;
  std::vector<float> queries, weights;  ///< what the indexer was handed (host ops: f32)
};

std::vector<float> normal(std::mt19937_64& rng, size_t n, double sd) {
  std::normal_distribution<double> d(0.0, sd);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(d(rng));
  return v;
}

TEST(DsaIndexer, KeysScoresAndTopkMatchTheOracleOnShuffledPages) {
  const testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  const ModelConfig c = dsa_test_config();
  auto platform = platform::make_cpu_platform();
  auto ops = make_cpu_ops(*platform, DType::kF32);
  for (const bool ties : {false, true}) {
    Oracle o{.wq_b = normal(rng, kHeads * kDim * kQr, 1 / std::sqrt(double(kQr))),
             .wk = normal(rng, kDim * kHidden, 1 / std::sqrt(double(kHidden))),
             .k_norm = normal(rng, kDim, 0.1),
             .k_bias = normal(rng, kDim, 0.1),
             .w_proj = ties ? std::vector<float>(kHeads * kHidden, 0.f)
                            : normal(rng, kHeads * kHidden, 1 / std::sqrt(double(kHidden))),
             .inv_freq = {}};
    for (float& x : o.k_norm) x += 1.f;
    for (int i = 0; i < kRope / 2; ++i)
      o.inv_freq.push_back(static_cast<float>(std::pow(10000.0, -2.0 * i / kRope)));
    const DsaLayerWeights dw{.wq_b = o.wq_b.data(), .wk = o.wk.data(), .k_norm = o.k_norm.data(),
                             .k_norm_bias = o.k_bias.data(), .weights_proj = o.w_proj.data(),
                             .inv_freq = o.inv_freq.data(), .rope_factor = 1.f};
    for (const int page : {1, 16, 64}) {
      SCOPED_TRACE(::testing::Message() << "page " << page << (ties ? " all ties" : ""));
      const int pages = 256 / page + 2;
      kv::KvPool pool({.layout = kv::KvLayout::kMla, .num_layers = 1, .num_pages = pages,
                       .page_size = page, .dtype = DType::kF32, .kv_lora_rank = 16,
                       .rope_dim = kRope, .index_head_dim = kDim},
                      platform->allocator());
      kv::ReqToTokenTable table(4, 128);
      RecordingBackend backend(
          {.platform = platform.get(), .kv_pool = &pool, .req_to_token = &table});
      // Two requests on shuffled pages: 40 and 11 tokens of prefill, then one decode each.
      std::vector<int32_t> page_ids(static_cast<size_t>(pages));
      std::iota(page_ids.begin(), page_ids.end(), 1);
      std::shuffle(page_ids.begin(), page_ids.end(), rng);
      const int lens[2] = {40, 11};
      std::vector<ReqSlot> rows;
      std::vector<std::vector<SlotIndex>> slots(2);
      for (int b = 0, next = 0; b < 2; ++b) {
        rows.push_back(*table.alloc());
        for (int p = 0; p <= lens[b]; ++p, ++next)
          slots[b].push_back(page_ids[next / page] * page + next % page);
        if (page > 1) next = (next / page + 1) * page;  // each request starts a page
        table.write(rows[b], 0, slots[b]);
      }
      const int total = lens[0] + lens[1] + 2;
      const std::vector<float> h = normal(rng, total * kHidden, 1.0);
      const std::vector<float> qa = normal(rng, total * kQr, 1.0);
      auto token = [&](int b, int p) { return b == 0 ? p : lens[0] + 1 + p; };  // row in h
      std::vector<std::vector<std::vector<double>>> stored(2);  // per request, as stored
      DsaIndexer indexer(c, *ops);
      for (const bool decode : {false, true}) {
        attention::ForwardBatch f;
        f.mode = decode ? attention::ForwardMode::kDecode : attention::ForwardMode::kExtend;
        f.batch_size = 2;
        std::vector<float> hs, qas;
        for (int b = 0; b < 2; ++b) {
          f.req_pool_indices.push_back(rows[b].value());
          f.seq_lens.push_back(decode ? lens[b] + 1 : lens[b]);
          if (!decode) {
            f.extend_prefix_lens.push_back(0);
            f.extend_seq_lens.push_back(lens[b]);
          }
          for (int p = decode ? lens[b] : 0; p < (decode ? lens[b] + 1 : lens[b]); ++p) {
            f.positions.push_back(p);
            f.out_cache_loc.push_back(slots[b][p]);
            const int t = token(b, p);
            hs.insert(hs.end(), h.begin() + t * kHidden, h.begin() + (t + 1) * kHidden);
            qas.insert(qas.end(), qa.begin() + t * kQr, qa.begin() + (t + 1) * kQr);
          }
        }
        backend.init_forward_metadata(f);
        backend.selection.clear();
        backend.queries.clear();
        std::vector<float> scratch(static_cast<size_t>(indexer.scratch_floats(f.num_tokens())));
        indexer.run(LayerId{0}, dw, hs.data(), qas.data(), f.positions.data(),
                    f.out_cache_loc.data(), f, pool, backend, scratch.data());
        // The stored keys: the oracle's key, quantised with its scale (one quantum of slack
        // where f32 and f64 round to different sides of a midpoint).
        for (int r = 0; r < f.num_tokens(); ++r) {
          const int b = decode ? r : (r < lens[0] ? 0 : 1);
          const int p = f.positions[r];
          const std::vector<double> want = o.key(hs.data() + r * kHidden, p);
          double amax = 0;
          for (double x : want) amax = std::max(amax, std::fabs(x));
          const double scale = std::exp2(std::ceil(std::log2(amax / 448)));
          std::vector<double> got(kDim);
          for (int j = 0; j < kDim; ++j) {
            got[j] = pool.index_key_at(LayerId{0}, f.out_cache_loc[r], j);
            const double q = oracle_e4m3(want[j] / scale) * scale;
            // One e4m3 quantum: 1/8 of a normal value, 2^-9 (times the scale) among the
            // subnormals, where a midpoint may round apart in f32 and f64 with |q| / 8 < 2^-9.
            const double slack = std::max(std::fabs(q) / 8, std::exp2(-9) * scale);
            ASSERT_LE(std::fabs(got[j] - q), slack + 1e-12)
                << "row " << r << " dim " << j << ": stored " << got[j] << ", oracle " << q;
          }
          stored[b].push_back(got);
        }
        const std::span<const int32_t> sel = backend.selection;
        ASSERT_EQ(sel.size(), static_cast<size_t>(f.num_tokens() * kTopk));
        for (int r = 0; r < f.num_tokens(); ++r) {
          const int b = decode ? r : (r < lens[0] ? 0 : 1);
          const int p = f.positions[r];
          const std::vector<std::vector<double>> seen(stored[b].begin(),
                                                      stored[b].begin() + p + 1);
          // The queries and weights the model computed (f32) against the oracle's (f64); the
          // scores then from the model's, so both round the same values to the fp8 grid.
          const auto [oq, ow] = o.query(hs.data() + r * kHidden, qas.data() + r * kQr, p);
          const float* mq = backend.queries.data() + size_t(r) * kHeads * kDim;
          const float* mw = backend.weights.data() + size_t(r) * kHeads;
          for (int e = 0; e < kHeads * kDim; ++e)
            ASSERT_NEAR(mq[e], oq[size_t(e)], 1e-5 * (1 + std::fabs(oq[size_t(e)])))
                << "row " << r << " query element " << e;
          for (int hh = 0; hh < kHeads; ++hh)
            ASSERT_NEAR(mw[hh], ow[size_t(hh)], 1e-6 * (1 + std::fabs(ow[size_t(hh)])))
                << "row " << r << " head weight " << hh;
          const auto score = Oracle::scores(mq, mw, seen);
          const auto row = sel.subspan(static_cast<size_t>(r) * kTopk, kTopk);
          EXPECT_EQ(check_topk(row, score), "") << "row " << r << " (position " << p << ")";
          if (ties) {  // every score is 0: the lowest positions, in order
            for (int j = 0; j < kTopk; ++j)
              EXPECT_EQ(row[j], j < p + 1 ? j : -1) << "row " << r << " entry " << j;
          }
          if (!ties && r == 0 && decode) {  // the mutant: one selected token dropped
            std::vector<int32_t> dropped(row.begin(), row.end());
            dropped[2] = -1;
            EXPECT_NE(check_topk(dropped, score), "") << "a top-k missing a token passed";
          }
        }
      }
    }
  }
}

// A slot outside the pool (an engine bug) is refused by name before anything is written: the
// model ops store the keys without checking (DsaIndexer checks for them).
TEST(DsaIndexer, RefusesSlotsOutsideThePool) {
  const ModelConfig c = dsa_test_config();
  auto platform = platform::make_cpu_platform();
  auto ops = make_cpu_ops(*platform, DType::kF32);
  kv::KvPool pool({.layout = kv::KvLayout::kMla,
                   .num_layers = 1,
                   .num_pages = 2,
                   .page_size = 4,
                   .dtype = DType::kF32,
                   .kv_lora_rank = 16,
                   .rope_dim = kRope,
                   .index_head_dim = kDim},
                  platform->allocator());
  pool.fill_bytes(0x5A);
  kv::ReqToTokenTable table(1, 16);
  backends::ReferenceBackend backend(
      {.platform = platform.get(), .kv_pool = &pool, .req_to_token = &table});
  std::vector<float> w(static_cast<size_t>(kHeads * kDim * kQr), 0.1f), bias(kDim, 0.f),
      norm(kDim, 1.f), inv(kRope / 2, 0.5f);
  const DsaLayerWeights dw{.wq_b = w.data(),
                           .wk = w.data(),
                           .k_norm = norm.data(),
                           .k_norm_bias = bias.data(),
                           .weights_proj = w.data(),
                           .inv_freq = inv.data(),
                           .rope_factor = 1.f};
  attention::ForwardBatch f;
  f.mode = attention::ForwardMode::kExtend;
  f.batch_size = 1;
  f.req_pool_indices = {table.alloc()->value()};
  f.seq_lens = {2};
  f.extend_prefix_lens = {0};
  f.extend_seq_lens = {2};
  f.positions = {0, 1};
  f.out_cache_loc = {5, static_cast<int32_t>(pool.num_slots())};  // the second one past the end
  const std::vector<float> h(2 * kHidden, 1.f), qa(2 * kQr, 1.f);
  DsaIndexer indexer(c, *ops);
  try {
    std::vector<float> scratch(static_cast<size_t>(indexer.scratch_floats(f.num_tokens())));
    indexer.run(LayerId{0}, dw, h.data(), qa.data(), f.positions.data(), f.out_cache_loc.data(), f,
                pool, backend, scratch.data());
    ADD_FAILURE() << "a slot past the pool was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange) << e.what();
  }
  const uint8_t* rows = pool.index_rows(LayerId{0});
  const auto bytes = static_cast<size_t>(pool.num_slots() * pool.index_row_bytes());
  EXPECT_TRUE(std::all_of(rows, rows + bytes, [](uint8_t b) { return b == 0x5A; }))
      << "index rows were written before the refusal";
}

}  // namespace
}  // namespace pagoda::model
