/// The dense kernels (model/cuda/dense_kernels.h) and the GPU sampler (sampling_kernels.h)
/// against host references written here (f64 math on the same dtype-rounded inputs), on random
/// inputs (the seed is printed; PAGODA_TEST_SEED overrides it) at model sizes (hidden 2048/4096,
/// vocab 128256, rows 1/7/64/300). Outputs are NaN-poisoned before every launch.
///
/// Tolerances: every output is rounded once from f32, so |gpu - ref| <= rel * |ref| + abs with
/// rel = 2^-8 (bf16: 2 x its half-ulp), 2^-10 (f16), 4e-6 (f32) plus a term for the f32 compute
/// error of the op (stated per test). Bit copies (embedding, the f32 residual add) are exact.
/// Sampling: greedy is exact; filtered draws must lie in the host's allowed set; results depend
/// only on (logits, params), not on the batch; frequencies pass a chi-square test at p = 1e-6;
/// the split-row (small batch) and single-block paths give identical ids.
/// Label "gpu": needs a GPU (skips without one).

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <numbers>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_test_common.h"
#include "pagoda/core/float_convert.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/model/cuda/cuda_ops.h"
#include "pagoda/model/cuda/dense_kernels.h"
#include "pagoda/model/cuda/dsa_kernels.h"
#include "pagoda/model/cuda/family_kernels.h"
#include "pagoda/model/cuda/philox.h"
#include "pagoda/model/cuda/sampling_kernels.h"
#include "pagoda/model/cuda/topk_kernels.h"
#include "pagoda/model/logit_processing.h"
#include "pagoda/model/model_ops.h"
#include "pagoda/platform/cuda/cuda_platform.h"
#include "pagoda/platform/platform.h"
#include "test_seed.h"
#include "token_mask_reference.h"

namespace pagoda::model::cuda_kernels {
namespace {

using ::pagoda::gpu_test::have_gpu;
using ::pagoda::gpu_test::test_seed;
#define REQUIRE_GPU() PAGODA_REQUIRE_GPU()

/// Device buffer; poisoned with 0xFF bytes (NaN in f32, f16 and bf16) on request.
struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t n) : bytes(n) {
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 16)), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void poison() { ASSERT_EQ(cudaMemset(p, 0xFF, bytes), cudaSuccess); }
  template <typename T>
  void upload(const std::vector<T>& v) {
    ASSERT_EQ(v.size() * sizeof(T), bytes);
    ASSERT_EQ(cudaMemcpy(p, v.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  template <typename T>
  std::vector<T> download() const {
    std::vector<T> v(bytes / sizeof(T));
    EXPECT_EQ(cudaMemcpy(v.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

const char* name(ActDType t) {
  return t == ActDType::kF32 ? "f32" : t == ActDType::kF16 ? "f16" : "bf16";
}
DType core_dtype(ActDType t) {
  return t == ActDType::kF32 ? DType::kF32 : t == ActDType::kF16 ? DType::kF16 : DType::kBF16;
}
/// Relative rounding tolerance of one rounding to t (2 x half an ulp).
double rel_tol(ActDType t) {
  return t == ActDType::kF32 ? 4e-6 : t == ActDType::kF16 ? 0x1p-10 : 0x1p-8;
}
float round_to(float v, ActDType t) {
  unsigned char b[4];
  write_from_f32(b, core_dtype(t), 0, v);
  return read_as_f32(b, core_dtype(t), 0);
}

/// Host values (already representable in t) and their device encoding.
struct Act {
  ActDType t;
  std::vector<float> v;
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> b(v.size() * static_cast<size_t>(act_dtype_size(t)));
    for (size_t i = 0; i < v.size(); ++i) write_from_f32(b.data(), core_dtype(t), i, v[i]);
    return b;
  }
};

Act random_act(ActDType t, size_t n, std::mt19937_64& rng, float mean = 0.f, float sd = 1.f) {
  std::normal_distribution<float> d(mean, sd);
  Act a{t, std::vector<float>(n)};
  for (auto& x : a.v) x = round_to(d(rng), t);
  return a;
}

std::vector<float> decode(const std::vector<unsigned char>& b, ActDType t, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = read_as_f32(b.data(), core_dtype(t), i);
  return v;
}

std::unique_ptr<Dev> to_device(const Act& a) {
  auto d = std::make_unique<Dev>(a.v.size() * static_cast<size_t>(act_dtype_size(a.t)));
  d->upload(a.bytes());
  return d;
}

/// Counts elements outside tolerance (and prints the first few).
struct Checker {
  std::string what;
  int64_t bad = 0, nan = 0;
  double worst = 0;
  void check(double got, double ref, double tol, int64_t index) {
    if (std::isnan(got)) {
      if (nan++ < 3) ADD_FAILURE() << what << ": NaN at " << index << " (ref " << ref << ")";
      return;
    }
    const double err = std::fabs(got - ref);
    worst = std::max(worst, err / std::max(tol, 1e-30));
    if (err > tol && bad++ < 5)
      ADD_FAILURE() << what << ": index " << index << " got " << got << " ref " << ref
                    << " |err| " << err << " > tol " << tol;
  }
  ~Checker() { EXPECT_EQ(bad + nan, 0) << what << " (worst err/tol " << worst << ")"; }
};

constexpr ActDType kAllTypes[] = {ActDType::kF32, ActDType::kF16, ActDType::kBF16};
constexpr int64_t kRows[] = {1, 7, 64, 300};

// ---------------------------------------------------------------------------------------------
// Dense kernels.

TEST(DenseKernels, EmbedRowsIsABitCopy) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed(101);
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  const int64_t vocab = 1000;
  for (ActDType t : kAllTypes) {
    for (int64_t hidden : {int64_t{2048}, int64_t{4096}, int64_t{1001}}) {
      const Act table = random_act(t, static_cast<size_t>(vocab * hidden), rng);
      auto d_table = to_device(table);
      for (int64_t rows : kRows) {
        SCOPED_TRACE(::testing::Message() << name(t) << " hidden " << hidden << " rows " << rows);
        std::vector<int32_t> ids(static_cast<size_t>(rows));
        for (auto& id : ids) id = static_cast<int32_t>(rng() % vocab);
        Dev d_ids(ids.size() * 4), d_out(static_cast<size_t>(rows * hidden * act_dtype_size(t)));
        d_ids.upload(ids);
        d_out.poison();
        ASSERT_EQ(embed_rows(t, d_table->p, static_cast<int32_t*>(d_ids.p), d_out.p, rows, hidden,
                             nullptr),
                  cudaSuccess);
        const auto out = decode(d_out.download<unsigned char>(), t, size_t(rows * hidden));
        int64_t bad = 0;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < hidden; ++i)
            bad += std::memcmp(&out[r * hidden + i], &table.v[ids[r] * hidden + i], 4) != 0;
        EXPECT_EQ(bad, 0);
      }
    }
  }
}

/// Host RMSNorm of one f32 row (f64 math).
void ref_norm(const float* res, const Act& weight, int64_t hidden, float eps, double* out) {
  double ss = 0;
  for (int64_t i = 0; i < hidden; ++i) ss += double(res[i]) * res[i];
  const double inv = 1.0 / std::sqrt(ss / double(hidden) + double(eps));
  for (int64_t i = 0; i < hidden; ++i) out[i] = double(res[i]) * inv * weight.v[i];
}

// add_rms_norm: residual exact (one f32 add), out within rel_tol + 1e-5 |ref| (f32 sum of
// squares over <= 4096 terms and the f32 products).
TEST(DenseKernels, AddRmsNormMatchesHost) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed(202);
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  const float eps = 1e-5f;
  for (ActDType t : kAllTypes) {
    for (int64_t hidden : {int64_t{2048}, int64_t{4096}, int64_t{1003}}) {
      const Act weight = random_act(t, size_t(hidden), rng, 1.f, 0.2f);
      auto d_w = to_device(weight);
      for (int64_t rows : kRows) {
        for (ResidualOp op : {ResidualOp::kAssign, ResidualOp::kAdd}) {
          for (bool in_place : {false, true}) {
            SCOPED_TRACE(::testing::Message() << name(t) << " hidden " << hidden << " rows " << rows
                                            << " op " << int(op) << " in_place " << in_place);
            const size_t n = size_t(rows * hidden);
            const Act x = random_act(t, n, rng, 0.f, 2.f);
            std::vector<float> res(n);
            std::normal_distribution<float> nd(0.f, 3.f);
            for (auto& v : res) v = nd(rng);
            auto d_x = to_device(x);
            Dev d_res(n * 4), d_out(n * size_t(act_dtype_size(t)));
            if (op == ResidualOp::kAdd) {
              d_res.upload(res);
            } else {
              d_res.poison();
            }
            void* out_ptr = in_place ? d_x->p : d_out.p;
            if (!in_place) d_out.poison();
            ASSERT_EQ(add_rms_norm(t, d_x->p, static_cast<float*>(d_res.p), d_w->p, out_ptr, rows,
                                   hidden, eps, op, nullptr),
                      cudaSuccess);
            const auto got_res = d_res.download<float>();
            const auto got = decode(in_place ? d_x->download<unsigned char>()
                                             : d_out.download<unsigned char>(),
                                    t, n);
            std::vector<float> ref_res(n);
            for (size_t i = 0; i < n; ++i)
              ref_res[i] = op == ResidualOp::kAdd ? res[i] + x.v[i] : x.v[i];
            int64_t res_bad = 0;
            for (size_t i = 0; i < n; ++i)
              res_bad += std::memcmp(&got_res[i], &ref_res[i], 4) != 0;
            EXPECT_EQ(res_bad, 0) << "residual differs from the f32 add";
            Checker c{"add_rms_norm"};
            std::vector<double> ref(static_cast<size_t>(hidden));
            for (int64_t r = 0; r < rows; ++r) {
              ref_norm(&ref_res[size_t(r * hidden)], weight, hidden, eps, ref.data());
              for (int64_t i = 0; i < hidden; ++i)
                c.check(got[size_t(r * hidden + i)], ref[size_t(i)],
                        (rel_tol(t) + 1e-5) * std::fabs(ref[size_t(i)]) + 1e-6, r * hidden + i);
            }
          }
        }
      }
    }
  }
}

TEST(DenseKernels, RmsNormRowsSelectsRows) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed(303);
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  const float eps = 1e-6f;
  const int64_t total_rows = 300;
  for (ActDType t : kAllTypes) {
    for (int64_t hidden : {int64_t{2048}, int64_t{4096}, int64_t{1003}}) {
      const Act weight = random_act(t, size_t(hidden), rng, 1.f, 0.2f);
      auto d_w = to_device(weight);
      std::vector<float> res(size_t(total_rows * hidden));
      std::normal_distribution<float> nd(0.f, 3.f);
      for (auto& v : res) v = nd(rng);
      Dev d_res(res.size() * 4);
      d_res.upload(res);
      for (bool indexed : {true, false}) {
        const int64_t rows = indexed ? 7 : total_rows;
        SCOPED_TRACE(::testing::Message() << name(t) << " hidden " << hidden << " indexed "
                                        << indexed);
        std::vector<int32_t> idx = {299, 0, 17, 17, 150, 298, 1};
        Dev d_idx(idx.size() * 4), d_out(size_t(rows * hidden * act_dtype_size(t)));
        d_idx.upload(idx);
        d_out.poison();
        ASSERT_EQ(rms_norm_rows(t, static_cast<const float*>(d_res.p),
                                indexed ? static_cast<int32_t*>(d_idx.p) : nullptr, d_w->p,
                                d_out.p, rows, hidden, eps, nullptr),
                  cudaSuccess);
        const auto got = decode(d_out.download<unsigned char>(), t, size_t(rows * hidden));
        EXPECT_EQ(d_res.download<float>(), res) << "the residual must not change";
        Checker c{"rms_norm_rows"};
        std::vector<double> ref(static_cast<size_t>(hidden));
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t src = indexed ? idx[size_t(r)] : r;
          ref_norm(&res[size_t(src * hidden)], weight, hidden, eps, ref.data());
          for (int64_t i = 0; i < hidden; ++i)
            c.check(got[size_t(r * hidden + i)], ref[size_t(i)],
                    (rel_tol(t) + 1e-5) * std::fabs(ref[size_t(i)]) + 1e-6, r * hidden + i);
        }
      }
    }
  }
}

