// DeepSeek sparse attention on random shapes: the cpu backend's gather path
// (SparseAttentionPath::kGather: one request per query row over its selected slots) and the
// reference backend's mask path, each against an fp64 softmax over the selected rows computed
// here from a dense copy of the latent rows (never from the pool, the table or a plan).
// Trials: page sizes 1 / 16 / 64, ragged batches of prefill, extend and decode requests (kExtend,
// kDecode and kMixed steps), k below and above the contexts (top-k with ties to the lower
// position, as the indexer selects), f32 and bf16 latents, head dims 80 and 576; pools and
// outputs NaN-poisoned, the new tokens written by the forward itself. Each trial also checks that
// the comparison bites: an oracle missing one selected key, or with one key past a row's causal
// limit, is far outside the tolerance. Bad selections are refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <vector>

#include "pagoda/backends/cpu/cpu_backend.h"
#include "pagoda/backends/reference/reference_backend.h"
#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/platform/platform.h"
#include "sparse_oracle.h"
#include "test_seed.h"

namespace pagoda::backends::sparse_gather_test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kScale = 0.072f;

struct Request {
  int prefix = 0, news = 1;
};

struct Trial {
  int page = 16;
  DType dtype = DType::kF32;  ///< q and latent (outputs are f32)
  int rank = 64, rope = 16, heads = 4;
  int k = 16;
  std::vector<Request> reqs;
  attention::ForwardMode mode = attention::ForwardMode::kExtend;
  int dim() const { return rank + rope; }
};

Trial make_trial(int i, std::mt19937& rng) {
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Trial t;
  t.page = std::vector<int>{1, 16, 64}[i % 3];
  t.dtype = i % 4 == 3 ? DType::kBF16 : DType::kF32;
  if (i % 2 == 1) {  // DeepSeek's latent: rank 512 + rope 64
    t.rank = 512;
    t.rope = 64;
  }
  t.heads = uniform(0, 1) == 0 ? 4 : 16;
  t.k = std::vector<int>{3, 16, 40, 1024}[uniform(0, 3)];  // 1024 > every context
  const bool decode_only = i % 5 == 4;
  const int bs = uniform(1, 4);
  int decodes = 0;
  for (int b = 0; b < bs; ++b) {
    const int kind = decode_only ? 2 : uniform(0, 2);  // prefill / extend / decode
    Request r;
    if (kind == 0) {
      r.news = uniform(1, 24);
    } else if (kind == 1) {
      r.prefix = uniform(1, 150);
      r.news = uniform(1, 12);
    } else {
      r.prefix = uniform(0, 180);
      ++decodes;
    }
    t.reqs.push_back(r);
  }
  t.mode = decode_only                       ? attention::ForwardMode::kDecode
           : decodes > 0 && decodes < bs     ? attention::ForwardMode::kMixed
                                             : attention::ForwardMode::kExtend;
  return t;
}

/// The indexer's rule, written here: the min(k, visible) positions of highest score, ties to
/// the lower position, in score order, padded with -1.
/// The backend under test: cpu (the gather path) or reference (the mask path).
std::unique_ptr<attention::AttentionBackend> sparse_backend(bool cpu,
                                                            const attention::BackendContext& ctx) {
  if (cpu) return std::make_unique<CpuBackend>(ctx);
  return std::make_unique<ReferenceBackend>(ctx);
}

std::vector<int32_t> select_topk(const std::vector<int>& score, int k) {
  std::vector<int32_t> order(score.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return score[a] > score[b]; });
  order.resize(std::min(order.size(), static_cast<size_t>(k)));
  order.resize(static_cast<size_t>(k), -1);
  return order;
}

using Expected = testing::SparseExpected;

/// The fp64 oracle (sparse_oracle.h) over `seen[r]` (row indices into `latent`, each row
/// [rank + rope]; the value is its first `rank` elements).
Expected oracle(const Trial& t, const std::vector<float>& q, const std::vector<float>& latent,
                const std::vector<std::vector<int>>& seen) {
  std::vector<std::vector<const float*>> keys(seen.size());
  for (size_t r = 0; r < seen.size(); ++r)
    for (int row : seen[r]) keys[r].push_back(latent.data() + static_cast<size_t>(row) * t.dim());
  return testing::sparse_mla_oracle(q, t.heads, t.dim(), t.rank, kScale, keys);
}

