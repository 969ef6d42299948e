#include "pagoda/backends/reference/reference_batch_attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "pagoda/attention/paged_plan.h"
#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"

namespace pagoda::backends {

using attention::AttentionShape;
using attention::MaskKind;
using attention::PagedPlanInput;
using attention::RunParams;

namespace {

/// The planned step, owned (plan() copies its input).
struct OwnedPlan : attention::PagedPlan {
  AttentionShape shape;
};

class ReferenceBatchAttention final : public attention::BatchAttention {
 public:
  explicit ReferenceBatchAttention(ReferenceFaults faults) : faults_(faults) {}
  std::string name() const override { return "reference"; }

  void plan(const PagedPlanInput& in, const AttentionShape& shape) override {
    attention::validate_plan_input(in, shape, "reference");
    OwnedPlan p;
    static_cast<attention::PagedPlan&>(p) = attention::PagedPlan::copy_of(in);
    p.shape = shape;
    plan_ = std::move(p);
    planned_ = true;
  }

  void run(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
           const TensorView& out, const TensorView& lse, const RunParams& params) override;

 private:
  void run_request(int b, const TensorView& q, const TensorView& k_cache,
                   const TensorView& v_cache, const TensorView& out, const TensorView& lse,
                   const RunParams& params) const;

  ReferenceFaults faults_;
  OwnedPlan plan_;
  bool planned_ = false;
};

void ReferenceBatchAttention::run(const TensorView& q, const TensorView& k_cache,
                                  const TensorView& v_cache, const TensorView& out,
                                  const TensorView& lse, const RunParams& params) {
  PAGODA_REQUIRE(planned_, kFailedPrecondition, "reference attention: run() before plan()");
  const AttentionShape& s = plan_.shape;
  const int64_t nnz = plan_.qo_indptr.back();
  attention::validate_run_args(s, nnz, plan_.page_size, DeviceKind::kCpu, q, k_cache, v_cache, out,
                                lse, params, "reference");
  for (int32_t p : plan_.kv_indices) {
    PAGODA_REQUIRE(p < k_cache.size(0), kOutOfRange, "page id {} outside the cache's {} pages", p,
                   k_cache.size(0));
  }
  for (int b = 0; b < plan_.batch_size(); ++b) run_request(b, q, k_cache, v_cache, out, lse, params);
}

void ReferenceBatchAttention::run_request(int b, const TensorView& q, const TensorView& k_cache,
                                          const TensorView& v_cache, const TensorView& out,
                                          const TensorView& lse,
                                          const RunParams& params) const {
  const AttentionShape& s = plan_.shape;
  const int64_t qo_begin = plan_.qo_indptr[b];
  const int64_t qo_len = plan_.qo_indptr[b + 1] - qo_begin;
  const int64_t kv_len = plan_.kv_len(b);
  const int group = s.num_qo_heads / s.num_kv_heads;
  const int dqk = s.head_dim_qk, dv = s.head_dim_v;
  const bool custom = !plan_.custom_mask.empty();
  const bool causal = params.mask == MaskKind::kCausal;
  const bool use_sinks = !params.sinks.empty() && !faults_.drop_sinks;
  const double cap = faults_.skip_softcap ? 0.0 : double(params.logit_cap);
  const int window = params.window_left >= 0 ? params.window_left + faults_.window_shift : -1;
  const double k_scale = faults_.ignore_kv_scale ? 1.0 : double(params.k_scale);
  const double v_scale = faults_.ignore_kv_scale ? 1.0 : double(params.v_scale);
  const int64_t num_pages = plan_.kv_indptr[b + 1] - plan_.kv_indptr[b];
  constexpr double kLog2e = 1.4426950408889634;

  // Gathers this request's keys/values of one kv head into dense fp64 rows.
  std::vector<double> keys(static_cast<size_t>(kv_len) * dqk), vals(static_cast<size_t>(kv_len) * dv);
  std::vector<double> logits(static_cast<size_t>(kv_len)), acc(static_cast<size_t>(dv)),
      acc2(static_cast<size_t>(dv));
  std::vector<uint8_t> visible(static_cast<size_t>(kv_len));
  for (int kvh = 0; kvh < s.num_kv_heads; ++kvh) {
    for (int64_t j = 0; j < kv_len; ++j) {
      int64_t page = plan_.kv_indices[plan_.kv_indptr[b] + j / plan_.page_size];
      if (faults_.page_off_by_one && j / plan_.page_size == num_pages - 1 &&
          page + 1 < k_cache.size(0)) {
        ++page;
      }
      const int64_t off = j % plan_.page_size;
      const int64_t kb = page * k_cache.stride(0) + off * k_cache.stride(1) + kvh * k_cache.stride(2);
      const int64_t vb = page * v_cache.stride(0) + off * v_cache.stride(1) + kvh * v_cache.stride(2);
      for (int d = 0; d < dqk; ++d) {
        keys[j * dqk + d] = double(read_as_f32(k_cache.data(), s.kv_dtype,
                                               static_cast<size_t>(kb + d * k_cache.stride(3)))) *
                            k_scale;
      }
      for (int d = 0; d < dv; ++d) {
        vals[j * dv + d] = double(read_as_f32(v_cache.data(), s.kv_dtype,
                                              static_cast<size_t>(vb + d * v_cache.stride(3)))) *
                           v_scale;
      }
    }
    for (int64_t i = 0; i < qo_len; ++i) {
      // Visibility of key j for query i (shared by the heads of this group).
      const int64_t diag = kv_len - qo_len + i + (custom ? 0 : faults_.causal_shift);
      for (int64_t j = 0; j < kv_len; ++j) {
        bool ok;
        if (custom) {
          const int64_t bit = i * kv_len + j;
          ok = (plan_.custom_mask[plan_.mask_indptr[b] + bit / 8] >> (bit % 8)) & 1;
          if (faults_.flip_mask_bit && i == qo_len - 1 && j == kv_len - 1) ok = !ok;
        } else {
          ok = !causal || j <= diag;
        }
        if (!custom && window >= 0 && j < kv_len - qo_len + i - window) ok = false;
        visible[j] = ok;
      }
      if (custom && window >= 0) {
        // The mask's positions: the r-th visible key sits at r, the query at (visible keys) - 1.
        int64_t seen = 0;
        for (int64_t j = 0; j < kv_len; ++j) seen += visible[j];
        const int64_t first = faults_.window_by_index ? kv_len - qo_len + i - window
                                                      : seen - 1 - window;
        for (int64_t j = 0, r = 0; j < kv_len; ++j) {
          if (!visible[j]) continue;
          if ((faults_.window_by_index ? j : r) < first) visible[j] = 0;
          ++r;
        }
      }
      for (int g = 0; g < group; ++g) {
        const int h = faults_.interleaved_gqa ? g * s.num_kv_heads + kvh : kvh * group + g;
        const int64_t row = qo_begin + i;
        const int64_t qb = row * q.stride(0) + h * q.stride(1);
        double m = -std::numeric_limits<double>::infinity();
        int64_t n_visible = 0, weakest = -1;
        for (int64_t j = 0; j < kv_len; ++j) {
          if (!visible[j]) continue;
          double dot = 0;
          for (int d = 0; d < dqk; ++d) {
            dot += double(read_as_f32(q.data(), s.q_dtype, static_cast<size_t>(qb + d * q.stride(2)))) *
                   keys[j * dqk + d];
          }
          double logit = double(params.sm_scale) * dot;
          if (cap > 0) logit = cap * std::tanh(logit / cap);
          logits[j] = logit;
          m = std::max(m, logit);
          if (weakest < 0 || logit < logits[weakest]) weakest = j;
          ++n_visible;
        }
        if (!faults_.drop_weakest_key || n_visible < 2) weakest = -1;
        const int64_t ob = row * out.stride(0) + h * out.stride(1);
        if (n_visible == 0) {
          for (int d = 0; d < dv; ++d) {
            write_from_f32(out.data(), s.out_dtype, static_cast<size_t>(ob + d * out.stride(2)), 0.f);
          }
          if (!lse.empty()) {
            lse.data_as<float>()[row * lse.stride(0) + h * lse.stride(1)] =
                -std::numeric_limits<float>::infinity();
          }
          continue;
        }
        const double sink = use_sinks ? double(params.sinks[h]) : 0.0;
        if (use_sinks) m = std::max(m, sink);
        // Chunk 2 (the bad-split-merge mutant only): keys j >= split, accumulated apart.
        const int64_t split = faults_.bad_split_merge_chunk > 0 ? faults_.bad_split_merge_chunk
                                                                : kv_len;
        double denom = use_sinks ? std::exp(sink - m) : 0.0, denom2 = 0.0;
        std::fill(acc.begin(), acc.end(), 0.0);
        std::fill(acc2.begin(), acc2.end(), 0.0);
        for (int64_t j = 0; j < kv_len; ++j) {
          if (!visible[j] || j == weakest) continue;
          const double p = std::exp(logits[j] - m);
          double* a = j < split ? acc.data() : acc2.data();
          (j < split ? denom : denom2) += p;
          for (int d = 0; d < dv; ++d) a[d] += p * vals[j * dv + d];
        }
        double lse2 = (m + std::log(denom + denom2)) * kLog2e;
        if (denom2 > 0 && denom > 0) {
          // The fault: natural-log chunk LSEs merged with the base-2 rule.
          const double la = m + std::log(denom), lb = m + std::log(denom2);
          const double merged = std::log2(std::exp2(la) + std::exp2(lb));
          const double wa = std::exp2(la - merged) / denom, wb = std::exp2(lb - merged) / denom2;
          for (int d = 0; d < dv; ++d) acc[d] = acc[d] * wa + acc2[d] * wb;
          denom = 1.0;
          lse2 = merged;
        } else {
          for (int d = 0; d < dv; ++d) acc[d] += acc2[d];
          denom += denom2;
        }
        for (int d = 0; d < dv; ++d) {
          write_from_f32(out.data(), s.out_dtype, static_cast<size_t>(ob + d * out.stride(2)),
                         static_cast<float>(acc[d] / denom));
        }
        if (!lse.empty()) {
          lse.data_as<float>()[row * lse.stride(0) + h * lse.stride(1)] = static_cast<float>(lse2);
        }
      }
    }
  }
}

}  // namespace

std::unique_ptr<attention::BatchAttention> make_reference_batch_attention(ReferenceFaults faults) {
  return std::make_unique<ReferenceBatchAttention>(faults);
}

}  // namespace pagoda::backends