// qkv_bias_rope: tolerance rel_tol |ref| + 2e-6 (|a| + |b|) + 1e-6: the angle is the same f32
// product on both sides; sincosf is within 2 ulp; the rotation is f32.
TEST(DenseKernels, QkvBiasRopeMatchesHost) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed(404);
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  struct Shape {
    int hq, hkv, d;
    int64_t rows;
  };
  std::vector<Shape> shapes = {{8, 2, 64, 7},   {8, 2, 128, 64}, {4, 1, 256, 7},
                               {8, 2, 36, 7},   {32, 8, 128, 1}, {32, 8, 128, 300},
                               {14, 2, 64, 64}};
  for (ActDType t : kAllTypes) {
    for (const Shape& s : shapes) {
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(::testing::Message() << name(t) << " hq " << s.hq << " hkv " << s.hkv << " d "
                                        << s.d << " rows " << s.rows << " bias " << with_bias);
        const int heads = s.hq + 2 * s.hkv;
        const int64_t width = int64_t(heads) * s.d;
        const Act qkv = random_act(t, size_t(s.rows * width), rng);
        const Act bias = random_act(t, size_t(width), rng, 0.f, 0.5f);
        std::vector<int32_t> pos(size_t(s.rows));
        for (auto& p : pos) p = static_cast<int32_t>(rng() % 131072);
        std::vector<float> inv_freq(size_t(s.d / 2));
        for (int i = 0; i < s.d / 2; ++i)
          inv_freq[size_t(i)] =
              static_cast<float>(1.0 / std::pow(500000.0, 2.0 * i / static_cast<double>(s.d)));
        auto d_qkv = to_device(qkv);
        auto d_bias = to_device(bias);
        Dev d_pos(pos.size() * 4), d_inv(inv_freq.size() * 4);
        d_pos.upload(pos);
        d_inv.upload(inv_freq);
        const size_t es = size_t(act_dtype_size(t));
        Dev d_q(size_t(s.rows) * s.hq * s.d * es), d_k(size_t(s.rows) * s.hkv * s.d * es),
            d_v(size_t(s.rows) * s.hkv * s.d * es);
        d_q.poison();
        d_k.poison();
        d_v.poison();
        ASSERT_EQ(qkv_bias_rope(t, d_qkv->p, with_bias ? d_bias->p : nullptr,
                                static_cast<int32_t*>(d_pos.p), static_cast<float*>(d_inv.p),
                                d_q.p, d_k.p, d_v.p, s.rows, s.hq, s.hkv, s.d, nullptr),
                  cudaSuccess);
        const auto q = decode(d_q.download<unsigned char>(), t, d_q.bytes / es);
        const auto k = decode(d_k.download<unsigned char>(), t, d_k.bytes / es);
        const auto v = decode(d_v.download<unsigned char>(), t, d_v.bytes / es);
        Checker c{"qkv_bias_rope"};
        const int half = s.d / 2;
        for (int64_t r = 0; r < s.rows; ++r) {
          for (int h = 0; h < heads; ++h) {
            const float* out;
            if (h < s.hq) {
              out = &q[size_t((r * s.hq + h) * s.d)];
            } else if (h < s.hq + s.hkv) {
              out = &k[size_t((r * s.hkv + h - s.hq) * s.d)];
            } else {
              out = &v[size_t((r * s.hkv + h - s.hq - s.hkv) * s.d)];
            }
            for (int i = 0; i < half; ++i) {
              const size_t ia = size_t(r * width + h * s.d + i), ib = ia + size_t(half);
              const double a = double(qkv.v[ia]) + (with_bias ? bias.v[size_t(h * s.d + i)] : 0.0);
              const double b =
                  double(qkv.v[ib]) + (with_bias ? bias.v[size_t(h * s.d + i + half)] : 0.0);
              double ra = a, rb = b;
              if (h < s.hq + s.hkv) {
                const float angle = static_cast<float>(pos[size_t(r)]) * inv_freq[size_t(i)];
                const double cs = std::cos(double(angle)), sn = std::sin(double(angle));
                ra = a * cs - b * sn;
                rb = b * cs + a * sn;
              }
              const double extra = 2e-6 * (std::fabs(a) + std::fabs(b)) + 1e-6;
              c.check(out[i], ra, rel_tol(t) * std::fabs(ra) + extra, r * width + h * s.d + i);
              c.check(out[i + half], rb, rel_tol(t) * std::fabs(rb) + extra,
                      r * width + h * s.d + i + half);
            }
          }
        }
      }
    }
  }
}

// qkv_bias_rope_store: q, and the k/v rows at each token's slot, are bit-identical to
// qkv_bias_rope's outputs and within the QkvBiasRopeMatchesHost tolerance of the host reference;
// every other slot of the NaN-poisoned cache stays NaN. Slots: a random page-scattered
// permutation (slot 0, the padding dummy, among them), plus tokens with slots -1 and num_slots
// (skipped: their q is written, their k/v nowhere).
TEST(DenseKernels, QkvBiasRopeStoreWritesTheCache) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed(414);
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  struct Shape {
    int hq, hkv, d;
    int64_t rows;
  };
  const std::vector<Shape> shapes = {{8, 2, 64, 7},  {32, 8, 128, 1}, {32, 8, 128, 300},
                                     {4, 1, 256, 7}, {8, 2, 36, 9},   {14, 2, 64, 64}};
  const int page_size = 16;
  for (ActDType t : kAllTypes) {
    for (const Shape& s : shapes) {
      for (int variant = 0; variant < 3; ++variant) {  // 0: cache only; 1: + k/v; 2: + bias
        const bool with_bias = variant == 2, with_kv = variant >= 1;
        SCOPED_TRACE(::testing::Message() << name(t) << " hq " << s.hq << " hkv " << s.hkv << " d "
                                        << s.d << " rows " << s.rows << " variant " << variant);
        const int heads = s.hq + 2 * s.hkv;
        const int64_t width = int64_t(heads) * s.d;
        const Act qkv = random_act(t, size_t(s.rows * width), rng);
        const Act bias = random_act(t, size_t(width), rng, 0.f, 0.5f);
        std::vector<int32_t> pos(size_t(s.rows));
        for (auto& p : pos) p = static_cast<int32_t>(rng() % 131072);
        std::vector<float> inv_freq(size_t(s.d / 2));
        for (int i = 0; i < s.d / 2; ++i)
          inv_freq[size_t(i)] =
              static_cast<float>(1.0 / std::pow(500000.0, 2.0 * i / static_cast<double>(s.d)));
        // 3 rows' worth of pages beyond the tokens, so most slots stay untouched.
        const int64_t num_pages = (3 * s.rows + page_size - 1) / page_size + 1;
        const int64_t num_slots = (num_pages + 1) * page_size;
        std::vector<int32_t> perm(static_cast<size_t>(num_slots));
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        std::vector<int32_t> slots(perm.begin(), perm.begin() + s.rows);
        if (s.rows > 2) {
          auto zero = std::find(slots.begin(), slots.end(), 0);  // keep the slots distinct
          if (zero != slots.end()) {
            std::iter_swap(zero, slots.begin() + 1);
          } else {
            slots[1] = 0;  // the padding dummy
          }
          slots[0] = -1;                                       // out of range: skipped
          slots[size_t(s.rows - 1)] = static_cast<int32_t>(num_slots);
        }
        auto d_qkv = to_device(qkv);
        auto d_bias = to_device(bias);
        Dev d_pos(pos.size() * 4), d_inv(inv_freq.size() * 4), d_slots(slots.size() * 4);
        d_pos.upload(pos);
        d_inv.upload(inv_freq);
        d_slots.upload(slots);
        const size_t es = size_t(act_dtype_size(t));
        const size_t qn = size_t(s.rows) * s.hq * s.d, kvn = size_t(s.rows) * s.hkv * s.d;
        const size_t cache_n = size_t(num_slots) * s.hkv * s.d;
        Dev d_q(qn * es), d_k(kvn * es), d_v(kvn * es);  // reference: qkv_bias_rope
        Dev d_q2(qn * es), d_k2(kvn * es), d_v2(kvn * es);
        Dev d_kc(cache_n * es), d_vc(cache_n * es);
        for (Dev* d : {&d_q, &d_k, &d_v, &d_q2, &d_k2, &d_v2, &d_kc, &d_vc}) d->poison();
        const void* b = with_bias ? d_bias->p : nullptr;
        ASSERT_EQ(qkv_bias_rope(t, d_qkv->p, b, static_cast<int32_t*>(d_pos.p),
                                static_cast<float*>(d_inv.p), d_q.p, d_k.p, d_v.p, s.rows, s.hq,
                                s.hkv, s.d, nullptr),
                  cudaSuccess);
        const KvCacheWrite cache{d_kc.p, d_vc.p, static_cast<int32_t*>(d_slots.p), num_slots};
        ASSERT_EQ(qkv_bias_rope_store(t, d_qkv->p, b, static_cast<int32_t*>(d_pos.p),
                                      static_cast<float*>(d_inv.p), d_q2.p,
                                      with_kv ? d_k2.p : nullptr, with_kv ? d_v2.p : nullptr,
                                      cache, s.rows, s.hq, s.hkv, s.d, nullptr),
                  cudaSuccess);
        const auto q = d_q.download<unsigned char>(), k = d_k.download<unsigned char>(),
                   v = d_v.download<unsigned char>();
        EXPECT_TRUE(d_q2.download<unsigned char>() == q) << "q differs from qkv_bias_rope";
        if (with_kv) {
          EXPECT_TRUE(d_k2.download<unsigned char>() == k) << "k differs from qkv_bias_rope";
          EXPECT_TRUE(d_v2.download<unsigned char>() == v) << "v differs from qkv_bias_rope";
        } else {
          const auto k2 = d_k2.download<unsigned char>(), v2 = d_v2.download<unsigned char>();
          EXPECT_TRUE(std::all_of(k2.begin(), k2.end(), [](unsigned char c) { return c == 0xFF; }))
              << "null k must not be written";
          EXPECT_TRUE(std::all_of(v2.begin(), v2.end(), [](unsigned char c) { return c == 0xFF; }))
              << "null v must not be written";
        }
        const auto kc = d_kc.download<unsigned char>(), vc = d_vc.download<unsigned char>();
        const size_t row_bytes = size_t(s.hkv) * s.d * es;
        std::vector<int64_t> owner(size_t(num_slots), -1);  // token written to each slot
        for (int64_t r = 0; r < s.rows; ++r) {
          const int32_t sl = slots[size_t(r)];
          if (sl >= 0 && sl < num_slots) owner[size_t(sl)] = r;
        }
        int64_t bad_written = 0, bad_untouched = 0;
        for (int64_t sl = 0; sl < num_slots; ++sl) {
          const int64_t r = owner[size_t(sl)];
          for (const auto* pair : {&kc, &vc}) {
            const unsigned char* got = pair->data() + size_t(sl) * row_bytes;
            if (r >= 0) {
              const unsigned char* ref = (pair == &kc ? k : v).data() + size_t(r) * row_bytes;
              bad_written += std::memcmp(got, ref, row_bytes) != 0;
            } else {
              bad_untouched += !std::all_of(got, got + row_bytes,
                                            [](unsigned char c) { return c == 0xFF; });
            }
          }
        }
        EXPECT_EQ(bad_written, 0) << "cache rows differ from qkv_bias_rope's k/v";
        EXPECT_EQ(bad_untouched, 0) << "slots without a token were written";
        // The cache rows against the host reference.
        const auto kcf = decode(kc, t, cache_n), vcf = decode(vc, t, cache_n);
        Checker c{"qkv_bias_rope_store"};
        const int half = s.d / 2;
        for (int64_t r = 0; r < s.rows; ++r) {
          const int64_t sl = slots[size_t(r)];
          if (sl < 0 || sl >= num_slots) continue;
          for (int h = s.hq; h < heads; ++h) {
            const bool is_k = h < s.hq + s.hkv;
            const int kh = is_k ? h - s.hq : h - s.hq - s.hkv;
            const float* out = &(is_k ? kcf : vcf)[size_t((sl * s.hkv + kh) * s.d)];
            for (int i = 0; i < half; ++i) {
              const size_t ia = size_t(r * width + h * s.d + i), ib = ia + size_t(half);
              const double a = double(qkv.v[ia]) + (with_bias ? bias.v[size_t(h * s.d + i)] : 0.0);
              const double bb =
                  double(qkv.v[ib]) + (with_bias ? bias.v[size_t(h * s.d + i + half)] : 0.0);
              double ra = a, rb = bb;
              if (is_k) {
                const float angle = static_cast<float>(pos[size_t(r)]) * inv_freq[size_t(i)];
                const double cs = std::cos(double(angle)), sn = std::sin(double(angle));
                ra = a * cs - bb * sn;
                rb = bb * cs + a * sn;
              }
              const double extra = 2e-6 * (std::fabs(a) + std::fabs(bb)) + 1e-6;
              c.check(out[i], ra, rel_tol(t) * std::fabs(ra) + extra, r * width + h * s.d + i);
              c.check(out[i + half], rb, rel_tol(t) * std::fabs(rb) + extra,
                      r * width + h * s.d + i + half);
            }
          }
        }
      }
    }
  }
}

