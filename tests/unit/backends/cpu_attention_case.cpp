// The random paged-attention case of the CPU kernel tests: see cpu_attention_case.h.
#include "cpu_attention_case.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "pagoda/backends/reference/reference_batch_attention.h"
#include "pagoda/core/float_convert.h"

namespace pagoda::backends::cpu_case {

using attention::AttentionShape;
using attention::MaskKind;
using attention::PagedPlanInput;
using attention::RunParams;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

/// A typed buffer filled through f32 values.
struct Buffer {
  DType dtype;
  std::vector<unsigned char> bytes;
  Buffer(DType t, size_t n) : dtype(t), bytes(n * dtype_size(t)) {}
  void set(size_t i, float v) { write_from_f32(bytes.data(), dtype, i, v); }
  float get(size_t i) const { return read_as_f32(bytes.data(), dtype, i); }
  void* data() { return bytes.data(); }
};

}  // namespace

std::string describe(const Case& c) {
  return fmt::format(
      "seed={} bs={} hq={} hkv={} d={}/{} page={} q={} kv={} out={} qo=[{},{}] prefix=[{},{}] "
      "mask={} custom={} mla={} window={} cap={} sinks={} threads={} amx_decode={}",
      c.seed, c.bs, c.hq, c.hkv, c.dqk, c.dv, c.page_size, c.q_dtype, c.kv_dtype, c.out_dtype,
      c.min_qo, c.max_qo, c.min_prefix, c.max_prefix,
      c.mask == MaskKind::kCausal ? "causal" : "none", c.custom_mask, c.mla, c.window_left, c.cap,
      c.sinks, c.options.num_threads, c.options.amx_decode);
}

