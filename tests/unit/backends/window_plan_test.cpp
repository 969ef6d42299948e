// The window layers' plan (ForwardBatch::kv_start, docs/design/kv.md §SWA): long requests with a
// sliding window, planned from their window's first page, against the same batch planned from
// position 0 (the full walk) and an fp64 oracle of the window, on the reference and cpu backends.
// Pages are permuted; every pool slot a request may not see (unused pages and each request's
// positions below its first query's window) is NaN, and so is the output before each run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "pagoda/attention/paged_plan.h"
#include "pagoda/backends/cpu/cpu_backend.h"
#include "pagoda/backends/reference/reference_backend.h"
#include "pagoda/core/error.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/platform/platform.h"
#include "random_floats.h"
#include "test_seed.h"

namespace pagoda::backends::window_plan {
namespace {

using attention::ForwardBatch;
using attention::ForwardMode;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int kHq = 4, kHkv = 2, kDim = 64, kWindowLeft = 511, kContext = 32768;

/// One request of a step: kv_len keys, of which the last `queries` are this step's.
struct Req {
  int kv_len = 0;
  int queries = 1;
  int first_query() const { return kv_len - queries; }
  int first_visible() const { return std::max(0, first_query() - kWindowLeft); }
};

/// The requests' logical K/V ([kv_len, kHkv, kDim] each), their rows in a NaN pool on permuted
/// pages, and one step's batch over them.
class Fixture {
 public:
  Fixture(std::vector<Req> reqs, ForwardMode mode, int page, std::mt19937_64& rng)
      : reqs_(std::move(reqs)), page_(page), table_(static_cast<int>(reqs_.size()), kContext) {
    int pages = 0;
    for (const Req& r : reqs_) pages += (r.kv_len + page - 1) / page;
    pool_ = std::make_unique<kv::KvPool>(
        kv::KvPoolConfig{.num_layers = 1, .num_pages = pages, .page_size = page,
                         .dtype = DType::kF32, .num_kv_heads = kHkv, .head_dim = kDim},
        platform_->allocator());
    pool_->fill(kNaN);
    std::vector<int32_t> order(static_cast<size_t>(pages));
    std::iota(order.begin(), order.end(), 1);  // page 0 is the pool's reserved page
    std::shuffle(order.begin(), order.end(), rng);
    size_t next_page = 0;
    batch_.mode = mode;
    batch_.batch_size = static_cast<int>(reqs_.size());
    for (const Req& r : reqs_) {
      std::vector<SlotIndex> slots(static_cast<size_t>(r.kv_len));
      for (int i = 0; i < r.kv_len; ++i) {
        if (i % page == 0) ++next_page;
        slots[static_cast<size_t>(i)] = order[next_page - 1] * page + i % page;
      }
      k_.push_back(pagoda::testing::uniform_floats(rng, size_t(r.kv_len) * kHkv * kDim, -1.f, 1.f));
      v_.push_back(pagoda::testing::uniform_floats(rng, size_t(r.kv_len) * kHkv * kDim, -1.f, 1.f));
      // Only the keys the step's queries may see are stored; the rest stay NaN.
      const int64_t lo = r.first_visible(), n = r.kv_len - lo;
      const size_t off = static_cast<size_t>(lo) * kHkv * kDim;
      pool_->set_kv(LayerId{0}, std::span(slots).subspan(static_cast<size_t>(lo)),
                    TensorView(k_.back().data() + off, DType::kF32, {n, kHkv, kDim}),
                    TensorView(v_.back().data() + off, DType::kF32, {n, kHkv, kDim}));
      const ReqSlot row = *table_.alloc();
      table_.write(row, 0, slots);
      batch_.req_pool_indices.push_back(row.value());
      batch_.seq_lens.push_back(r.kv_len);
      if (mode != ForwardMode::kDecode) {
        batch_.extend_prefix_lens.push_back(r.first_query());
        batch_.extend_seq_lens.push_back(r.queries);
      }
      for (int p = r.first_query(); p < r.kv_len; ++p) {
        batch_.positions.push_back(p);
        batch_.out_cache_loc.push_back(slots[static_cast<size_t>(p)]);
      }
    }
    q_ = pagoda::testing::uniform_floats(rng, size_t(batch_.num_tokens()) * kHq * kDim, -1.f, 1.f);
  }