TEST(DenseKernels, QkvBiasRopeStoreRejectsBadArgs) {
  REQUIRE_GPU();
  const KvCacheWrite none{nullptr, nullptr, nullptr, 0};
  EXPECT_EQ(qkv_bias_rope_store(ActDType::kBF16, nullptr, nullptr, nullptr, nullptr, nullptr,
                                nullptr, nullptr, none, 1, 8, 2, 128, nullptr),
            cudaErrorInvalidValue);  // null cache
  EXPECT_EQ(qkv_bias_rope_store(ActDType::kBF16, nullptr, nullptr, nullptr, nullptr, nullptr,
                                nullptr, nullptr, none, 1, 8, 2, 127, nullptr),
            cudaErrorInvalidValue);  // odd head_dim
  EXPECT_EQ(qkv_bias_rope_store(ActDType::kBF16, nullptr, nullptr, nullptr, nullptr, nullptr,
                                nullptr, nullptr, none, 0, 8, 2, 128, nullptr),
            cudaSuccess);  // nothing to do
}

// silu_mul: tolerance rel_tol |ref| + 1e-6 |ref| + 1e-7 (expf, one division, one product in f32).
TEST(DenseKernels, SiluMulMatchesHost) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed(505);
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  for (ActDType t : kAllTypes) {
    for (int64_t inter : {int64_t{14336}, int64_t{1000}, int64_t{1001}}) {
      for (int64_t rows : kRows) {
        SCOPED_TRACE(::testing::Message() << name(t) << " inter " << inter << " rows " << rows);
        const Act gu = random_act(t, size_t(rows * 2 * inter), rng, 0.f, 3.f);
        auto d_gu = to_device(gu);
        const size_t es = size_t(act_dtype_size(t));
        Dev d_out(size_t(rows * inter) * es);
        d_out.poison();
        ASSERT_EQ(silu_mul(t, d_gu->p, d_out.p, rows, inter, nullptr), cudaSuccess);
        const auto got = decode(d_out.download<unsigned char>(), t, size_t(rows * inter));
        Checker c{"silu_mul"};
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t i = 0; i < inter; ++i) {
            const double g = gu.v[size_t(r * 2 * inter + i)];
            const double u = gu.v[size_t(r * 2 * inter + inter + i)];
            const double ref = g / (1.0 + std::exp(-g)) * u;
            c.check(got[size_t(r * inter + i)], ref, (rel_tol(t) + 1e-6) * std::fabs(ref) + 1e-7,
                    r * inter + i);
          }
        }
      }
    }
  }
}

// Gemma's ops (family_kernels.h), f64 host references: scale (one product: rel_tol), GeGLU
// (tanhf and a few products: (rel_tol + 1e-6) |ref| + 1e-7), and the in-place per-group RMSNorm
// of q heads inside a fused qkv row (Gemma 3 shapes: 4 + 1 heads of 256 in a row of 6 heads)
// and of whole hidden rows (2304): (rel_tol + 1e-5) |ref| + 1e-6. Elements outside the groups
// must be left as they were.
TEST(DenseKernels, GemmaOpsMatchHost) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed(707);
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  for (ActDType t : kAllTypes) {
    const size_t es = size_t(act_dtype_size(t));
    for (int64_t rows : kRows) {
      SCOPED_TRACE(::testing::Message() << name(t) << " rows " << rows);
      {  // scale
        const int64_t n = rows * 2304;
        const Act x = random_act(t, size_t(n), rng);
        auto d = to_device(x);
        ASSERT_EQ(scale_inplace(t, d->p, n, 48.f, nullptr), cudaSuccess);
        const auto got = decode(d->download<unsigned char>(), t, size_t(n));
        Checker c{"scale"};
        for (int64_t i = 0; i < n; ++i) {
          const double ref = double(x.v[size_t(i)]) * 48.0;
          c.check(got[size_t(i)], ref, rel_tol(t) * std::fabs(ref), i);
        }
      }
      {  // gelu_tanh_mul
        const int64_t inter = 6912;
        const Act gu = random_act(t, size_t(rows * 2 * inter), rng, 0.f, 3.f);
        auto d_gu = to_device(gu);
        Dev d_out(size_t(rows * inter) * es);
        d_out.poison();
        ASSERT_EQ(gelu_tanh_mul(t, d_gu->p, d_out.p, rows, inter, nullptr), cudaSuccess);
        const auto got = decode(d_out.download<unsigned char>(), t, size_t(rows * inter));
        Checker c{"gelu_tanh_mul"};
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t i = 0; i < inter; ++i) {
            const double g = gu.v[size_t(r * 2 * inter + i)];
            const double u = gu.v[size_t(r * 2 * inter + inter + i)];
            const double k = std::sqrt(2.0 / std::numbers::pi);
            const double gelu = 0.5 * g * (1.0 + std::tanh(k * (g + 0.044715 * g * g * g)));
            const double ref = gelu * u;
            c.check(got[size_t(r * inter + i)], ref, (rel_tol(t) + 1e-6) * std::fabs(ref) + 1e-7,
                    r * inter + i);
          }
        }
      }
      // rms_norm_groups: (row_stride, groups, dim) = q heads of a qkv row, and whole rows.
      for (const auto& [stride, groups, dim] :
           {std::tuple<int64_t, int64_t, int64_t>{6 * 256, 4, 256}, {2304, 1, 2304}}) {
        const Act x = random_act(t, size_t(rows * stride), rng, 0.5f, 2.f);
        const Act w = random_act(t, size_t(dim), rng, 1.f, 0.3f);
        auto d_x = to_device(x);
        auto d_w = to_device(w);
        ASSERT_EQ(rms_norm_groups(t, d_x->p, rows, stride, groups, dim, d_w->p, 1e-6f, nullptr),
                  cudaSuccess);
        const auto got = decode(d_x->download<unsigned char>(), t, size_t(rows * stride));
        Checker c{"rms_norm_groups"};
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t g = 0; g < groups; ++g) {
            const int64_t base = r * stride + g * dim;
            double ss = 0;
            for (int64_t i = 0; i < dim; ++i)
              ss += double(x.v[size_t(base + i)]) * x.v[size_t(base + i)];
            const double inv = 1.0 / std::sqrt(ss / double(dim) + 1e-6);
            for (int64_t i = 0; i < dim; ++i) {
              const double ref = double(x.v[size_t(base + i)]) * inv * w.v[size_t(i)];
              c.check(got[size_t(base + i)], ref, (rel_tol(t) + 1e-5) * std::fabs(ref) + 1e-6,
                      base + i);
            }
          }
          for (int64_t i = groups * dim; i < stride; ++i)  // k/v heads untouched
            c.check(got[size_t(r * stride + i)], x.v[size_t(r * stride + i)], 0.0, r * stride + i);
        }
      }
    }
  }
}