/// Largest |got - want| over outputs and LSEs (NaN counts as infinitely far; equal infinities
/// as equal).
double worst_diff(const std::vector<float>& out, const std::vector<float>& lse,
                  const Expected& e) {
  double worst = 0;
  auto add = [&](double got, double want) {
    if (std::isinf(want) && got == want) return;
    const double d = std::fabs(got - want);
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  };
  for (size_t i = 0; i < out.size(); ++i) add(out[i], e.out[i]);
  for (size_t i = 0; i < lse.size(); ++i) add(lse[i], e.lse[i]);
  return worst;
}

/// `x` rounded to the trial's dtype, and its bytes in that dtype.
float round_to_dtype(DType dt, float x) {
  return dt == DType::kBF16 ? bf16_bits_to_f32(f32_to_bf16_bits(x)) : x;
}
TensorView as_dtype(DType dt, const std::vector<float>& x, std::vector<uint16_t>& bf16,
                    int64_t rows, int64_t heads, int64_t dim) {
  if (dt == DType::kF32) return TensorView(const_cast<float*>(x.data()), dt, {rows, heads, dim});
  bf16.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) bf16[i] = f32_to_bf16_bits(x[i]);
  return TensorView(bf16.data(), dt, {rows, heads, dim});
}

TEST(SparseMla, GatherAndMaskPathsMatchFp64OverTheSelectedRowsOnRandomShapes) {
  const pagoda::testing::TestSeed seed;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal(0.f, 1.f);
  auto platform = platform::make_cpu_platform();
  constexpr int kTrials = 10;
  for (int trial = 0; trial < kTrials; ++trial) {
    const Trial t = make_trial(trial, rng);
    const int bs = static_cast<int>(t.reqs.size()), d = t.dim();
    std::ostringstream shape;
    shape << "reqs";
    for (const Request& r : t.reqs) shape << ' ' << r.prefix << '+' << r.news;
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " page " << t.page << " " << dtype_name(t.dtype) << " dim "
                 << d << " heads " << t.heads << " k " << t.k << " " << shape.str());
    // Logical rows: latent[first[b] + p] is position p of request b (a dense copy the oracle
    // reads), on shuffled pages; the pool is NaN elsewhere.
    std::vector<int> first(bs + 1, 0);
    int pages = 4;
    for (int b = 0; b < bs; ++b) {
      const int len = t.reqs[b].prefix + t.reqs[b].news;
      first[b + 1] = first[b] + len;
      pages += (len + t.page - 1) / t.page;
    }
    std::vector<float> latent(static_cast<size_t>(first[bs]) * d);
    for (float& x : latent) x = round_to_dtype(t.dtype, normal(rng));
    std::vector<int32_t> page_ids(static_cast<size_t>(pages));
    std::iota(page_ids.begin(), page_ids.end(), 1);
    std::shuffle(page_ids.begin(), page_ids.end(), rng);
    std::vector<std::vector<SlotIndex>> slots(bs);
    for (int b = 0, next = 0; b < bs; ++b) {
      const int len = first[b + 1] - first[b];
      for (int p = 0; p < len; ++p)
        slots[b].push_back(page_ids[(next + p) / t.page] * t.page + p % t.page);
      next += (len + t.page - 1) / t.page * t.page;
    }
    attention::ForwardBatch f{.mode = t.mode, .batch_size = bs};
    std::vector<float> new_rows;
    std::vector<int> row_request, row_visible;
    for (int b = 0; b < bs; ++b) {
      const Request& r = t.reqs[b];
      f.req_pool_indices.push_back(b + 1);  // table rows 1..bs (0 is padding), allocated below
      f.seq_lens.push_back(r.prefix + r.news);
      if (t.mode != attention::ForwardMode::kDecode) {
        f.extend_prefix_lens.push_back(r.prefix);
        f.extend_seq_lens.push_back(r.news);
      }
      for (int p = r.prefix; p < r.prefix + r.news; ++p) {
        f.positions.push_back(p);
        f.out_cache_loc.push_back(slots[b][p]);
        new_rows.insert(new_rows.end(), latent.begin() + (first[b] + p) * d,
                        latent.begin() + (first[b] + p + 1) * d);
        row_request.push_back(b);
        row_visible.push_back(p + 1);
      }
    }
    const int rows = f.num_tokens();
    // The selection: random scores with many ties over each row's visible positions.
    std::vector<int32_t> topk;
    std::vector<std::vector<int>> seen(rows);
    const int empty_row = trial % 3 == 1 ? static_cast<int>(rng() % rows) : -1;
    for (int r = 0; r < rows; ++r) {
      std::vector<int> score(static_cast<size_t>(row_visible[r]));
      for (int& s : score) s = static_cast<int>(rng() % 5);
      std::vector<int32_t> sel = select_topk(score, t.k);
      if (r == empty_row) std::fill(sel.begin(), sel.end(), -1);  // selects nothing
      for (int32_t p : sel)
        if (p >= 0) seen[r].push_back(first[row_request[r]] + p);
      topk.insert(topk.end(), sel.begin(), sel.end());
    }
    std::vector<float> q(static_cast<size_t>(rows) * t.heads * d);
    for (float& x : q) x = round_to_dtype(t.dtype, normal(rng));
    std::vector<uint16_t> q_bf16, new_bf16;
    const TensorView qv = as_dtype(t.dtype, q, q_bf16, rows, t.heads, d);
    const TensorView kv_new = as_dtype(t.dtype, new_rows, new_bf16, rows, 1, d);
    const Expected want = oracle(t, q, latent, seen);
    const double tol = 1e-4;

    for (const bool cpu : {true, false}) {
      SCOPED_TRACE(cpu ? "cpu (gather)" : "reference (mask)");
      kv::KvPool pool({.layout = kv::KvLayout::kMla, .num_layers = 1, .num_pages = pages,
                       .page_size = t.page, .dtype = t.dtype, .kv_lora_rank = t.rank,
                       .rope_dim = t.rope, .index_head_dim = 8},
                      platform->allocator());
      pool.fill(kNaN);
      kv::ReqToTokenTable table(bs + 1, 256);
      for (int b = 0; b < bs; ++b) {
        const ReqSlot row = *table.alloc();
        ASSERT_EQ(row.value(), b + 1);
        table.write(row, 0, slots[b]);
        const int prefix = t.reqs[b].prefix;
        if (prefix == 0) continue;
        pool.set_kv(LayerId{0}, std::span(slots[b]).first(prefix),
                    TensorView(latent.data() + first[b] * d, DType::kF32, {prefix, 1, d}),
                    TensorView());
      }
      const attention::BackendContext ctx{.platform = platform.get(), .kv_pool = &pool,
                                          .req_to_token = &table};
      const std::unique_ptr<attention::AttentionBackend> backend = sparse_backend(cpu, ctx);
      backend->init_forward_metadata(f);
      const attention::IndexerMetadata* meta = backend->get_indexer_metadata();
      ASSERT_NE(meta, nullptr);
      ASSERT_EQ(meta->row_visible, row_visible);
      const attention::AttentionLayer layer{.layer_id = LayerId{0}, .num_q_heads = t.heads,
                                            .num_kv_heads = 1, .head_dim_qk = d,
                                            .head_dim_v = t.rank, .scaling = kScale,
                                            .is_mla = true};
      std::vector<float> out(static_cast<size_t>(rows) * t.heads * t.rank, kNaN);
      std::vector<float> lse(static_cast<size_t>(rows) * t.heads, kNaN);
      backend->set_sparse_topk(topk, t.k);
      backend->set_lse_output(TensorView(lse.data(), DType::kF32, {rows, t.heads}));
      backend->forward(qv, kv_new, TensorView(), layer, f,
                       TensorView(out.data(), DType::kF32, {rows, t.heads, t.rank}),
                       attention::SaveKv::kYes);
      EXPECT_LE(worst_diff(out, lse, want), tol);
      if (empty_row >= 0) {
        for (int i = 0; i < t.heads * t.rank; ++i)
          ASSERT_EQ(out[empty_row * t.heads * t.rank + i], 0.f) << "a row selecting nothing";
      }
      if (!cpu) continue;
      // The comparison bites: one selected key dropped (from the row with the fewest, >= 2) ...
      int few = -1;
      for (int r = 0; r < rows; ++r)
        if (seen[r].size() >= 2 && (few < 0 || seen[r].size() < seen[few].size())) few = r;
      if (few >= 0) {
        auto missing = seen;
        missing[few].erase(missing[few].begin() + static_cast<long>(rng() % seen[few].size()));
        EXPECT_GT(worst_diff(out, lse, oracle(t, q, latent, missing)), 20 * tol)
            << "an oracle missing one key of row " << few;
      }
      // ... or one key past the causal limit (a row that is not its request's last).
      for (int r = 0; r + 1 < rows; ++r) {
        if (row_request[r + 1] != row_request[r] || r == empty_row) continue;
        auto beyond = seen;
        beyond[r].push_back(first[row_request[r]] + row_visible[r]);
        EXPECT_GT(worst_diff(out, lse, oracle(t, q, latent, beyond)), 20 * tol)
            << "an oracle seeing position " << row_visible[r] << " from row " << r;
        break;
      }
    }
  }
}