  /// The batch planned from position 0 (kv_start empty).
  const ForwardBatch& full() const { return batch_; }
  /// The batch planned from each request's window: kv_start = first visible key rounded down to
  /// a page (what the worker's window batch sets).
  ForwardBatch windowed() const {
    ForwardBatch b = batch_;
    for (const Req& r : reqs_) b.kv_start.push_back(r.first_visible() / page_ * page_);
    return b;
  }
  const std::vector<Req>& reqs() const { return reqs_; }
  kv::ReqToTokenTable& table() { return table_; }

  /// Runs the step's one layer on `backend` (built over this pool and table) and returns its
  /// output [tokens, kHq, kDim]; NaN before the run.
  std::vector<float> run(attention::AttentionBackend& backend, const ForwardBatch& b) const {
    std::vector<float> out(q_.size(), kNaN);
    const int t = b.num_tokens();
    const attention::AttentionLayer layer{.layer_id = LayerId{0}, .num_q_heads = kHq,
                                          .num_kv_heads = kHkv, .head_dim_qk = kDim,
                                          .head_dim_v = kDim, .scaling = 0.125f,
                                          .sliding_window = kWindowLeft};
    backend.init_forward_metadata(b);
    backend.forward(TensorView(const_cast<float*>(q_.data()), DType::kF32, {t, kHq, kDim}),
                    TensorView(), TensorView(), layer, b,
                    TensorView(out.data(), DType::kF32, {t, kHq, kDim}), attention::SaveKv::kNo);
    return out;
  }

  /// The fp64 window attention of every query row, from the logical K/V (no pool, no plan).
  std::vector<double> oracle() const {
    std::vector<double> out(q_.size());
    size_t tok = 0;
    for (size_t b = 0; b < reqs_.size(); ++b) {
      const Req& r = reqs_[b];
      for (int p = r.first_query(); p < r.kv_len; ++p, ++tok) {
        const int lo = std::max(0, p - kWindowLeft);
        for (int h = 0; h < kHq; ++h) {
          const int hk = h / (kHq / kHkv);
          const float* q = q_.data() + (tok * kHq + h) * kDim;
          std::vector<double> s(static_cast<size_t>(p + 1 - lo));
          double mx = -INFINITY;
          for (int j = lo; j <= p; ++j) {
            const float* k = k_[b].data() + (size_t(j) * kHkv + hk) * kDim;
            double dot = 0;
            for (int d = 0; d < kDim; ++d) dot += double(q[d]) * k[d];
            s[static_cast<size_t>(j - lo)] = dot * 0.125;
            mx = std::max(mx, s[static_cast<size_t>(j - lo)]);
          }
          double sum = 0;
          for (double& x : s) sum += (x = std::exp(x - mx));
          double* o = out.data() + (tok * kHq + h) * kDim;
          for (int j = lo; j <= p; ++j) {
            const float* v = v_[b].data() + (size_t(j) * kHkv + hk) * kDim;
            for (int d = 0; d < kDim; ++d) o[d] += s[static_cast<size_t>(j - lo)] / sum * v[d];
          }
        }
      }
    }
    return out;
  }

  kv::KvPool& pool() { return *pool_; }

 private:
  std::vector<Req> reqs_;
  int page_;
  std::unique_ptr<platform::Platform> platform_ = platform::make_cpu_platform();
  std::unique_ptr<kv::KvPool> pool_;
  kv::ReqToTokenTable table_;
  ForwardBatch batch_;
  std::vector<std::vector<float>> k_, v_;
  std::vector<float> q_;
};

void expect_near(const std::vector<float>& got, const std::vector<double>& want, double tol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::abs(got[i] - want[i]) <= tol)  // NaN fails too
        << what << ": element " << i << " is " << got[i] << ", expected " << want[i];
  }
}