// rope_interleaved (family_kernels.h) against the host op itself (the CPU ModelOps, f32) on the
// same dtype-rounded inputs, at DeepSeek-V2-Lite's shapes (the q_pe parts of 16 heads of 192 in a
// q row, the k_pe tail of a 576 latent row) and an odd one (3 groups of 17 in 20: an odd last
// element, gaps), with factor 1 and a YaRN cos/sin scale. Tolerance rel_tol |ref| + 2e-6 f (|a| +
// |b|) + 1e-6: the angle is the same f32 product on both sides, sincosf is within 2 ulp of the
// host's cosf / sinf, the rest is the same f32 ops. Everything outside the pairs is untouched.
TEST(DenseKernels, RopeInterleavedMatchesHostOp) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed(5050);
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  auto cpu_platform = platform::make_cpu_platform();
  auto host = make_cpu_ops(*cpu_platform, DType::kF32);
  struct Shape {
    int64_t row_stride, offset, groups, group_stride, dim;
  };
  const Shape shapes[] = {{16 * 192, 128, 16, 192, 64}, {576, 512, 1, 0, 64}, {64, 3, 3, 20, 17}};
  for (ActDType t : kAllTypes) {
    const size_t es = size_t(act_dtype_size(t));
    for (const Shape& s : shapes) {
      for (int64_t rows : kRows) {
        for (float factor : {1.f, 1.3689f}) {
          SCOPED_TRACE(::testing::Message() << name(t) << " row_stride " << s.row_stride
                                            << " groups " << s.groups << " dim " << s.dim
                                            << " rows " << rows << " factor " << factor);
          const int64_t n = rows * s.row_stride;
          const Act x = random_act(t, size_t(n), rng);
          std::vector<int32_t> pos(static_cast<size_t>(rows));
          for (auto& p : pos) p = static_cast<int32_t>(rng() % 131072);
          std::vector<float> inv_freq(size_t(s.dim / 2));
          for (size_t i = 0; i < inv_freq.size(); ++i)
            inv_freq[i] = static_cast<float>(
                std::pow(10000.0, -2.0 * double(i) / double(s.dim)) /
                (1.0 + 3.0 * std::uniform_real_distribution<double>(0, 1)(rng)));
          auto d_x = to_device(x);
          Dev d_pos(pos.size() * 4), d_inv(std::max<size_t>(inv_freq.size(), 1) * 4);
          d_pos.upload(pos);
          if (!inv_freq.empty()) d_inv.upload(inv_freq);
          ASSERT_EQ(rope_interleaved(t, static_cast<unsigned char*>(d_x->p) + s.offset * es,
                                     rows, s.row_stride, s.groups, s.group_stride, s.dim,
                                     static_cast<int32_t*>(d_pos.p),
                                     static_cast<float*>(d_inv.p), factor, nullptr),
                    cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const auto got = decode(d_x->download<unsigned char>(), t, size_t(n));
          std::vector<float> ref = x.v;
          host->rope_interleaved(ref.data() + s.offset, rows, s.row_stride, s.groups,
                                 s.group_stride, s.dim, pos.data(), inv_freq.data(), factor);
          std::vector<int64_t> pair_of(size_t(n), -1);  // the index of each element's pair
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t g = 0; g < s.groups; ++g)
              for (int64_t i = 0; i < s.dim / 2 * 2; ++i) {
                const int64_t base = r * s.row_stride + s.offset + g * s.group_stride;
                pair_of[size_t(base + i)] = base + (i & ~int64_t{1});
              }
          Checker c{"rope_interleaved"};
          for (int64_t e = 0; e < n; ++e) {
            const int64_t pair = pair_of[size_t(e)];
            if (pair < 0) {  // bit-for-bit the input
              c.check(got[size_t(e)], x.v[size_t(e)], 0.0, e);
              continue;
            }
            const double ab = std::fabs(double(x.v[size_t(pair)])) +
                              std::fabs(double(x.v[size_t(pair + 1)]));
            const double ref_e = ref[size_t(e)];
            c.check(got[size_t(e)], ref_e,
                    rel_tol(t) * std::fabs(ref_e) + 2e-6 * factor * ab + 1e-6, e);
          }
        }
      }
    }
  }
}

// The DSA indexer's ops (dsa_kernels.h) at DeepSeek-V3.2's shapes (index_head_dim 128, RoPE on
// its first 64 dims, 64 query heads) on kRows rows:
// - store_index_keys writes kv::quantize_index_key's row bit for bit into a 0xFF-poisoned
//   buffer at shuffled slots (every other slot untouched), on keys with random per-row
//   magnitudes (scales from 2^-20 to 2^12), an all-zero key and keys whose amax / 448 is an
//   exact power of two (the scale's edge);
// - layer_norm_f32 against the CPU op (f64 statistics) within 3e-5 (|w x̂| + |b|) + 1e-6 (f32
//   sums over 128 terms, two passes);
// - rope_neox_f32 against the CPU op within 2e-6 factor (|a| + |b|) + 1e-6 (rope_interleaved's
//   bound: the same f32 products, sincosf within 2 ulp), dims past the RoPE part bit for bit.
TEST(DenseKernels, DsaIndexerOpsMatchHostOps) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed(5151);
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  auto cpu_platform = platform::make_cpu_platform();
  auto host = make_cpu_ops(*cpu_platform, DType::kF32);
  constexpr int64_t kDim = 128, kRope = 64, kHeads = 64;
  std::normal_distribution<float> normal(0.f, 1.f);
  for (int64_t rows : kRows) {
    SCOPED_TRACE(::testing::Message() << "rows " << rows);
    // store_index_keys.
    std::vector<float> k(size_t(rows * kDim));
    for (int64_t r = 0; r < rows; ++r) {
      const float mag = std::ldexp(1.f, static_cast<int>(rng() % 33) - 20);
      for (int64_t j = 0; j < kDim; ++j) k[size_t(r * kDim + j)] = normal(rng) * mag;
      if (r % 5 == 3) {  // amax / 448 an exact power of two: small values and one of 448 · 2^e
        for (int64_t j = 0; j < kDim; ++j) k[size_t(r * kDim + j)] = normal(rng) / 64.f;
        const float edge = 448.f * std::ldexp(1.f, static_cast<int>(rng() % 9) - 4);
        k[size_t(r * kDim + int64_t(rng() % kDim))] = (rng() & 1) ? edge : -edge;
      }
      if (r == rows - 1 && rows > 1)
        std::fill_n(k.begin() + r * kDim, kDim, 0.f);  // an all-zero key
    }
    const int64_t slots = rows * 3 + 5, row_bytes = kDim + 4;
    std::vector<int32_t> loc(static_cast<size_t>(slots));
    std::iota(loc.begin(), loc.end(), 0);
    std::shuffle(loc.begin(), loc.end(), rng);
    loc.resize(size_t(rows));
    Dev d_k(k.size() * 4), d_loc(loc.size() * 4), d_rows(size_t(slots * row_bytes));
    d_k.upload(k);
    d_loc.upload(loc);
    d_rows.poison();
    ASSERT_EQ(store_index_keys(static_cast<float*>(d_k.p), static_cast<int32_t*>(d_loc.p), rows,
                               kDim, d_rows.p, row_bytes, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got_rows = d_rows.download<uint8_t>();
    std::vector<uint8_t> want_rows(size_t(slots * row_bytes), 0xFF);
    for (int64_t r = 0; r < rows; ++r)
      kv::quantize_index_key(k.data() + r * kDim, kDim,
                             want_rows.data() + int64_t(loc[size_t(r)]) * row_bytes);
    int64_t differ = 0;
    for (size_t i = 0; i < got_rows.size(); ++i) differ += got_rows[i] != want_rows[i];
    EXPECT_EQ(differ, 0) << "index-row bytes differing from kv::quantize_index_key";

    // layer_norm_f32.
    std::vector<float> x(static_cast<size_t>(rows * kDim)), w(static_cast<size_t>(kDim)),
        b(static_cast<size_t>(kDim));
    for (auto& v : x) v = normal(rng) * 3.f + 0.5f;
    for (auto& v : w) v = 1.f + 0.1f * normal(rng);
    for (auto& v : b) v = 0.1f * normal(rng);
    Dev d_x(x.size() * 4), d_w(w.size() * 4), d_b(b.size() * 4);
    d_x.upload(x);
    d_w.upload(w);
    d_b.upload(b);
    ASSERT_EQ(layer_norm_f32(static_cast<float*>(d_x.p), rows, kDim, static_cast<float*>(d_w.p),
                             static_cast<float*>(d_b.p), 1e-6f, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got_ln = d_x.download<float>();
    std::vector<float> ref_ln = x;
    host->layer_norm_f32(ref_ln.data(), rows, kDim, w.data(), b.data(), 1e-6f);
    Checker ln{"layer_norm_f32"};
    for (int64_t e = 0; e < rows * kDim; ++e) {
      const int64_t j = e % kDim;
      const double xhat = (double(ref_ln[size_t(e)]) - b[size_t(j)]) / w[size_t(j)];
      ln.check(got_ln[size_t(e)], ref_ln[size_t(e)],
               3e-5 * (std::fabs(w[size_t(j)] * xhat) + std::fabs(b[size_t(j)])) + 1e-6, e);
    }

    // rope_neox_f32 on keys (1 group) and queries (kHeads groups).
    for (int64_t groups : {int64_t{1}, kHeads}) {
      for (float factor : {1.f, 1.3689f}) {
        SCOPED_TRACE(::testing::Message() << "groups " << groups << " factor " << factor);
        std::vector<float> v(static_cast<size_t>(rows * groups * kDim));
        for (auto& e : v) e = normal(rng);
        std::vector<int32_t> pos(static_cast<size_t>(rows));
        for (auto& p : pos) p = static_cast<int32_t>(rng() % 131072);
        std::vector<float> inv_freq(static_cast<size_t>(kRope / 2));
        for (size_t i = 0; i < inv_freq.size(); ++i)
          inv_freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * double(i) / double(kRope)));
        Dev d_v(v.size() * 4), d_pos(pos.size() * 4), d_inv(inv_freq.size() * 4);
        d_v.upload(v);
        d_pos.upload(pos);
        d_inv.upload(inv_freq);
        ASSERT_EQ(rope_neox_f32(static_cast<float*>(d_v.p), rows, groups, kDim, kRope,
                                static_cast<int32_t*>(d_pos.p), static_cast<float*>(d_inv.p),
                                factor, nullptr),
                  cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto got = d_v.download<float>();
        std::vector<float> ref = v;
        host->rope_neox_f32(ref.data(), rows, groups, kDim, kRope, pos.data(), inv_freq.data(),
                            factor);
        Checker c{"rope_neox_f32"};
        for (int64_t e = 0; e < int64_t(v.size()); ++e) {
          const int64_t d = e % kDim;
          if (d >= kRope) {  // bit-for-bit the input
            c.check(got[size_t(e)], v[size_t(e)], 0.0, e);
            continue;
          }
          const int64_t i = d % (kRope / 2), base = e - d;
          const double ab = std::fabs(double(v[size_t(base + i)])) +
                            std::fabs(double(v[size_t(base + i + kRope / 2)]));
          c.check(got[size_t(e)], ref[size_t(e)],
                  2e-6 * factor * ab + 1e-6 + 4e-6 * std::fabs(double(ref[size_t(e)])), e);
        }
      }
    }
  }
}

// CudaOps::linear_groups (MLA's per-head W_UK / W_UV projections as one strided-batched cuBLAS
// GEMM) against an f64 triple loop over the same (dtype-rounded) values, at DeepSeek's shapes
// (16 heads; 128 -> 512 into rows of 576 with the rope columns left alone, and 512 -> 128):
// within the dtype's rounding of the output plus f32 accumulation; y's other columns keep their
// poison.
TEST(DenseKernels, LinearGroupsMatchesAnF64Reference) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed(6161);
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto gpu = platform::make_cuda_platform();
  struct Shape {
    int64_t n, k, x_group, y_group;
  };
  constexpr int64_t kGroups = 16;
  for (const DType dt : {DType::kBF16, DType::kF32}) {
    auto ops = model::make_cuda_ops(*gpu, dt);
    const size_t es = dtype_size(dt);
    for (const Shape sh : {Shape{512, 128, 192, 576}, Shape{128, 512, 512, 128}}) {
      for (int64_t m : kRows) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dt) << " n " << sh.n << " k " << sh.k << " rows " << m);
        const int64_t x_pitch = kGroups * sh.x_group, y_pitch = kGroups * sh.y_group;
        std::vector<float> x(size_t(m * x_pitch)), w(size_t(kGroups * sh.n * sh.k));
        auto rounded = [&](float v) {  // v as dtype dt holds it
          uint8_t b[8];
          write_from_f32(b, dt, 0, v);
          return read_as_f32(b, dt, 0);
        };
        for (auto& v : x) v = rounded(normal(rng));
        for (auto& v : w) v = rounded(normal(rng) / 16.f);
        std::vector<uint8_t> xb(x.size() * es), wb(w.size() * es);
        for (size_t i = 0; i < x.size(); ++i) write_from_f32(xb.data(), dt, i, x[i]);
        for (size_t i = 0; i < w.size(); ++i) write_from_f32(wb.data(), dt, i, w[i]);
        Dev d_x(xb.size()), d_w(wb.size()), d_y(size_t(m * y_pitch) * es);
        d_x.upload(xb);
        d_w.upload(wb);
        d_y.poison();
        ops->linear_groups(d_x.p, x_pitch, sh.x_group, d_w.p, d_y.p, y_pitch, sh.y_group, m, sh.n,
                           sh.k, kGroups);
        gpu->synchronize_stream();
        const auto yb = d_y.download<uint8_t>();
        Checker c{"linear_groups"};
        const double unit = dt == DType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -23);
        for (int64_t t = 0; t < m; ++t)
          for (int64_t g = 0; g < kGroups; ++g)
            for (int64_t j = 0; j < sh.y_group; ++j) {
              const size_t at = size_t(t * y_pitch + g * sh.y_group + j);
              const float got = read_as_f32(yb.data(), dt, at);
              if (j >= sh.n) {  // not the group's output: untouched
                if (!std::isnan(got))
                  ADD_FAILURE() << "column " << j << " of group " << g << " written (" << got
                                << ")";
                continue;
              }
              double ref = 0, mag = 0;
              for (int64_t i = 0; i < sh.k; ++i) {
                const double a = x[size_t(t * x_pitch + g * sh.x_group + i)];
                const double b = w[size_t((g * sh.n + j) * sh.k + i)];
                ref += a * b;
                mag += std::fabs(a * b);
              }
              c.check(got, ref, unit * std::fabs(ref) + 1e-6 * mag + 1e-30, int64_t(at));
            }
      }
    }
  }
}

