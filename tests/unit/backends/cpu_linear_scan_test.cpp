// The cpu linear backend's chunked SSD scan (backends/cpu/cpu_linear_backend.h) against the
// reference backend's fp64 recurrence at realistic sizes: batches of ragged sequences (lengths up
// to ~1,000, chunk boundaries not aligned to the SSD chunk, lengths on both sides of the
// per-token / chunked threshold), starting from a random state already in the slot (a prefix hit
// or an earlier chunk of a chunked prefill), an extend continuing each sequence, then decode
// steps; groups 1, 2 and 8. Outputs are NaN-poisoned before every call; every output row and
// every slot's final conv and SSM state must match within f32 tolerance.
#include <cblas.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "pagoda/backends/cpu/cpu_linear_backend.h"
#include "pagoda/backends/reference/reference_linear_backend.h"
#include "random_floats.h"
#include "test_seed.h"

namespace pagoda::backends {
namespace {

using pagoda::testing::uniform_floats;

using attention::LinearLayer;
using attention::LinearSeq;
using attention::LinearShape;

/// |got - want| <= kTol · max(1, |want|): f32 rounding of ~1,000-token scans against fp64.
constexpr double kTol = 1e-3;

/// The largest |got - want| / max(1, |want|) over `n` floats (infinity for a non-finite got).
double worst(const float* got, const float* want, int64_t n) {
  double w = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    w = std::max(w, std::fabs(double{got[i]} - want[i]) / std::max(1.0, std::fabs(double{want[i]})));
  }
  return w;
}

struct ScanCase {
  LinearShape shape;
  std::vector<int32_t> first, second;  ///< tokens per sequence: the prefill call, the extend
};

void run_case(const ScanCase& sc, std::mt19937_64& rng) {
  const LinearShape& s = sc.shape;
  const int64_t cd = s.conv_dim(), di = s.d_inner(), h = s.num_heads;
  const auto heads = static_cast<size_t>(h);
  const std::vector<float> conv = uniform_floats(rng, size_t(cd * s.conv_kernel), -0.5f, 0.5f);
  const std::vector<float> conv_bias = uniform_floats(rng, size_t(cd), -0.1f, 0.1f);
  const std::vector<float> dt_bias = uniform_floats(rng, heads, -3.f, 0.f);
  // A = -exp(a_log) from -0.02 (states that outlive many chunks) to -7.
  const std::vector<float> a_log = uniform_floats(rng, heads, -4.f, 2.f);
  const std::vector<float> d = uniform_floats(rng, heads, 0.5f, 1.5f);
  const LinearLayer layer{.state_layer = 1,
                          .shape = s,
                          .weights = {.conv = conv.data(),
                                      .conv_bias = conv_bias.data(),
                                      .dt_bias = dt_bias.data(),
                                      .a_log = a_log.data(),
                                      .d = d.data()}};
  const auto nseq = static_cast<int32_t>(sc.first.size());
  kv::StatePool want_pool(2, nseq + 1, s.state_shape()), got_pool(2, nseq + 1, s.state_shape());
  std::vector<int32_t> slots;
  for (int32_t i = 0; i < nseq; ++i) {
    const int32_t a = want_pool.alloc();
    ASSERT_EQ(got_pool.alloc(), a);
    // The state already in the slot: a prefix hit or an earlier chunk.
    const auto conv0 = uniform_floats(rng, size_t(want_pool.shape().conv_floats()), -1.f, 1.f);
    const auto ssm0 = uniform_floats(rng, size_t(want_pool.shape().ssm_floats()), -1.f, 1.f);
    for (kv::StatePool* p : {&want_pool, &got_pool}) {
      std::copy(conv0.begin(), conv0.end(), p->conv_state(1, a));
      std::copy(ssm0.begin(), ssm0.end(), p->ssm_state(1, a));
    }
    slots.push_back(a);
  }
  ReferenceLinearBackend reference;
  CpuLinearBackend cpu;
  // One call per batch: the prefill, the extend, three decode steps.
  std::vector<std::vector<int32_t>> calls{sc.first, sc.second};
  for (int k = 0; k < 3; ++k) calls.emplace_back(size_t(nseq), 1);
  for (size_t call = 0; call < calls.size(); ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    std::vector<LinearSeq> seqs;
    int64_t rows = 0;
    for (int32_t i = 0; i < nseq; ++i) {
      seqs.push_back({.slot = slots[size_t(i)], .num_tokens = calls[call][size_t(i)]});
      rows += calls[call][size_t(i)];
    }
    // Strided rows: xBC and y rows padded, as the mixer's views of larger projections are.
    const int64_t xs = cd + 3, ys = di + 5;
    const std::vector<float> xbc = uniform_floats(rng, size_t(rows * xs), -1.f, 1.f);
    const std::vector<float> dt = uniform_floats(rng, size_t(rows * h), -1.f, 1.f);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> want(size_t(rows * ys), nan), got(size_t(rows * ys), nan);
    auto forward = [&](attention::LinearAttentionBackend& b, kv::StatePool& pool,
                       std::vector<float>& y) {
      b.init_forward_metadata(pool, seqs);
      b.forward(layer, TensorView(const_cast<float*>(xbc.data()), DType::kF32, {rows, cd}, {xs, 1}),
                TensorView(const_cast<float*>(dt.data()), DType::kF32, {rows, h}),
                TensorView(y.data(), DType::kF32, {rows, di}, {ys, 1}));
    };
    forward(reference, want_pool, want);
    forward(cpu, got_pool, got);
    int64_t r0 = 0;
    for (int32_t i = 0; i < nseq; ++i) {
      SCOPED_TRACE("sequence " + std::to_string(i) + " of " +
                   std::to_string(calls[call][size_t(i)]) + " tokens");
      double wy = 0.0;
      for (int64_t r = r0; r < r0 + calls[call][size_t(i)]; ++r)
        wy = std::max(wy, worst(got.data() + r * ys, want.data() + r * ys, di));
      EXPECT_LE(wy, kTol) << "y";
      r0 += calls[call][size_t(i)];
      const int32_t a = slots[size_t(i)];
      EXPECT_LE(worst(got_pool.ssm_state(1, a), want_pool.ssm_state(1, a),
                      got_pool.shape().ssm_floats()),
                kTol)
          << "SSM state";
      EXPECT_LE(worst(got_pool.conv_state(1, a), want_pool.conv_state(1, a),
                      got_pool.shape().conv_floats()),
                kTol)
          << "conv state";
    }
    // Layer 0 and the free slot are not touched.
    for (int32_t slot = 0; slot <= nseq; ++slot) {
      if (std::find(slots.begin(), slots.end(), slot) != slots.end()) continue;
      const float* st = got_pool.ssm_state(1, slot);
      EXPECT_TRUE(std::all_of(st, st + got_pool.shape().ssm_floats(), [](float v) { return v == 0.f; }));
    }
    for (int32_t slot = 0; slot <= nseq; ++slot) {
      const float* st = got_pool.ssm_state(0, slot);
      EXPECT_TRUE(std::all_of(st, st + got_pool.shape().ssm_floats(), [](float v) { return v == 0.f; }));
    }
  }
}

/// `n` ragged lengths: the edges that matter for chunk size q and the threshold first, then
/// random ones up to `max_len`.
std::vector<int32_t> ragged(std::mt19937_64& rng, int32_t n, int32_t q, int32_t max_len) {
  std::vector<int32_t> out{max_len, q + 1, q - 1, CpuLinearBackend::kChunkedFromTokens,
                           CpuLinearBackend::kChunkedFromTokens - 1, 2 * q};
  std::uniform_int_distribution<int32_t> len(1, max_len);
  out.resize(size_t(n));
  for (size_t i = 6; i < out.size(); ++i) out[i] = len(rng);
  for (int32_t& v : out) v = std::max(v, 1);
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

TEST(CpuLinearScan, ChunkedScanMatchesTheFp64RecurrenceAtRealisticSizes) {
  const pagoda::testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  struct Shape {
    int32_t groups, chunk;
  };
  for (const Shape sh : {Shape{1, 256}, Shape{2, 64}, Shape{8, 48}}) {
    ScanCase sc;
    sc.shape = {.num_heads = 8,
                .head_dim = 64,
                .state_size = 128,
                .num_groups = sh.groups,
                .conv_kernel = 4,
                .chunk_size = sh.chunk};
    SCOPED_TRACE("groups " + std::to_string(sh.groups) + ", chunk " + std::to_string(sh.chunk));
    sc.first = ragged(rng, 7, std::min<int32_t>(sh.chunk, CpuLinearBackend::kMaxChunk), 1000);
    std::uniform_int_distribution<int32_t> ext(1, 300);
    for (size_t i = 0; i < sc.first.size(); ++i) sc.second.push_back(ext(rng));
    run_case(sc, rng);
  }
}

/// Sets OpenBLAS to one thread and OpenMP to `threads` for its lifetime (restored after).
class ScanThreads {
 public:
  explicit ScanThreads(int threads)
      : blas_(openblas_get_num_threads()), omp_(omp_get_max_threads()) {
    openblas_set_num_threads(1);
    omp_set_num_threads(threads);
  }
  ~ScanThreads() {
    openblas_set_num_threads(blas_);
    omp_set_num_threads(omp_);
  }
  ScanThreads(const ScanThreads&) = delete;
  ScanThreads& operator=(const ScanThreads&) = delete;

 private:
  int blas_, omp_;
};

/// With a single-threaded OpenBLAS the scan cuts each group's heads into blocks, at least one per
/// OpenMP thread where the heads allow: 14 heads in 1 group at 1 / 3 / 5 threads are blocks of
/// 14 / 5 + 5 + 4 / 3 + 3 + 3 + 3 + 2 heads, in 2 groups 7 / 4 + 3 / 3 + 3 + 1 per group; each
/// equals the fp64 recurrence.
TEST(CpuLinearScan, HeadBlocksOnTheOpenMpThreadsMatchTheFp64Recurrence) {
  const pagoda::testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  for (const int threads : {1, 3, 5}) {
    const ScanThreads scope(threads);
    for (const int32_t groups : {1, 2}) {
      SCOPED_TRACE(std::to_string(threads) + " threads, " + std::to_string(groups) + " groups");
      ScanCase sc;
      sc.shape = {.num_heads = 14,
                  .head_dim = 32,
                  .state_size = 64,
                  .num_groups = groups,
                  .conv_kernel = 4,
                  .chunk_size = 256};
      sc.first = ragged(rng, 4, CpuLinearBackend::kMaxChunk, 300);
      sc.second = {45, 1, 70, 3};
      run_case(sc, rng);
    }
  }
}

}  // namespace
}  // namespace pagoda::backends