TEST(SparseMla, BadSelectionsAreRefusedByName) {
  auto platform = platform::make_cpu_platform();
  constexpr int kRank = 16, kRope = 8, kDim = kRank + kRope, kHeads = 2, kTopk = 4;
  for (const bool cpu : {true, false}) {
    SCOPED_TRACE(cpu ? "cpu" : "reference");
    kv::KvPool pool({.layout = kv::KvLayout::kMla, .num_layers = 1, .num_pages = 8,
                     .page_size = 16, .dtype = DType::kF32, .kv_lora_rank = kRank,
                     .rope_dim = kRope, .index_head_dim = 8},
                    platform->allocator());
    pool.fill(0.5f);
    kv::ReqToTokenTable table(1, 64);
    const ReqSlot row = *table.alloc();
    std::vector<SlotIndex> slots(20);
    std::iota(slots.begin(), slots.end(), 32);
    table.write(row, 0, slots);
    const attention::BackendContext ctx{.platform = platform.get(), .kv_pool = &pool,
                                        .req_to_token = &table};
    const std::unique_ptr<attention::AttentionBackend> backend = sparse_backend(cpu, ctx);
    // Two rows of one request: positions 18 and 19 of 20 (they see 19 and 20 positions).
    attention::ForwardBatch f{.mode = attention::ForwardMode::kExtend, .batch_size = 1,
                              .req_pool_indices = {row.value()}, .seq_lens = {20},
                              .extend_prefix_lens = {18}, .extend_seq_lens = {2},
                              .positions = {18, 19}, .out_cache_loc = {slots[18], slots[19]}};
    backend->init_forward_metadata(f);
    auto refused = [&](std::vector<int32_t> topk, int k, ErrorCode code, const char* what) {
      try {
        backend->set_sparse_topk(topk, k);
        ADD_FAILURE() << "accepted: " << what;
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), code) << what << ": " << e.what();
      }
    };
    refused({0, 1, 2, 19, 0, 1, 2, 3}, kTopk, ErrorCode::kOutOfRange, "row 0 past its causal limit");
    refused({0, 1, -2, -1, 0, 1, 2, 3}, kTopk, ErrorCode::kOutOfRange, "an entry below -1");
    refused({5, 1, 5, -1, 0, 1, 2, 3}, kTopk, ErrorCode::kInvalidArgument, "a position twice");
    refused({0, 1, 2, 3, 0, 1, 2}, kTopk, ErrorCode::kInvalidArgument, "wrong size");
    refused({}, 0, ErrorCode::kInvalidArgument, "k 0");
    // The row's own position (18 for row 0) is visible; a refused selection left nothing behind.
    backend->set_sparse_topk(std::vector<int32_t>{18, 0, -1, -1, 19, 18, 0, 1}, kTopk);
    std::vector<float> q(2 * kHeads * kDim, 0.25f), out(2 * kHeads * kRank, kNaN);
    attention::AttentionLayer layer{.layer_id = LayerId{0}, .num_q_heads = kHeads,
                                    .num_kv_heads = 1, .head_dim_qk = kDim, .head_dim_v = kRank,
                                    .scaling = 0.2f, .is_mla = true};
    const TensorView qv(q.data(), DType::kF32, {2, kHeads, kDim});
    const TensorView ov(out.data(), DType::kF32, {2, kHeads, kRank});
    backend->forward(qv, TensorView(), TensorView(), layer, f, ov, attention::SaveKv::kNo);
    for (float x : out) ASSERT_FLOAT_EQ(x, 0.5f);  // every latent element is 0.5
    // A sliding-window layer has no sparse path.
    layer.sliding_window = 8;
    backend->set_sparse_topk(std::vector<int32_t>{18, 0, -1, -1, 19, 18, 0, 1}, kTopk);
    try {
      backend->forward(qv, TensorView(), TensorView(), layer, f, ov, attention::SaveKv::kNo);
      ADD_FAILURE() << "a windowed sparse forward was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    }
  }
}

}  // namespace
}  // namespace pagoda::backends::sparse_gather_test