// ModelOps::merge_attention (mla_kernels.h) on the CUDA ops: three windows' states of random
// outputs (rounded to the dtype) and base-2 LSEs merged in turn, against an f64 softmax-weighted
// sum written from the definition: every state within 4 f32 roundings, the last window's `out`
// within one rounding of the dtype more. Some states are -inf in one window (no key seen: out
// 0), one in every window (0 and -inf out). The accumulators start NaN-poisoned.
TEST(DenseKernels, MergeAttentionMatchesTheSoftmaxWeightedSum) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed(7117);
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto gpu = platform::make_cuda_platform();
  constexpr int64_t kRowsM = 37, kHeads = 16, kDv = 128, kWindows = 3;
  constexpr int64_t kStates = kRowsM * kHeads;
  for (const DType dt : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(dtype_name(dt));
    auto ops = model::make_cuda_ops(*gpu, dt);
    const size_t es = dtype_size(dt);
    std::vector<std::vector<float>> o(kWindows, std::vector<float>(size_t(kStates * kDv)));
    std::vector<std::vector<float>> lse(kWindows, std::vector<float>(size_t(kStates)));
    for (int64_t w = 0; w < kWindows; ++w)
      for (int64_t st = 0; st < kStates; ++st) {
        const bool empty = st == 5 || (st % 7 == w);  // state 5: no key in any window
        lse[w][size_t(st)] = empty ? -INFINITY : 4.f * normal(rng);
        for (int64_t d = 0; d < kDv; ++d) {
          uint8_t b[8];
          write_from_f32(b, dt, 0, empty ? 0.f : normal(rng));
          o[w][size_t(st * kDv + d)] = read_as_f32(b, dt, 0);
        }
      }
    Dev d_acc(size_t(kStates * kDv) * 4), d_acc_lse(size_t(kStates) * 4),
        d_part(size_t(kStates * kDv) * es), d_lse(size_t(kStates) * 4),
        d_out(size_t(kStates * kDv) * es);
    d_acc.poison();
    d_acc_lse.poison();
    d_out.poison();
    for (int64_t w = 0; w < kWindows; ++w) {
      std::vector<uint8_t> pb(size_t(kStates * kDv) * es);
      for (size_t i = 0; i < o[w].size(); ++i) write_from_f32(pb.data(), dt, i, o[w][i]);
      d_part.upload(pb);
      d_lse.upload(lse[w]);
      ops->merge_attention(d_part.p, static_cast<const float*>(d_lse.p),
                           static_cast<float*>(d_acc.p), static_cast<float*>(d_acc_lse.p),
                           w + 1 == kWindows ? d_out.p : nullptr, kRowsM, kHeads, kDv, w == 0);
    }
    gpu->synchronize_stream();
    const auto acc = d_acc.download<float>(), acc_lse = d_acc_lse.download<float>();
    const auto ob = d_out.download<uint8_t>();
    Checker c{"merge_attention"}, cl{"merge_attention lse"}, co{"merge_attention out"};
    const double out_unit = dt == DType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -23);
    for (int64_t st = 0; st < kStates; ++st) {
      double m = -INFINITY;
      for (int64_t w = 0; w < kWindows; ++w) m = std::max(m, double(lse[w][size_t(st)]));
      if (m == -INFINITY) {  // no key anywhere
        EXPECT_EQ(acc_lse[size_t(st)], -INFINITY) << st;
        for (int64_t d = 0; d < kDv; ++d) {
          EXPECT_EQ(acc[size_t(st * kDv + d)], 0.f) << st;
          EXPECT_EQ(read_as_f32(ob.data(), dt, size_t(st * kDv + d)), 0.f) << st;
        }
        continue;
      }
      double sum = 0;
      for (int64_t w = 0; w < kWindows; ++w) sum += std::exp2(double(lse[w][size_t(st)]) - m);
      cl.check(acc_lse[size_t(st)], m + std::log2(sum), 1e-5 * (std::fabs(m) + 1), st);
      for (int64_t d = 0; d < kDv; ++d) {
        double ref = 0, mag = 0;
        for (int64_t w = 0; w < kWindows; ++w) {
          const double weight = std::exp2(double(lse[w][size_t(st)]) - m) / sum;
          ref += weight * o[w][size_t(st * kDv + d)];
          mag += weight * std::fabs(o[w][size_t(st * kDv + d)]);
        }
        const size_t at = size_t(st * kDv + d);
        c.check(acc[at], ref, 4 * std::ldexp(1.0, -23) * mag * 8 + 1e-30, int64_t(at));
        co.check(read_as_f32(ob.data(), dt, at), ref,
                 out_unit * std::fabs(ref) + 32 * std::ldexp(1.0, -23) * mag + 1e-30, int64_t(at));
      }
    }
  }
}

