// Ragged attention through the host backends (AttentionBackend::save_kv / gather_kv /
// forward_ragged, attention/paged_plan.h build_ragged_plan): on a mixed step (a prefill without
// prefix, an extend over a prefix, a decode row) on shuffled pages of size 1 and 16, MHA and MLA
// pools, for the reference and cpu backends:
//  - save_kv leaves the new rows at out_cache_loc and touches no other slot;
//  - gather_kv returns every row the requests see, prefix and new, in position order (outputs
//    NaN-poisoned first);
//  - forward_ragged over caller K/V (GQA, Dqk != Dv, strided rows) equals an f64 attention
//    written from the math (bottom-right causal per request; with a window and a soft cap too),
//    and a key dropped from the oracle is seen;
//  - misuse is an error naming it (decode steps, row counts, MLA layers, dtypes, no plan);
//  - key windows (a long prefix attended in parts) merge by LSE to the full attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "pagoda/attention/paged_plan.h"
#include "pagoda/backends/cpu/cpu_backend.h"
#include "pagoda/backends/reference/reference_backend.h"
#include "pagoda/core/error.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/platform/platform.h"
#include "test_seed.h"

namespace pagoda::backends::ragged_test {
namespace {

using attention::ForwardBatch;
using attention::ForwardMode;

constexpr int kHq = 4, kHkv = 2, kDqk = 24, kDv = 16, kPitch = 30;  // the ragged K/V
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Step {
  ForwardBatch batch;
  std::vector<std::vector<SlotIndex>> slots;  ///< per request, position -> slot
};

/// Three requests (prefix, new): (0, 19), (29, 6), (40, 1) on shuffled pages of `page`.
Step make_step(kv::ReqToTokenTable& table, int page, int pages, std::mt19937& rng) {
  std::vector<int32_t> page_ids(static_cast<size_t>(pages));
  std::iota(page_ids.begin(), page_ids.end(), 1);
  std::shuffle(page_ids.begin(), page_ids.end(), rng);
  const int prefix[3] = {0, 29, 40}, news[3] = {19, 6, 1};
  Step s;
  s.batch = ForwardBatch{.mode = ForwardMode::kMixed, .batch_size = 3};
  for (int b = 0, next = 0; b < 3; ++b) {
    const ReqSlot row = *table.alloc();
    const int len = prefix[b] + news[b];
    s.slots.emplace_back();
    for (int p = 0; p < len; ++p, ++next)
      s.slots[b].push_back(page_ids[static_cast<size_t>(next / page)] * page + next % page);
    next = (next + page - 1) / page * page;
    table.write(row, 0, s.slots[b]);
    s.batch.req_pool_indices.push_back(row.value());
    s.batch.seq_lens.push_back(len);
    s.batch.extend_prefix_lens.push_back(prefix[b]);
    s.batch.extend_seq_lens.push_back(news[b]);
    for (int p = prefix[b]; p < len; ++p) {
      s.batch.positions.push_back(p);
      s.batch.out_cache_loc.push_back(s.slots[b][p]);
    }
  }
  return s;
}

std::vector<float> randn(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

/// f64 attention of q [t, Hq, Dqk] over k, v (rows kPitch floats apart per head, heads kHkv)
/// for `batch`'s requests, keys [o_b, o_b + seq_len) of request b; query i of request b sees key
/// j iff j <= prefix + i (and j >= prefix + i - window when window >= 0); `skip` (request, key)
/// is left out (the mutant).
std::vector<double> oracle(const ForwardBatch& batch, const std::vector<float>& q,
                           const std::vector<float>& k, const std::vector<float>& v, float scale,
                           int window, float cap, std::pair<int, int> skip = {-1, -1}) {
  std::vector<double> out;
  int64_t row = 0, key0 = 0;
  for (int b = 0; b < batch.batch_size; ++b) {
    const int prefix = batch.extend_prefix_lens[b];
    for (int i = 0; i < batch.extend_seq_lens[b]; ++i, ++row) {
      for (int h = 0; h < kHq; ++h) {
        const int g = h / (kHq / kHkv);
        const float* qr = &q[static_cast<size_t>((row * kHq + h) * kDqk)];
        std::vector<double> s;
        std::vector<int> keys;
        for (int j = 0; j <= prefix + i; ++j) {
          if (window >= 0 && j < prefix + i - window) continue;
          if (b == skip.first && j == skip.second) continue;
          const float* kr = &k[static_cast<size_t>(((key0 + j) * kHkv + g) * kPitch)];
          double dot = 0;
          for (int d = 0; d < kDqk; ++d) dot += double(qr[d]) * kr[d];
          double x = scale * dot;
          if (cap > 0) x = cap * std::tanh(x / cap);
          s.push_back(x);
          keys.push_back(j);
        }
        const double mx = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (int d = 0; d < kDv; ++d) {
          double acc = 0;
          for (size_t n = 0; n < keys.size(); ++n)
            acc += s[n] * v[static_cast<size_t>(((key0 + keys[n]) * kHkv + g) * kPitch + d)];
          out.push_back(acc / sum);
        }
      }
    }
    key0 += batch.seq_lens[b];
  }
  return out;
}

double max_diff(const std::vector<float>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    worst = std::max(worst, std::isnan(got[i]) ? 1e30 : std::fabs(got[i] - want[i]));
  return worst;
}

template <typename F>
void expect_error(ErrorCode code, const std::string& needle, F&& f) {
  try {
    f();
    ADD_FAILURE() << "no error (wanted one naming '" << needle << "')";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

std::unique_ptr<attention::AttentionBackend> make(bool cpu, const attention::BackendContext& c) {
  if (cpu) return std::make_unique<CpuBackend>(c);
  return std::make_unique<ReferenceBackend>(c);
}

TEST(RaggedAttention, HostBackendsSaveGatherAndAttendAsTheMath) {
  const pagoda::testing::TestSeed seed;
  std::mt19937 rng(seed);
  auto platform = platform::make_cpu_platform();
  for (const int page : {1, 16}) {
    for (const bool mla : {false, true}) {
      for (const bool cpu : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << (cpu ? "cpu" : "reference") << " page " << page << (mla ? " MLA" : " MHA"));
        const int pages = 128 / page + 8;
        kv::KvPoolConfig pc{.layout = mla ? kv::KvLayout::kMla : kv::KvLayout::kMha,
                            .num_layers = 2,
                            .num_pages = pages,
                            .page_size = page,
                            .dtype = DType::kF32};
        if (mla) {
          pc.kv_lora_rank = 32;
          pc.rope_dim = 8;
        } else {
          pc.num_kv_heads = 2;
          pc.head_dim = 12;
          pc.head_dim_v = 8;
        }
        kv::KvPool pool(pc, platform->allocator());
        pool.fill(-7.f);
        kv::ReqToTokenTable table(4, 128);
        const attention::BackendContext ctx{
            .platform = platform.get(), .kv_pool = &pool, .req_to_token = &table};
        auto backend = make(cpu, ctx);
        ASSERT_TRUE(backend->capabilities().ragged);
        Step step = make_step(table, page, pages, rng);
        const ForwardBatch& f = step.batch;
        const LayerId layer_id{1};
        const int64_t kdim = pool.k_row_elems(), vdim = mla ? 0 : pool.v_row_elems();
        const int hkv = mla ? 1 : 2;
        // The prefixes' rows as a previous step left them.
        for (int b = 0; b < 3; ++b) {
          const int pre = f.extend_prefix_lens[b];
          if (pre == 0) continue;
          std::vector<float> pk = randn(size_t(pre) * kdim, rng),
                             pv = randn(size_t(pre) * vdim, rng);
          const std::span<const SlotIndex> s(step.slots[b].data(), size_t(pre));
          pool.set_kv(
              layer_id, s, TensorView(pk.data(), DType::kF32, {pre, hkv, kdim / hkv}),
              mla ? TensorView() : TensorView(pv.data(), DType::kF32, {pre, hkv, vdim / hkv}));
        }
        const attention::AttentionLayer pool_layer{.layer_id = layer_id,
                                                   .num_q_heads = kHq,
                                                   .num_kv_heads = hkv,
                                                   .head_dim_qk = static_cast<int>(kdim / hkv),
                                                   .head_dim_v = mla ? 32 : 8,
                                                   .scaling = 0.2f,
                                                   .is_mla = mla};
        const int t = f.num_tokens();
        std::vector<float> nk = randn(size_t(t) * kdim, rng), nv = randn(size_t(t) * vdim, rng);
        const TensorView new_k(nk.data(), DType::kF32, {t, hkv, kdim / hkv});
        const TensorView new_v =
            mla ? TensorView() : TensorView(nv.data(), DType::kF32, {t, hkv, vdim / hkv});

        expect_error(ErrorCode::kFailedPrecondition, "init_forward_metadata",
                     [&] { backend->save_kv(new_k, new_v, pool_layer, f); });
        backend->init_forward_metadata(f);
        backend->save_kv(new_k, new_v, pool_layer, f);
        const float* kbase = static_cast<const float*>(pool.k_view(layer_id).data());
        const float* vbase =
            mla ? nullptr : static_cast<const float*>(pool.v_view(layer_id).data());
        for (int i = 0; i < t; ++i)
          for (int64_t d = 0; d < kdim; ++d)
            ASSERT_EQ(kbase[f.out_cache_loc[i] * kdim + d], nk[size_t(i * kdim + d)]) << i;
        // Layer 0 untouched.
        EXPECT_EQ(pool.k_at(LayerId{0}, SlotIndex(f.out_cache_loc[0]), 0, 0), -7.f);

        // gather_kv: every visible row, prefix and new, request by request.
        const int64_t n = f.seq_lens_sum();
        std::vector<float> gk(size_t(n) * kdim, kNaN), gv(size_t(n) * vdim, kNaN);
        backend->gather_kv(
            pool_layer, f, {}, TensorView(gk.data(), DType::kF32, {n, hkv, kdim / hkv}),
            mla ? TensorView() : TensorView(gv.data(), DType::kF32, {n, hkv, vdim / hkv}));
        for (int b = 0, row = 0; b < 3; ++b) {
          for (int p = 0; p < f.seq_lens[b]; ++p, ++row) {
            const int64_t slot = step.slots[b][p];
            for (int64_t d = 0; d < kdim; ++d)
              ASSERT_EQ(gk[size_t(row * kdim + d)], kbase[slot * kdim + d]) << b << " " << p;
            for (int64_t d = 0; d < vdim; ++d)
              ASSERT_EQ(gv[size_t(row * vdim + d)], vbase[slot * vdim + d]) << b << " " << p;
          }
        }
        expect_error(ErrorCode::kInvalidArgument, "gathered", [&] {
          backend->gather_kv(
              pool_layer, f, {}, TensorView(gk.data(), DType::kF32, {n - 1, hkv, kdim / hkv}),
              mla ? TensorView() : TensorView(gv.data(), DType::kF32, {n - 1, hkv, vdim / hkv}));
        });
        if (mla) {
          expect_error(ErrorCode::kInvalidArgument, "v_out", [&] {
            backend->gather_kv(pool_layer, f, {}, TensorView(gk.data(), DType::kF32, {n, 1, kdim}),
                               TensorView(gk.data(), DType::kF32, {n, 1, 32}));
          });
        }

        // forward_ragged over caller K/V: rows kPitch floats per head (the first kDqk are K,
        // the first kDv are V), GQA 4 / 2.
        std::vector<float> k = randn(size_t(n) * kHkv * kPitch, rng),
                           v = randn(size_t(n) * kHkv * kPitch, rng),
                           q = randn(size_t(t) * kHq * kDqk, rng);
        const TensorView kv_k(k.data(), DType::kF32, {n, kHkv, kDqk}, {kHkv * kPitch, kPitch, 1},
                              Device::cpu());
        const TensorView kv_v(v.data(), DType::kF32, {n, kHkv, kDv}, {kHkv * kPitch, kPitch, 1},
                              Device::cpu());
        const TensorView qv(q.data(), DType::kF32, {t, kHq, kDqk});
        for (const int window : {-1, 9}) {
          const float cap = window >= 0 ? 5.f : 0.f;
          SCOPED_TRACE(::testing::Message() << "window " << window);
          attention::AttentionLayer ragged{.layer_id = layer_id,
                                           .num_q_heads = kHq,
                                           .num_kv_heads = kHkv,
                                           .head_dim_qk = kDqk,
                                           .head_dim_v = kDv,
                                           .scaling = 0.3f,
                                           .logit_cap = cap,
                                           .sliding_window = window};
          std::vector<float> out(size_t(t) * kHq * kDv, kNaN);
          backend->forward_ragged(qv, kv_k, kv_v, ragged, f, {},
                                  TensorView(out.data(), DType::kF32, {t, kHq, kDv}), {});
          const double tol = 2e-5;
          EXPECT_LE(max_diff(out, oracle(f, q, k, v, 0.3f, window, cap)), tol);
          // The mutant: request 1 without its key 33 (its last two queries see it in both runs).
          EXPECT_GT(max_diff(out, oracle(f, q, k, v, 0.3f, window, cap, {1, 33})), 100 * tol);
          // Misuse.
          expect_error(ErrorCode::kInvalidArgument, "ragged K", [&] {
            backend->forward_ragged(qv, kv_k.slice0(0, n - 1), kv_v.slice0(0, n - 1), ragged, f, {},
                                    TensorView(out.data(), DType::kF32, {t, kHq, kDv}), {});
          });
          attention::AttentionLayer latent = ragged;
          latent.is_mla = true;
          expect_error(ErrorCode::kInvalidArgument, "MLA", [&] {
            backend->forward_ragged(qv, kv_k, kv_v, latent, f, {},
                                    TensorView(out.data(), DType::kF32, {t, kHq, kDv}), {});
          });
        }
        // The pool's layer 1 rows after all that: what save_kv wrote (forward_ragged reads none).
        for (int i = 0; i < t; ++i)
          ASSERT_EQ(kbase[f.out_cache_loc[i] * kdim], nk[size_t(i * kdim)]) << i;
        // A decode step has no ragged form.
        ForwardBatch d{.mode = ForwardMode::kDecode,
                       .batch_size = 1,
                       .req_pool_indices = {f.req_pool_indices[2]},
                       .seq_lens = {f.seq_lens[2]},
                       .positions = {f.seq_lens[2] - 1},
                       .out_cache_loc = {f.out_cache_loc.back()}};
        backend->init_forward_metadata(d);
        expect_error(ErrorCode::kInvalidArgument, "extend or mixed", [&] {
          backend->gather_kv(
              pool_layer, d, {}, TensorView(gk.data(), DType::kF32, {41, hkv, kdim / hkv}),
              mla ? TensorView() : TensorView(gv.data(), DType::kF32, {41, hkv, vdim / hkv}));
        });
      }
    }
  }
}

TEST(RaggedAttention, PlanListsEveryKeyOfEachRequest) {
  kv::ReqToTokenTable table(4, 64);
  std::mt19937 rng(5);
  Step s = make_step(table, 4, 40, rng);
  const attention::RaggedPlan r = attention::build_ragged_plan(s.batch, table);
  EXPECT_EQ(r.plan.page_size, 1);
  EXPECT_EQ(r.plan.qo_indptr, (std::vector<int32_t>{0, 19, 25, 26}));
  EXPECT_EQ(r.plan.kv_indptr, (std::vector<int32_t>{0, 19, 54, 95}));
  EXPECT_EQ(r.plan.kv_last_page_len, (std::vector<int32_t>{1, 1, 1}));
  std::vector<int32_t> iota(95);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(r.plan.kv_indices, iota);
  std::vector<int32_t> want;
  for (const auto& req : s.slots) want.insert(want.end(), req.begin(), req.end());
  EXPECT_EQ(r.slots, want);
  ForwardBatch windowed = s.batch;
  windowed.kv_start = {0, 0, 0};
  expect_error(ErrorCode::kInvalidArgument, "kv_start",
               [&] { (void)attention::build_ragged_plan(windowed, table); });
}

// Key windows (forward_batch.h KeyWindows): the mixed step's keys split into the new tokens'
// window (causal) and two rounds of prefix windows (every query sees them; request 0 has no
// prefix, so its queries see no key there: out 0, lse -inf), each attended over its own
// caller rows with its LSE, merged by attention::merge_state, equal the f64 attention over all
// keys; a window's gathered rows are the full gather's rows of its positions. Misuse: windows
// mixing both kinds, one ending inside the new tokens, wrong sizes, sinks.
TEST(RaggedAttention, KeyWindowsMergeToTheFullAttention) {
  const pagoda::testing::TestSeed seed;
  std::mt19937 rng(seed);
  auto platform = platform::make_cpu_platform();
  for (const bool cpu : {false, true}) {
    SCOPED_TRACE(cpu ? "cpu" : "reference");
    const int page = 16, pages = 128 / page + 8;
    kv::KvPoolConfig pc{.layout = kv::KvLayout::kMha,
                        .num_layers = 1,
                        .num_pages = pages,
                        .page_size = page,
                        .dtype = DType::kF32,
                        .num_kv_heads = 2,
                        .head_dim = 12,
                        .head_dim_v = 8};
    kv::KvPool pool(pc, platform->allocator());
    std::vector<float> fill = randn(static_cast<size_t>(pool.num_slots()) * 24, rng);
    std::vector<float> fill_v = randn(static_cast<size_t>(pool.num_slots()) * 16, rng);
    std::vector<SlotIndex> all(static_cast<size_t>(pool.num_slots()));
    std::iota(all.begin(), all.end(), 0);
    pool.set_kv(LayerId{0}, all, TensorView(fill.data(), DType::kF32, {pool.num_slots(), 2, 12}),
                TensorView(fill_v.data(), DType::kF32, {pool.num_slots(), 2, 8}));
    kv::ReqToTokenTable table(4, 128);
    const attention::BackendContext ctx{
        .platform = platform.get(), .kv_pool = &pool, .req_to_token = &table};
    auto backend = make(cpu, ctx);
    Step step = make_step(table, page, pages, rng);  // (prefix, new): (0, 19), (29, 6), (40, 1)
    const ForwardBatch& f = step.batch;
    backend->init_forward_metadata(f);
    const int t = f.num_tokens();
    const auto n = static_cast<int>(f.seq_lens_sum());
    attention::AttentionLayer layer{.layer_id = LayerId{0},
                                    .num_q_heads = kHq,
                                    .num_kv_heads = kHkv,
                                    .head_dim_qk = kDqk,
                                    .head_dim_v = kDv,
                                    .scaling = 0.3f};
    // Caller K/V of every key (rows kPitch floats per head), and q.
    std::vector<float> k = randn(size_t(n) * kHkv * kPitch, rng),
                       v = randn(size_t(n) * kHkv * kPitch, rng),
                       q = randn(size_t(t) * kHq * kDqk, rng);
    const TensorView qv(q.data(), DType::kF32, {t, kHq, kDqk});
    const std::vector<std::vector<int32_t>> begin{{0, 29, 40}, {0, 0, 0}, {0, 17, 23}},
        end{{19, 35, 41}, {0, 17, 23}, {0, 29, 40}};
    std::vector<float> gathered_all(size_t(n) * 24, kNaN), gathered_v(size_t(n) * 16, kNaN);
    backend->gather_kv(layer, f, {}, TensorView(gathered_all.data(), DType::kF32, {n, 2, 12}),
                       TensorView(gathered_v.data(), DType::kF32, {n, 2, 8}));
    std::vector<float> acc_o, acc_lse;
    for (size_t w = 0; w < begin.size(); ++w) {
      SCOPED_TRACE(::testing::Message() << "window " << w);
      const attention::KeyWindows win{.begin = begin[w], .end = end[w]};
      // The window's rows: request by request, its positions in order.
      std::vector<float> wk, wv;
      std::vector<int64_t> rows;  // full-gather row of each window row
      for (int b = 0, off = 0; b < 3; off += f.seq_lens[b], ++b)
        for (int p = begin[w][b]; p < end[w][b]; ++p) rows.push_back(off + p);
      const auto m = static_cast<int64_t>(rows.size());
      for (int64_t r : rows) {
        wk.insert(wk.end(), k.begin() + r * kHkv * kPitch, k.begin() + (r + 1) * kHkv * kPitch);
        wv.insert(wv.end(), v.begin() + r * kHkv * kPitch, v.begin() + (r + 1) * kHkv * kPitch);
      }
      std::vector<float> gk(size_t(m) * 24, kNaN), gv(size_t(m) * 16, kNaN);
      backend->gather_kv(layer, f, win, TensorView(gk.data(), DType::kF32, {m, 2, 12}),
                         TensorView(gv.data(), DType::kF32, {m, 2, 8}));
      for (int64_t i = 0; i < m; ++i) {
        for (int d = 0; d < 24; ++d)
          ASSERT_EQ(gk[size_t(i * 24 + d)], gathered_all[size_t(rows[i] * 24 + d)]) << i;
        for (int d = 0; d < 16; ++d)
          ASSERT_EQ(gv[size_t(i * 16 + d)], gathered_v[size_t(rows[i] * 16 + d)]) << i;
      }
      const TensorView kk(wk.data(), DType::kF32, {m, kHkv, kDqk}, {kHkv * kPitch, kPitch, 1},
                          Device::cpu());
      const TensorView vv(wv.data(), DType::kF32, {m, kHkv, kDv}, {kHkv * kPitch, kPitch, 1},
                          Device::cpu());
      std::vector<float> o(size_t(t) * kHq * kDv, kNaN), lse(size_t(t) * kHq, kNaN);
      backend->forward_ragged(qv, kk, vv, layer, f, win,
                              TensorView(o.data(), DType::kF32, {t, kHq, kDv}),
                              TensorView(lse.data(), DType::kF32, {t, kHq}));
      if (w > 0) {  // request 0's 19 queries see no key in a prefix window
        for (int i = 0; i < 19 * kHq; ++i) ASSERT_EQ(lse[size_t(i)], -INFINITY) << i;
        for (int i = 0; i < 19 * kHq * kDv; ++i) ASSERT_EQ(o[size_t(i)], 0.f) << i;
      }
      if (w == 0) {
        acc_o = o;
        acc_lse = lse;
        continue;
      }
      std::vector<float> mo(acc_o.size()), ml(acc_lse.size());
      attention::merge_state(TensorView(acc_o.data(), DType::kF32, {t, kHq, kDv}),
                             TensorView(acc_lse.data(), DType::kF32, {t, kHq}),
                             TensorView(o.data(), DType::kF32, {t, kHq, kDv}),
                             TensorView(lse.data(), DType::kF32, {t, kHq}),
                             TensorView(mo.data(), DType::kF32, {t, kHq, kDv}),
                             TensorView(ml.data(), DType::kF32, {t, kHq}));
      acc_o = mo;
      acc_lse = ml;
    }
    const std::vector<double> want = oracle(f, q, k, v, 0.3f, -1, 0.f);
    EXPECT_LE(max_diff(acc_o, want), 2e-5);
    EXPECT_GT(max_diff(acc_o, oracle(f, q, k, v, 0.3f, -1, 0.f, {1, 20})), 2e-3)
        << "a prefix key left out of the oracle is not seen";
    // Misuse.
    std::vector<float> o(size_t(t) * kHq * kDv);
    const TensorView out(o.data(), DType::kF32, {t, kHq, kDv});
    auto attend = [&](const std::vector<int32_t>& b, const std::vector<int32_t>& e,
                      const attention::AttentionLayer& l) {
      int64_t m = 0;
      for (size_t i = 0; i < b.size(); ++i) m += e[i] - b[i];
      const TensorView kk(k.data(), DType::kF32, {m, kHkv, kDqk}, {kHkv * kPitch, kPitch, 1},
                          Device::cpu());
      const TensorView vv(v.data(), DType::kF32, {m, kHkv, kDv}, {kHkv * kPitch, kPitch, 1},
                          Device::cpu());
      backend->forward_ragged(qv, kk, vv, l, f, {.begin = b, .end = e}, out, {});
    };
    expect_error(ErrorCode::kInvalidArgument, "mix", [&] {
      attend({0, 0, 0}, {19, 10, 0}, layer);
    });
    expect_error(ErrorCode::kInvalidArgument, "ends inside", [&] {
      attend({0, 0, 0}, {0, 31, 0}, layer);
    });
    expect_error(ErrorCode::kInvalidArgument, "not inside", [&] {
      attend({0, 0, 0}, {0, 36, 0}, layer);
    });
    expect_error(ErrorCode::kInvalidArgument, "key windows", [&] {
      attend({0, 0}, {0, 10}, layer);
    });
    const std::vector<float> sinks(kHq, 0.5f);
    attention::AttentionLayer sunk = layer;
    sunk.sinks = sinks;
    expect_error(ErrorCode::kUnsupported, "sinks", [&] { attend({0, 0, 0}, {0, 10, 5}, sunk); });
  }
}

}  // namespace
}  // namespace pagoda::backends::ragged_test