/// Plans `fx`'s step from the window and from position 0: the window plan has at most the
/// window's pages per request (plus the step's queries and the partial pages), the full one
/// every page; both run on the reference and cpu backends and equal the fp64 oracle.
void check_step(Fixture& fx, int page) {
  const ForwardBatch full = fx.full(), win = fx.windowed();
  const attention::PagedPlan pf = attention::build_paged_plan(full, fx.table(), page);
  const attention::PagedPlan pw = attention::build_paged_plan(win, fx.table(), page);
  ASSERT_EQ(pw.page_size, page);
  for (size_t b = 0; b < fx.reqs().size(); ++b) {
    const Req& r = fx.reqs()[b];
    const int64_t window_pages = pw.kv_indptr[b + 1] - pw.kv_indptr[b];
    const int64_t bound = (kWindowLeft + r.queries + page - 1) / page + 1;
    EXPECT_LE(window_pages, bound) << "request " << b << " (kv_len " << r.kv_len << ")";
    EXPECT_EQ(pf.kv_indptr[b + 1] - pf.kv_indptr[b], (r.kv_len + page - 1) / page);
    EXPECT_EQ(pw.kv_len(static_cast<int>(b)), r.kv_len - win.kv_start[b]);
  }
  const std::vector<double> want = fx.oracle();
  const attention::BackendContext ctx{.kv_pool = &fx.pool(), .req_to_token = &fx.table()};
  ReferenceBackend reference(ctx);
  CpuBackend cpu(ctx, CpuAttentionOptions{.num_threads = 2});
  for (attention::AttentionBackend* backend :
       std::initializer_list<attention::AttentionBackend*>{&reference, &cpu}) {
    const std::vector<float> w = fx.run(*backend, win);
    expect_near(w, want, 2e-5, backend->name() + " window plan vs oracle");
    const std::vector<float> f = fx.run(*backend, full);
    expect_near(f, want, 2e-5, backend->name() + " full plan vs oracle");
  }
}

TEST(WindowPlan, LongRequestsPlanOnlyTheirWindowAndMatchTheFullWalk) {
  for (int page : {1, 16, 64}) {
    SCOPED_TRACE("page " + std::to_string(page));
    const pagoda::testing::TestSeed seed;
    std::mt19937_64 rng(seed);
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    {  // decode: a 32k request, one a bit past the window, one inside it
      Fixture fx({{.kv_len = kContext}, {.kv_len = pick(kWindowLeft + 2, 2000)},
                  {.kv_len = pick(1, kWindowLeft)}},
                 ForwardMode::kDecode, page, rng);
      check_step(fx, page);
    }
    {  // extend: a chunk deep into a long request, a first chunk longer than the window
      Fixture fx({{.kv_len = pick(20000, kContext), .queries = pick(1, 300)},
                  {.kv_len = 900, .queries = 900}},
                 ForwardMode::kExtend, page, rng);
      check_step(fx, page);
    }
  }
}

TEST(WindowPlan, KvStartIsCheckedAgainstThePageAndTheFirstQuery) {
  kv::ReqToTokenTable table(1, 64);
  const ReqSlot row = *table.alloc();
  std::vector<SlotIndex> slots(40);
  std::iota(slots.begin(), slots.end(), 16);
  table.write(row, 0, slots);
  ForwardBatch b{.mode = ForwardMode::kExtend, .batch_size = 1,
                 .req_pool_indices = {row.value()}, .seq_lens = {40},
                 .extend_prefix_lens = {20}, .extend_seq_lens = {20},
                 .out_cache_loc = std::vector<int32_t>(slots.begin() + 20, slots.end()),
                 .kv_start = {16}};
  const attention::PagedPlan p = attention::build_paged_plan(b, table, 8);
  EXPECT_EQ(p.kv_indices, (std::vector<int32_t>{4, 5, 6}));  // positions 16..39: slots 32..55
  EXPECT_EQ(p.kv_last_page_len, (std::vector<int32_t>{8}));
  auto code = [&](const ForwardBatch& bad) -> std::optional<ErrorCode> {
    try {
      attention::build_paged_plan(bad, table, 8);
    } catch (const Error& e) {
      return e.code();
    }
    return std::nullopt;
  };
  ForwardBatch bad = b;
  bad.kv_start = {12};  // not a page multiple
  EXPECT_EQ(code(bad), ErrorCode::kInvalidArgument);
  bad.kv_start = {24};  // past the first query (20): that query would lose keys
  EXPECT_EQ(code(bad), ErrorCode::kInvalidArgument);
  bad.kv_start = {0, 0};  // not one per request
  EXPECT_EQ(code(bad), ErrorCode::kInvalidArgument);
  bad = b;
  bad.mode = ForwardMode::kTargetVerify;  // a tree mask spans every key
  bad.spec.num_draft_tokens = 20;
  bad.seq_lens = {20};
  EXPECT_EQ(code(bad), ErrorCode::kUnsupported);
}

}  // namespace
}  // namespace pagoda::backends::window_plan