// The Mamba2 mixer's ops (family_kernels.h) against the CPU ops: gated_rms_norm (z rows strided
// inside projection rows, 1 and 2 norm groups) within one rounding plus 2e-5 · |ref| (exp and
// the sum of squares in another order), add_bias within one rounding of the f32 sum.
TEST(DenseKernels, MambaOpsMatchHostOps) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed(4949);
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  auto cpu_platform = platform::make_cpu_platform();
  auto host = make_cpu_ops(*cpu_platform, DType::kF32);
  const int64_t dim = 256, z_stride = 3 * dim + 40;
  for (ActDType t : kAllTypes) {
    for (int64_t groups : {1, 2}) {
      for (int64_t rows : {int64_t{1}, int64_t{7}, int64_t{300}}) {
        SCOPED_TRACE(::testing::Message() << name(t) << " groups " << groups << " rows " << rows);
        const Act y = random_act(ActDType::kF32, size_t(rows * dim), rng);
        const Act z = random_act(ActDType::kF32, size_t(rows * z_stride), rng, 0.f, 2.f);
        const Act w = random_act(ActDType::kF32, size_t(dim), rng, 1.f, 0.3f);
        const Act bias = random_act(ActDType::kF32, size_t(dim), rng);
        auto d_y = to_device(y), d_z = to_device(z), d_w = to_device(w), d_b = to_device(bias);
        Dev d_out(size_t(rows * dim * act_dtype_size(t)));
        d_out.poison();
        ASSERT_EQ(gated_rms_norm(t, static_cast<float*>(d_y->p), static_cast<float*>(d_z->p),
                                 z_stride, static_cast<float*>(d_w->p), d_out.p, rows, dim,
                                 groups, 1e-6f, nullptr),
                  cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<float> ref(size_t(rows * dim));
        host->gated_rms_norm(y.v.data(), z.v.data(), z_stride, w.v.data(), ref.data(), rows, dim,
                             groups, 1e-6f);
        const auto got = decode(d_out.download<unsigned char>(), t, size_t(rows * dim));
        {
          Checker c{"gated_rms_norm"};
          for (size_t i = 0; i < ref.size(); ++i)
            c.check(got[i], ref[i], (rel_tol(t) + 2e-5) * std::fabs(ref[i]) + 1e-6, int64_t(i));
        }
        // add_bias on the normed rows (in t), in place.
        ASSERT_EQ(add_bias_rows(t, d_out.p, static_cast<float*>(d_b->p), rows, dim, nullptr),
                  cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto biased = decode(d_out.download<unsigned char>(), t, size_t(rows * dim));
        Checker c{"add_bias_rows"};
        for (size_t i = 0; i < ref.size(); ++i) {
          const double want = double(got[i]) + double(bias.v[i % size_t(dim)]);
          c.check(biased[i], want, rel_tol(t) * std::fabs(want) + 1e-7, int64_t(i));
        }
      }
    }
  }
}

// logits_to_f32_softcap: exact without a cap; with one, within 1e-6 |ref| + 1e-6 (tanhf).
TEST(DenseKernels, LogitsToF32SoftCap) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed(606);
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  const int64_t vocab = 128256;
  for (ActDType t : kAllTypes) {
    for (int64_t n : {int64_t{7} * vocab, int64_t{1001}}) {
      for (float cap : {0.f, 30.f}) {
        SCOPED_TRACE(::testing::Message() << name(t) << " n " << n << " cap " << cap);
        const Act in = random_act(t, size_t(n), rng, 0.f, 20.f);
        auto d_in = to_device(in);
        Dev d_out(size_t(n) * 4);
        d_out.poison();
        ASSERT_EQ(logits_to_f32_softcap(t, d_in->p, static_cast<float*>(d_out.p), n, cap, nullptr),
                  cudaSuccess);
        const auto got = d_out.download<float>();
        Checker c{"logits_to_f32_softcap"};
        for (int64_t i = 0; i < n; ++i) {
          const double x = in.v[size_t(i)];
          const double ref = cap > 0 ? cap * std::tanh(x / cap) : x;
          c.check(got[size_t(i)], ref, cap > 0 ? 1e-6 * std::fabs(ref) + 1e-6 : 0.0, i);
        }
        if (t == ActDType::kF32 && cap > 0) {  // in place, both entry points
          for (int variant = 0; variant < 2; ++variant) {
            auto d_x = to_device(in);
            float* xp = static_cast<float*>(d_x->p);
            ASSERT_EQ(variant == 0 ? logits_to_f32_softcap(t, xp, xp, n, cap, nullptr)
                                   : soft_cap_inplace(xp, n, cap, nullptr),
                      cudaSuccess);
            EXPECT_EQ(d_x->download<float>(), got) << "in place differs, variant " << variant;
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Sampling.

/// Runs sample_tokens over host logits [rows, stride] (stride >= vocab; 0 = one shared row).
/// `path` kAuto goes through sample_tokens itself.
std::vector<int32_t> run_sampler(const std::vector<float>& logits, int64_t stride,
                                 const std::vector<SamplingRowParams>& params, int vocab,
                                 SamplePath path = SamplePath::kAuto) {
  const int rows = static_cast<int>(params.size());
  Dev d_logits(logits.size() * 4), d_params(params.size() * sizeof(SamplingRowParams)),
      d_out(size_t(rows) * 4);
  d_logits.upload(logits);
  d_params.upload(params);
  d_out.poison();
  const size_t ws_bytes = path == SamplePath::kSplitRow
                              ? sample_tokens_split_workspace_bytes(rows, vocab)
                              : sample_tokens_workspace_bytes(rows, vocab);
  Dev d_ws(ws_bytes);
  d_ws.poison();  // the workspace carries no state between calls
  const float* lp = static_cast<float*>(d_logits.p);
  auto* pp = static_cast<SamplingRowParams*>(d_params.p);
  auto* op = static_cast<int32_t*>(d_out.p);
  EXPECT_EQ(path == SamplePath::kAuto
                ? sample_tokens(lp, stride, pp, rows, vocab, op, d_ws.p, ws_bytes, nullptr)
                : sample_tokens_with(path, lp, stride, pp, rows, vocab, op, d_ws.p, ws_bytes,
                                     nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return d_out.download<int32_t>();
}

int32_t host_argmax(const float* x, int vocab) {
  int32_t best = 0;
  for (int i = 1; i < vocab; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

/// The host's kept set and probabilities (f64, the CPU Sampler's semantics). `slack` widens
/// top_p and min_p so that the set is a superset of what f32 rounding at the edges can give.
struct HostDist {
  std::vector<int32_t> ids;    ///< kept tokens, descending probability (ties by index)
  std::vector<double> probs;   ///< renormalised
  std::vector<double> cum;     ///< cumulative top-k mass fractions before the top-p cut
};

HostDist host_dist(const float* x, int vocab, const SamplingRowParams& p, double slack) {
  HostDist d;
  if (!(p.temperature > 0.f) || p.top_k == 1) {
    d.ids = {host_argmax(x, vocab)};
    d.probs = {1.0};
    return d;
  }
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
  int keep = p.top_k > 0 && p.top_k < vocab ? p.top_k : vocab;
  const double m = x[order[0]];
  std::vector<double> w(static_cast<size_t>(keep));
  double total = 0;
  for (int i = 0; i < keep; ++i) total += w[size_t(i)] = std::exp((x[order[size_t(i)]] - m) / p.temperature);
  if (p.top_p < 1.f) {
    const double tp = std::min(1.0, double(p.top_p) + slack);
    double cum = 0;
    int cut = keep;
    for (int i = 0; i < keep; ++i) {
      cum += w[size_t(i)] / total;
      d.cum.push_back(cum);
      if (cum >= tp) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
  }
  if (p.min_p > 0.f) {
    const double floor_p = double(p.min_p) * (1.0 - slack) * w[0];
    int cut = 1;
    while (cut < keep && w[size_t(cut)] >= floor_p) ++cut;
    keep = cut;
  }
  double kept = 0;
  for (int i = 0; i < keep; ++i) kept += w[size_t(i)];
  for (int i = 0; i < keep; ++i) {
    d.ids.push_back(order[size_t(i)]);
    d.probs.push_back(w[size_t(i)] / kept);
  }
  return d;
}

std::vector<float> random_logits(std::mt19937_64& rng, int rows, int64_t stride, int vocab,
                                 bool bf16_ties) {
  std::normal_distribution<float> nd(0.f, 2.5f);
  std::vector<float> v(size_t(rows) * size_t(stride), std::nanf(""));  // padding stays NaN
  for (int r = 0; r < rows; ++r) {
    float* x = &v[size_t(r) * size_t(stride)];
    for (int i = 0; i < vocab; ++i) x[i] = nd(rng);
    for (int j = 0; j < 8; ++j) x[rng() % vocab] = 8.f + nd(rng) * 0.5f;  // a few likely tokens
    if (bf16_ties)  // bf16-valued logits: many exact ties, like a bf16 LM head
      for (int i = 0; i < vocab; ++i) x[i] = bf16_bits_to_f32(f32_to_bf16_bits(x[i]));
  }
  return v;
}

TEST(Sampling, GreedyIsTheHostArgmaxWithTies) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed(707);
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  const int vocab = 128256;
  const int64_t stride = vocab + 13;
  for (int64_t rows64 : kRows) {
    const int rows = static_cast<int>(rows64);
    SCOPED_TRACE(::testing::Message() << "rows " << rows);
    auto logits = random_logits(rng, rows, stride, vocab, true);
    std::vector<SamplingRowParams> params(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) {
      float* x = &logits[size_t(r) * size_t(stride)];
      // Plant ties of the maximum before and after its position.
      const int a = host_argmax(x, vocab);
      const float mx = x[a];
      x[rng() % vocab] = mx;
      x[rng() % vocab] = mx;
      if (r % 3 == 0) x[vocab - 1] = mx;
      if (r % 5 == 1) x[0] = mx;
      params[size_t(r)] = SamplingRowParams{.temperature = r % 2 ? 0.f : 0.7f,
                                            .top_k = r % 2 ? 0 : 1,
                                            .top_p = 1.f,
                                            .min_p = 0.f,
                                            .seed = rng(),
                                            .step = int64_t(r)};
    }
    const auto got = run_sampler(logits, stride, params, vocab);
    for (int r = 0; r < rows; ++r)
      EXPECT_EQ(got[size_t(r)], host_argmax(&logits[size_t(r) * size_t(stride)], vocab))
          << "row " << r;
  }
}

SamplingRowParams random_filter_params(std::mt19937_64& rng, int r) {
  static constexpr float kTemps[] = {0.3f, 0.7f, 1.f, 1.5f};
  static constexpr int kTopK[] = {0, 2, 20, 1000, 50000};
  static constexpr float kTopP[] = {1.f, 0.95f, 0.8f, 0.3f};
  static constexpr float kMinP[] = {0.f, 0.f, 0.02f, 0.2f};
  return SamplingRowParams{.temperature = kTemps[rng() % 4],
                           .top_k = kTopK[rng() % 5],
                           .top_p = kTopP[rng() % 4],
                           .min_p = kMinP[rng() % 4],
                           .seed = rng(),
                           .step = int64_t(r) * 7 + 3};
}

TEST(Sampling, FilteredDrawsStayInTheAllowedSet) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed(808);
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  const int vocab = 128256;
  for (bool ties : {false, true}) {
    for (int64_t rows64 : kRows) {
      const int rows = static_cast<int>(rows64);
      SCOPED_TRACE(::testing::Message() << "rows " << rows << " bf16 ties " << ties);
      const auto logits = random_logits(rng, rows, vocab, vocab, ties);
      std::vector<SamplingRowParams> params(static_cast<size_t>(rows));
      for (int r = 0; r < rows; ++r) params[size_t(r)] = random_filter_params(rng, r);
      const auto got = run_sampler(logits, vocab, params, vocab);
      for (int r = 0; r < rows; ++r) {
        const HostDist d = host_dist(&logits[size_t(r) * vocab], vocab, params[size_t(r)], 1e-4);
        const auto& p = params[size_t(r)];
        EXPECT_NE(std::find(d.ids.begin(), d.ids.end(), got[size_t(r)]), d.ids.end())
            << "row " << r << " sampled " << got[size_t(r)] << " outside the " << d.ids.size()
            << " allowed (T " << p.temperature << " top_k " << p.top_k << " top_p " << p.top_p
            << " min_p " << p.min_p << ")";
      }
    }
  }
}

TEST(Sampling, ResultIndependentOfBatchPosition) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed(909);
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  const int vocab = 128256, rows = 64;
  for (bool ties : {false, true}) {
    const auto logits = random_logits(rng, rows, vocab, vocab, ties);
    std::vector<SamplingRowParams> params(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) params[size_t(r)] = random_filter_params(rng, r);
    const auto base = run_sampler(logits, vocab, params, vocab);
    // Reversed batch with other rows interleaved.
    std::vector<int> perm(static_cast<size_t>(rows));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<float> logits2;
    std::vector<SamplingRowParams> params2;
    const auto noise = random_logits(rng, 1, vocab, vocab, ties);
    for (int i = 0; i < rows; ++i) {
      const int r = perm[size_t(i)];
      logits2.insert(logits2.end(), logits.begin() + int64_t(r) * vocab,
                     logits.begin() + int64_t(r + 1) * vocab);
      params2.push_back(params[size_t(r)]);
      logits2.insert(logits2.end(), noise.begin(), noise.end());
      params2.push_back(random_filter_params(rng, i));
    }
    const auto shuffled = run_sampler(logits2, vocab, params2, vocab);
    for (int i = 0; i < rows; ++i)
      EXPECT_EQ(shuffled[size_t(2 * i)], base[size_t(perm[size_t(i)])]) << "row " << perm[size_t(i)];
    // Alone, and again (deterministic).
    for (int r : {0, rows / 2, rows - 1}) {
      const std::vector<float> one(logits.begin() + int64_t(r) * vocab,
                                   logits.begin() + int64_t(r + 1) * vocab);
      EXPECT_EQ(run_sampler(one, vocab, {params[size_t(r)]}, vocab)[0], base[size_t(r)]);
    }
    EXPECT_EQ(run_sampler(logits, vocab, params, vocab), base);
  }
}

// The split-row path (many blocks per row for the max/argmax) against the single-block path on
// the same inputs: identical ids for greedy and filtered rows, at rows 1, 2, 16, 64 (the sizes
// sample_tokens routes through it) and 300 (forced), vocabularies with 1 to 64 slices, unaligned
// strides, a shared row (stride 0), bf16 ties, and maxima planted at slice edges, NaN and -inf.
TEST(Sampling, SplitRowPathEqualsSingleBlock) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed(1111);
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  struct Case {
    int rows, vocab;
    int64_t stride;
    bool ties;
  };
  const std::vector<Case> cases = {
      {1, 128256, 128256, true},  {1, 128256, 128269, false}, {2, 128256, 128269, true},
      {2, 32000, 0, false},       {16, 128256, 128256, true}, {16, 4097, 4101, true},
      {16, 262144, 262144, true}, {64, 151936, 151939, true}, {300, 128256, 128256, true},
      {3, 1000, 1003, true},      {7, 4096, 4096, false}};
  for (const Case& cs : cases) {
    SCOPED_TRACE(::testing::Message() << "rows " << cs.rows << " vocab " << cs.vocab << " stride "
                                    << cs.stride << " ties " << cs.ties);
    const int rows_stored = cs.stride == 0 ? 1 : cs.rows;
    auto logits = random_logits(rng, rows_stored, cs.stride == 0 ? cs.vocab : cs.stride, cs.vocab,
                                cs.ties);
    const int64_t st = cs.stride == 0 ? cs.vocab : cs.stride;
    for (int r = 0; r < rows_stored; ++r) {
      float* x = &logits[size_t(r) * size_t(st)];
      const int a = host_argmax(x, cs.vocab);
      const float mx = x[a];
      switch (r % 6) {
        case 1:  // ties of the maximum on both sides of slice edges
          for (int e : {kSampleSplitSlice - 1, kSampleSplitSlice, 3 * kSampleSplitSlice})
            if (e < cs.vocab) x[e] = mx;
          break;
        case 2:  // the maximum at the last index, NaNs elsewhere (NaN counts as -inf)
          x[cs.vocab - 1] = mx + 1.f;
          for (int j = 0; j < 50; ++j) x[1 + rng() % (cs.vocab - 1)] = std::nanf("");
          break;
        case 3:  // a row of -inf with one finite value in a late slice
          for (int i = 0; i < cs.vocab; ++i) x[i] = -INFINITY;
          x[cs.vocab / 2 + 1] = -3.f;
          break;
        case 4:  // all -inf: index 0
          for (int i = 0; i < cs.vocab; ++i) x[i] = -INFINITY;
          break;
        case 5:  // +inf twice: the first one
          x[cs.vocab / 3] = INFINITY;
          x[cs.vocab / 3 + kSampleSplitSlice / 2] = INFINITY;
          break;
        default:
          break;
      }
    }
    std::vector<SamplingRowParams> params(static_cast<size_t>(cs.rows));
    for (int r = 0; r < cs.rows; ++r) {
      params[size_t(r)] = random_filter_params(rng, r);
      if (r % 3 == 0) params[size_t(r)].temperature = 0.f;  // greedy
    }
    const auto single = run_sampler(logits, cs.stride, params, cs.vocab, SamplePath::kSingleBlock);
    const auto split = run_sampler(logits, cs.stride, params, cs.vocab, SamplePath::kSplitRow);
    const auto autop = run_sampler(logits, cs.stride, params, cs.vocab, SamplePath::kAuto);
    EXPECT_EQ(split, single);
    EXPECT_EQ(autop, single);
    for (int r = 0; r < cs.rows; r += 3) {  // greedy rows: the host argmax
      const float* x = &logits[size_t(cs.stride == 0 ? 0 : r) * size_t(st)];
      EXPECT_EQ(split[size_t(r)], host_argmax(x, cs.vocab)) << "row " << r;
    }
  }
}

TEST(Sampling, WorkspaceSizes) {
  // Split-row path: sized for kSampleSplitMaxRows rows whatever the row count (allocated once).
  const size_t max_rows = size_t(kSampleSplitMaxRows);
  EXPECT_EQ(sample_tokens_workspace_bytes(1, 128256), max_rows * 32u * 8u);
  EXPECT_EQ(sample_tokens_workspace_bytes(16, 128256), max_rows * 32u * 8u);
  EXPECT_EQ(sample_tokens_workspace_bytes(kSampleSplitMaxRows, kMaxSampleVocab),
            max_rows * 64u * 8u);
  EXPECT_EQ(sample_tokens_workspace_bytes(16, kSampleSplitSlice + 1), max_rows * 2u * 8u);
  // Single-block path: none.
  EXPECT_EQ(sample_tokens_workspace_bytes(kSampleSplitMaxRows + 1, 128256), 0u);
  EXPECT_EQ(sample_tokens_workspace_bytes(16, kSampleSplitSlice), 0u);
  EXPECT_EQ(sample_tokens_workspace_bytes(0, 128256), 0u);
  EXPECT_EQ(sample_tokens_split_workspace_bytes(300, 100), 300u * 8u);
  EXPECT_EQ(sample_tokens_split_workspace_bytes(2, 128256), 2u * 32u * 8u);
}

// The split-row path inside a CUDA graph: replays pick up new logits and parameters and match
// eager calls (the workspace is allocated before capture and carries no state).
TEST(Sampling, SplitRowPathReplaysInAGraph) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed(1212);
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  const int vocab = 128256, rows = 2;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const size_t ws_bytes = sample_tokens_workspace_bytes(rows, vocab);
  ASSERT_GT(ws_bytes, 0u);
  Dev d_logits(size_t(rows) * vocab * 4), d_params(rows * sizeof(SamplingRowParams)),
      d_out(size_t(rows) * 4), d_ws(ws_bytes);
  d_ws.poison();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const float* lp = static_cast<float*>(d_logits.p);
  auto* pp = static_cast<SamplingRowParams*>(d_params.p);
  auto* op = static_cast<int32_t*>(d_out.p);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const cudaError_t launch =
      sample_tokens(lp, vocab, pp, rows, vocab, op, d_ws.p, ws_bytes, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(launch, cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE(::testing::Message() << "replay " << replay);
    const auto logits = random_logits(rng, rows, vocab, vocab, replay % 2 == 0);
    std::vector<SamplingRowParams> params(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) params[size_t(r)] = random_filter_params(rng, r + replay);
    params[0].temperature = 0.f;
    d_logits.upload(logits);
    d_params.upload(params);
    d_out.poison();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // `stream` does not wait for the legacy one
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(d_out.download<int32_t>(),
              run_sampler(logits, vocab, params, vocab, SamplePath::kSingleBlock));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

/// Wilson-Hilferty upper quantile of chi-square with df degrees of freedom at standard normal z.
double chi2_critical(int df, double z) {
  const double k = df;
  const double a = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

TEST(Sampling, FrequenciesMatchTheHostDistribution) {
  REQUIRE_GPU();
  const std::vector<float> logits = {3.0f, 2.5f, 2.2f, 1.9f, 1.0f, 0.5f, 0.1f, -0.5f,
                                     -1.f, -2.f, 2.2f, -4.f, 0.7f, 1.4f, -0.2f, 0.f};
  const int vocab = static_cast<int>(logits.size());
  struct Case {
    float t;
    int k;
    float p, min_p;
  };
  const Case cases[] = {{1.f, 0, 1.f, 0.f},     {0.7f, 5, 1.f, 0.f},   {1.2f, 0, 0.8f, 0.f},
                        {1.f, 0, 1.f, 0.1f},    {0.9f, 8, 0.9f, 0.05f}, {2.f, 3, 1.f, 0.f},
                        {1.f, 12, 0.97f, 0.f}};
  const int draws = 8000;
  const uint64_t seed = test_seed(1010);
  std::cout << "seed " << seed << "\n";
  for (const Case& cs : cases) {
    SCOPED_TRACE(::testing::Message() << "T " << cs.t << " top_k " << cs.k << " top_p " << cs.p
                                    << " min_p " << cs.min_p);
    std::vector<SamplingRowParams> params(static_cast<size_t>(draws));
    for (int i = 0; i < draws; ++i)
      params[size_t(i)] = SamplingRowParams{.temperature = cs.t, .top_k = cs.k, .top_p = cs.p,
                                            .min_p = cs.min_p, .seed = seed + uint64_t(i % 7),
                                            .step = int64_t(i)};
    const HostDist d = host_dist(logits.data(), vocab, params[0], 0.0);
    for (double c : d.cum) ASSERT_GT(std::fabs(c - cs.p), 1e-3) << "case too close to a top_p edge";
    const auto got = run_sampler(logits, 0, params, vocab);  // stride 0: one shared row
    std::vector<int> counts(size_t(vocab), 0);
    for (int32_t id : got) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, vocab);
      ++counts[size_t(id)];
    }
    double chi2 = 0;
    int kept_count = 0;
    for (size_t j = 0; j < d.ids.size(); ++j) {
      const double expect = d.probs[j] * draws;
      const double o = counts[size_t(d.ids[j])];
      chi2 += (o - expect) * (o - expect) / expect;
      kept_count += counts[size_t(d.ids[j])];
    }
    EXPECT_EQ(kept_count, draws) << "draws outside the kept set of " << d.ids.size();
    if (d.ids.size() > 1) {
      const int df = static_cast<int>(d.ids.size()) - 1;
      EXPECT_LT(chi2, chi2_critical(df, 4.75)) << "chi2 " << chi2 << " df " << df;
    }
  }
}

// adjust_logits (logit_bias and penalties) equals the host's apply_logit_adjust bit for bit (the
// host path is checked against a dense reference in model_tests); untouched logits stay as they
// were.
TEST(Sampling, AdjustLogitsEqualsTheHost) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed(4848);
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  const int64_t vocab = 128256, rows = 9;
  std::normal_distribution<float> normal(0.f, 4.f);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  std::vector<float> logits(static_cast<size_t>(rows * vocab));
  for (float& x : logits) x = normal(rng);
  std::vector<LogitAdjust> adj;
  for (int64_t r = 0; r < rows; ++r) {
    auto tokens = [&](int n) {
      std::vector<int32_t> t(static_cast<size_t>(n));
      for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
      return t;
    };
    const auto prompt = tokens(1 + static_cast<int>(rng() % 2000));
    const auto output = tokens(static_cast<int>(rng() % 500));
    LogitProcessing p{.presence_penalty = unit(rng) * 4.f - 2.f,
                      .frequency_penalty = unit(rng) * 4.f - 2.f,
                      .repetition_penalty = 0.25f + unit(rng) * 1.75f};
    for (int i = 0; i < 50; ++i)
      p.logit_bias.emplace_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)),
                                unit(rng) * 200.f - 100.f);
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), output.begin(), output.end());
    TokenCounts counts;
    counts.extend(all, static_cast<int32_t>(prompt.size()));
    append_logit_adjust(counts, p, static_cast<int32_t>(r), adj);
  }
  Dev d_logits(logits.size() * sizeof(float));
  d_logits.upload(logits);
  Dev d_adj(adj.size() * sizeof(LogitAdjust));
  d_adj.upload(adj);
  ASSERT_EQ(adjust_logits(static_cast<float*>(d_logits.p), vocab,
                          static_cast<const LogitAdjustEntry*>(d_adj.p),
                          static_cast<int64_t>(adj.size()), nullptr),
            cudaSuccess);
  apply_logit_adjust(logits.data(), vocab, adj);
  const auto got = d_logits.download<float>();
  ASSERT_EQ(std::memcmp(got.data(), logits.data(), logits.size() * sizeof(float)), 0);
  EXPECT_EQ(adjust_logits(static_cast<float*>(d_logits.p), vocab, nullptr, 0, nullptr),
            cudaSuccess);  // nothing to do
}

// mask_logits (structured output's token masks) equals the host's apply_token_mask bit for bit
// (checked against a per-token reference in model_tests) and the reference itself: rows without
// a mask untouched, a one-token mask, vocabularies a multiple of 32 and not, poisoned bits past
// the vocabulary, NaN-poisoned mask rows past the staged count (and real rows listed there), a
// staged count of 0 a no-op. Greedy device sampling of the masked rows then gives the lowest-id
// maximum among the allowed tokens; the same launch captured in a graph replays new counts.
TEST(Sampling, MaskLogitsEqualsTheHost) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed(4849);
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 4.f);
  for (const int64_t vocab : {int64_t{128256}, int64_t{151937}, int64_t{1000}}) {
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab);
    const int rows = 11;
    std::vector<float> logits(static_cast<size_t>(rows * vocab));
    for (float& x : logits) x = normal(rng);
    const testing::RandomTokenMasks m = testing::random_token_masks(rng, vocab, rows);
    std::vector<int32_t> row_buf(static_cast<size_t>(rows));
    for (int i = 0; i < rows; ++i) row_buf[static_cast<size_t>(i)] = rows - 1 - i;
    std::copy(m.rows.begin(), m.rows.end(), row_buf.begin());
    std::vector<uint32_t> mask_buf(static_cast<size_t>(rows * m.words), 0x7FC00000u);  // NaN
    std::copy(m.packed.begin(), m.packed.end(), mask_buf.begin());
    Dev d_logits(logits.size() * sizeof(float)), d_rows(row_buf.size() * sizeof(int32_t)),
        d_mask(mask_buf.size() * sizeof(uint32_t)), d_count(sizeof(int32_t));
    d_logits.upload(logits);
    d_rows.upload(row_buf);
    d_mask.upload(mask_buf);
    auto* lp = static_cast<float*>(d_logits.p);
    const auto* rp = static_cast<const int32_t*>(d_rows.p);
    const auto* mp = static_cast<const uint32_t*>(d_mask.p);
    const auto* cp = static_cast<const int32_t*>(d_count.p);
    // A graph of the launch with count 0 staged: a no-op.
    d_count.upload(std::vector<int32_t>{0});
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const cudaError_t launch = mask_logits(lp, vocab, rp, mp, cp, rows, stream);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_EQ(launch, cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    auto got = d_logits.download<float>();
    EXPECT_EQ(std::memcmp(got.data(), logits.data(), logits.size() * sizeof(float)), 0)
        << "count 0 changed the logits";
    // The real count, replayed through the same graph.
    d_count.upload(std::vector<int32_t>{static_cast<int32_t>(m.rows.size())});
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    got = d_logits.download<float>();
    std::vector<float> host = logits, want = logits;
    apply_token_mask(host.data(), vocab, m.rows, m.packed);
    testing::reference_token_mask(want, m);
    ASSERT_EQ(std::memcmp(got.data(), host.data(), host.size() * sizeof(float)), 0);
    ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
    // Greedy device sampling of the masked rows.
    const size_t ws_bytes = sample_tokens_workspace_bytes(rows, static_cast<int>(vocab));
    Dev d_params(rows * sizeof(SamplingRowParams)), d_out(rows * sizeof(int32_t)),
        d_ws(std::max<size_t>(ws_bytes, 16));
    d_params.upload(std::vector<SamplingRowParams>(static_cast<size_t>(rows),
                                                   SamplingRowParams{.temperature = 0.f,
                                                                     .top_k = 0,
                                                                     .top_p = 1.f,
                                                                     .min_p = 0.f,
                                                                     .seed = 0,
                                                                     .step = 0}));
    ASSERT_EQ(sample_tokens(lp, vocab, static_cast<const SamplingRowParams*>(d_params.p), rows,
                            static_cast<int>(vocab), static_cast<int32_t*>(d_out.p), d_ws.p,
                            ws_bytes, nullptr),
              cudaSuccess);
    const auto ids = d_out.download<int32_t>();
    for (size_t i = 0; i < m.rows.size(); ++i)
      EXPECT_EQ(ids[static_cast<size_t>(m.rows[i])],
                testing::reference_masked_argmax(logits, vocab, m.rows[i], m.allowed[i]))
          << "row " << m.rows[i];
  }
}