void run_case(const Case& c) {
  SCOPED_TRACE(describe(c));
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  auto rand_int = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };

  const int bs = c.bs + (c.empty_request ? 1 : 0);
  std::vector<int32_t> qo_indptr{0}, kv_indptr{0}, kv_indices, last_page_len, kv_lens;
  for (int b = 0; b < bs; ++b) {
    const bool empty = c.empty_request && b == bs / 2;
    const int qo = rand_int(c.min_qo, c.max_qo);
    const int kv = empty ? 0 : qo + rand_int(c.min_prefix, c.max_prefix);
    qo_indptr.push_back(qo_indptr.back() + qo);
    const int pages = (kv + c.page_size - 1) / c.page_size;
    kv_indptr.push_back(kv_indptr.back() + pages);
    last_page_len.push_back(pages == 0 ? 0 : kv - (pages - 1) * c.page_size);
    kv_lens.push_back(kv);
  }
  const int total_pages = kv_indptr.back();
  const int num_pages = total_pages + 3;  // spare pages stay NaN
  std::vector<int32_t> perm(num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  kv_indices.assign(perm.begin(), perm.begin() + total_pages);

  // K/V caches, NaN everywhere, then the used slots get values.
  const int64_t slots = int64_t{num_pages} * c.page_size;
  const int krow = c.hkv * c.dqk;
  const int vrow = c.hkv * c.dv;
  Buffer kbuf(c.kv_dtype, static_cast<size_t>(slots * krow));
  Buffer vbuf(c.kv_dtype, c.mla ? 0 : static_cast<size_t>(slots * vrow));
  const float poison = kNaN;  // every kv dtype has a NaN encoding
  for (size_t i = 0; i < kbuf.bytes.size() / dtype_size(c.kv_dtype); ++i) kbuf.set(i, poison);
  for (size_t i = 0; i < vbuf.bytes.size() / dtype_size(c.kv_dtype); ++i) vbuf.set(i, poison);
  for (int b = 0; b < bs; ++b) {
    for (int t = 0; t < kv_lens[b]; ++t) {
      const int64_t slot = int64_t{kv_indices[kv_indptr[b] + t / c.page_size]} * c.page_size +
                           t % c.page_size;
      for (int x = 0; x < krow; ++x) kbuf.set(static_cast<size_t>(slot * krow + x), 2.f * uni(rng));
      if (!c.mla) {
        for (int x = 0; x < vrow; ++x) vbuf.set(static_cast<size_t>(slot * vrow + x), uni(rng));
      }
    }
  }
  TensorView k_cache(kbuf.data(), c.kv_dtype, {num_pages, c.page_size, c.hkv, c.dqk});
  TensorView v_cache =
      c.mla ? TensorView(kbuf.data(), c.kv_dtype, {num_pages, c.page_size, 1, c.dv},
                         {int64_t{c.page_size} * c.dqk, c.dqk, c.dqk, 1})
            : TensorView(vbuf.data(), c.kv_dtype, {num_pages, c.page_size, c.hkv, c.dv});

  const int nnz = qo_indptr.back();
  Buffer qbuf(c.q_dtype, static_cast<size_t>(nnz) * c.hq * c.dqk);
  for (size_t i = 0; i < static_cast<size_t>(nnz) * c.hq * c.dqk; ++i) qbuf.set(i, uni(rng));
  TensorView q(qbuf.data(), c.q_dtype, {nnz, c.hq, c.dqk});

  std::vector<uint8_t> mask_bytes;
  std::vector<int64_t> mask_indptr;
  if (c.custom_mask) {
    mask_indptr.push_back(0);
    for (int b = 0; b < bs; ++b) {
      const int64_t bits = int64_t{qo_indptr[b + 1] - qo_indptr[b]} * kv_lens[b];
      const int64_t bytes = (bits + 7) / 8;
      for (int64_t i = 0; i < bytes; ++i) mask_bytes.push_back(static_cast<uint8_t>(rng()));
      mask_indptr.push_back(mask_indptr.back() + bytes);
    }
    if (!mask_bytes.empty()) mask_bytes[0] = 0;  // request 0, query 0: sees nothing (first 8)
  }
  std::vector<float> sinks;
  if (c.sinks) {
    for (int h = 0; h < c.hq; ++h) sinks.push_back(2.f * uni(rng));
  }

  PagedPlanInput in{.qo_indptr = qo_indptr, .kv_indptr = kv_indptr, .kv_indices = kv_indices,
                    .kv_last_page_len = last_page_len, .page_size = c.page_size,
                    .custom_mask = mask_bytes, .mask_indptr = mask_indptr};
  AttentionShape shape{.num_qo_heads = c.hq, .num_kv_heads = c.hkv, .head_dim_qk = c.dqk,
                       .head_dim_v = c.dv, .q_dtype = c.q_dtype, .kv_dtype = c.kv_dtype,
                       .out_dtype = c.out_dtype};
  RunParams params{.sm_scale = 1.f / std::sqrt(static_cast<float>(c.dqk)), .logit_cap = c.cap,
                   .window_left = c.window_left, .mask = c.mask, .sinks = sinks,
                   .k_scale = c.k_scale, .v_scale = c.v_scale};

  const size_t out_n = static_cast<size_t>(nnz) * c.hq * c.dv;
  Buffer ref_out(c.out_dtype, out_n), cpu_out(c.out_dtype, out_n);
  std::vector<float> ref_lse(static_cast<size_t>(nnz) * c.hq, kNaN);
  std::vector<float> cpu_lse(ref_lse.size(), kNaN);
  for (size_t i = 0; i < out_n; ++i) {
    ref_out.set(i, kNaN);
    cpu_out.set(i, kNaN);
  }
  auto ref = make_reference_batch_attention();
  ref->plan(in, shape);
  ref->run(q, k_cache, v_cache, TensorView(ref_out.data(), c.out_dtype, {nnz, c.hq, c.dv}),
           TensorView(ref_lse.data(), DType::kF32, {nnz, c.hq}), params);
  auto cpu = make_cpu_batch_attention(c.options);
  cpu->plan(in, shape);
  const TensorView out_view(cpu_out.data(), c.out_dtype, {nnz, c.hq, c.dv});
  const TensorView lse_view(cpu_lse.data(), DType::kF32, {nnz, c.hq});
  cpu->run(q, k_cache, v_cache, out_view, lse_view, params);
  // Run twice: the plan and workspace are reused across layers.
  cpu->run(q, k_cache, v_cache, out_view, lse_view, params);

  const float tol = c.tol > 0.f ? c.tol
                  : c.out_dtype == DType::kF32 ? 2e-4f
                  : (c.out_dtype == DType::kF16 ? 2e-3f : 1.6e-2f);
  int bad = 0;
  for (size_t i = 0; i < out_n && bad < 5; ++i) {
    const float r = ref_out.get(i), g = cpu_out.get(i);
    if (std::isnan(g) || std::fabs(r - g) > tol * (1.f + std::fabs(r))) {
      ADD_FAILURE() << "out[" << i / (c.hq * c.dv) << ", " << (i / c.dv) % c.hq << ", "
                    << i % c.dv << "] cpu " << g << " ref " << r;
      ++bad;
    }
  }
  for (size_t i = 0; i < ref_lse.size() && bad < 10; ++i) {
    const float r = ref_lse[i], g = cpu_lse[i];
    const bool both_inf = std::isinf(r) && std::isinf(g) && (r < 0) == (g < 0);
    if (!both_inf && !(std::fabs(r - g) <= 1e-3f * (1.f + std::fabs(r)))) {
      ADD_FAILURE() << "lse[" << i / c.hq << ", " << i % c.hq << "] cpu " << g << " ref " << r;
      ++bad;
    }
  }
}

}  // namespace pagoda::backends::cpu_case