TEST(Sampling, RejectsBadShapes) {
  REQUIRE_GPU();
  int32_t* out = nullptr;
  EXPECT_EQ(sample_tokens(nullptr, 0, nullptr, 1, 0, out, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(sample_tokens(nullptr, 0, nullptr, 1, kMaxSampleVocab + 1, out, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(sample_tokens(nullptr, 0, nullptr, 0, 100, out, nullptr, 0, nullptr), cudaSuccess);
  EXPECT_EQ(sample_tokens_workspace_bytes(256, 256000), 0u);
  // The split-row path needs its workspace.
  EXPECT_EQ(sample_tokens(nullptr, 0, nullptr, 1, 128256, out, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(sample_tokens_with(SamplePath::kSplitRow, nullptr, 0, nullptr, 300, 1000, out,
                               nullptr, 300 * 8 - 1, nullptr),
            cudaErrorInvalidValue);
}

TEST(Sampling, PhiloxIsTheSameOnHostAndDevice) {
  // The device sampler and philox_uniform share philox.h; check the KAT on the host build of it.
  const Philox4x32Out o = philox4x32_10(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(o.v[0], 0x6627e8d5u);
  EXPECT_EQ(o.v[3], 0x9b00dbd8u);
  const double u = philox_uniform(42, 7);
  EXPECT_GE(u, 0.0);
  EXPECT_LT(u, 1.0);
}

}  // namespace
}  // namespace pagoda::model::cuda_kernels

namespace pagoda::model::cuda_kernels {
namespace {

// Top-k log-probabilities (the draft tree's children on the device) vs a host sort in double:
// a 128,256-token vocabulary, ties at the cut (lower id first), NaN and -inf entries, a row with
// fewer finite logits than k (the tail is id -1, -inf), every k from 1 to 16.
TEST(TopKKernels, MatchesAHostSort) {
  PAGODA_REQUIRE_GPU();
  const pagoda::testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  const int64_t vocab = 128256;
  const int rows = 6;
  std::vector<float> logits(static_cast<size_t>(rows * vocab));
  std::normal_distribution<float> nd(0.f, 3.f);
  for (auto& x : logits) x = nd(rng);
  float* r1 = logits.data() + vocab;  // ties: 40 copies of the row's largest value
  const float top = *std::max_element(r1, r1 + vocab) + 1.f;
  for (int i = 0; i < 40; ++i) r1[(i * 3203 + 17) % vocab] = top;
  float* r2 = logits.data() + 2 * vocab;  // NaN and -inf sprinkled
  for (int i = 0; i < 500; ++i) r2[(i * 257) % vocab] = i % 2 ? NAN : -INFINITY;
  float* r3 = logits.data() + 3 * vocab;  // only 3 finite logits
  for (int64_t i = 0; i < vocab; ++i) r3[i] = i % 3 ? NAN : -INFINITY;
  r3[5] = 1.f, r3[99] = 2.f, r3[70000] = 1.f;
  float *dl = nullptr, *dp = nullptr;
  int32_t* di = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dl), logits.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&di), size_t(rows) * 16 * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dp), size_t(rows) * 16 * 4), cudaSuccess);
  cudaMemcpy(dl, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice);
  for (int k = 1; k <= 16; ++k) {
    cudaMemset(di, 0xFF, size_t(rows) * 16 * 4);
    cudaMemset(dp, 0xFF, size_t(rows) * 16 * 4);  // NaN poison
    ASSERT_EQ(launch_topk_logprobs(dl, rows, vocab, k, di, dp, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<int32_t> ids(size_t(rows) * k);
    std::vector<float> lps(size_t(rows) * k);
    cudaMemcpy(ids.data(), di, ids.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(lps.data(), dp, lps.size() * 4, cudaMemcpyDeviceToHost);
    for (int r = 0; r < rows; ++r) {
      const float* x = logits.data() + int64_t(r) * vocab;
      std::vector<int32_t> order;
      double mx = -INFINITY;
      for (int64_t i = 0; i < vocab; ++i) {
        if (std::isnan(x[i])) continue;
        order.push_back(static_cast<int32_t>(i));
        mx = std::max(mx, double(x[i]));
      }
      double sum = 0;
      for (int32_t i : order) sum += std::exp(double(x[i]) - mx);
      const double lse = mx + std::log(sum);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
      for (int t = 0; t < k; ++t) {
        const size_t o = size_t(r) * k + t;
        if (t >= static_cast<int>(order.size())) {
          EXPECT_EQ(ids[o], -1) << "row " << r << " k " << k << " t " << t;
          EXPECT_TRUE(std::isinf(lps[o]) && lps[o] < 0) << "row " << r << " k " << k;
          continue;
        }
        ASSERT_EQ(ids[o], order[size_t(t)]) << "row " << r << " k " << k << " t " << t;
        const double want = std::min(double(x[order[size_t(t)]]) - lse, 0.0);
        if (std::isinf(want)) {  // a -inf logit is a candidate with no mass
          EXPECT_TRUE(std::isinf(lps[o]) && lps[o] < 0) << "row " << r << " k " << k;
        } else {
          EXPECT_NEAR(lps[o], want, 1e-4 * std::max(1.0, std::abs(want))) << "row " << r;
        }
      }
    }
  }
  EXPECT_EQ(launch_topk_logprobs(dl, rows, vocab, 17, di, dp, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(launch_topk_logprobs(dl, rows, vocab, 0, di, dp, nullptr), cudaErrorInvalidValue);
  cudaFree(dl);
  cudaFree(di);
  cudaFree(dp);
}

}  // namespace
}  // namespace pagoda::model::cuda_kernels
