#include "pagoda/backends/cpu/cpu_batch_attention.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "pagoda/attention/paged_plan.h"
#include "pagoda/core/error.h"
#include "pagoda/kernels/cpu/paged_attention.h"

namespace pagoda::backends {

using attention::AttentionShape;
using attention::MaskKind;
using attention::PagedPlanInput;
using attention::RunParams;
namespace kc = pagoda::kernels::cpu;

namespace {

/// The planned step: owned copies of the CSR table plus the work partition and workspace.
struct CpuPlan : attention::PagedPlan {
  std::vector<int32_t> kv_lens;  ///< keys per request
  int32_t max_page = -1;
  AttentionShape shape;
  std::vector<kc::CpuWorkItem> items;
  std::vector<kc::CpuMergeItem> merges;
  int num_partials = 0;
  int max_rows = 1;
  int num_threads = 1;
};

void validate_plan(const PagedPlanInput& in, const AttentionShape& s) {
  attention::validate_plan_input(in, s, "cpu");
  PAGODA_REQUIRE(s.head_dim_qk <= kc::kCpuMaxHeadDim && s.head_dim_v <= kc::kCpuMaxHeadDim,
                 kUnsupported, "cpu plan: head dims {}/{} unsupported (the CPU kernels take 1..{})",
                 s.head_dim_qk, s.head_dim_v, kc::kCpuMaxHeadDim);
}

/// Splits the step into work items: per request, KV-head groups x query-head sub-groups x
/// query tiles of about rows_per_item rows; then, when that leaves fewer than
/// items_per_thread items per thread, key chunks (split-KV, merged by LSE afterwards).
void build_schedule(CpuPlan& p, const CpuAttentionOptions& opt) {
  const AttentionShape& s = p.shape;
  const int group = s.num_qo_heads / s.num_kv_heads;
  const int gsplit = (group + 127) / 128;
  const int gs = (group + gsplit - 1) / gsplit;
  const int R = opt.rows_per_item;
  struct Unit {
    kc::CpuWorkItem item;
    int64_t cost;
  };
  std::vector<Unit> units;
  for (int b = 0; b < p.batch_size(); ++b) {
    const int qo_len = p.qo_indptr[b + 1] - p.qo_indptr[b];
    if (qo_len == 0) continue;
    const int qt = std::clamp(R / gs, 1, qo_len);
    const int hg = std::clamp(R / (qt * gs), 1, s.num_kv_heads);
    for (int h0 = 0; h0 < s.num_kv_heads; h0 += hg) {
      for (int g0 = 0; g0 < group; g0 += gs) {
        for (int q0 = 0; q0 < qo_len; q0 += qt) {
          kc::CpuWorkItem it;
          it.request = b;
          it.kv_head_begin = h0;
          it.kv_head_end = std::min(s.num_kv_heads, h0 + hg);
          it.group_begin = g0;
          it.group_end = std::min(group, g0 + gs);
          it.q_begin = q0;
          it.q_end = std::min(qo_len, q0 + qt);
          it.kv_begin = 0;
          it.kv_end = p.kv_lens[b];
          const int64_t rows = int64_t{it.kv_head_end - it.kv_head_begin} *
                               (it.group_end - it.group_begin) * (it.q_end - it.q_begin);
          units.push_back({it, rows * std::max(1, p.kv_lens[b])});
        }
      }
    }
  }
  const int64_t target = int64_t{p.num_threads} * opt.items_per_thread;
  int64_t chunk = 0;  // 0 = no split
  if (p.num_threads > 1 && static_cast<int64_t>(units.size()) < target) {
    int64_t total_kv = 0;
    for (const Unit& u : units) total_kv += u.item.kv_end;
    chunk = std::max<int64_t>(opt.min_split_tokens, (total_kv + target - 1) / target);
    chunk = (chunk + opt.kv_block - 1) / opt.kv_block * opt.kv_block;
  }
  p.items.clear();
  p.merges.clear();
  p.num_partials = 0;
  p.max_rows = 1;
  std::vector<Unit> work;
  for (const Unit& u : units) {
    const kc::CpuWorkItem& it = u.item;
    p.max_rows = std::max(p.max_rows, (it.kv_head_end - it.kv_head_begin) *
                                          (it.group_end - it.group_begin) * (it.q_end - it.q_begin));
    const int kv = it.kv_end;
    if (chunk == 0 || kv <= chunk) {
      work.push_back(u);
      continue;
    }
    const int n = static_cast<int>((kv + chunk - 1) / chunk);
    kc::CpuMergeItem m;
    m.request = it.request;
    m.kv_head_begin = it.kv_head_begin;
    m.kv_head_end = it.kv_head_end;
    m.group_begin = it.group_begin;
    m.group_end = it.group_end;
    m.q_begin = it.q_begin;
    m.q_end = it.q_end;
    m.partial_begin = p.num_partials;
    m.num_partials = n;
    p.merges.push_back(m);
    for (int c = 0; c < n; ++c) {
      kc::CpuWorkItem part = it;
      part.kv_begin = static_cast<int32_t>(c * chunk);
      part.kv_end = static_cast<int32_t>(std::min<int64_t>(kv, (c + 1) * chunk));
      part.partial = p.num_partials++;
      work.push_back({part, u.cost / kv * (part.kv_end - part.kv_begin)});
    }
  }
  // Longest first: dynamic scheduling then balances the tail.
  std::stable_sort(work.begin(), work.end(),
                   [](const Unit& a, const Unit& b) { return a.cost > b.cost; });
  p.items.reserve(work.size());
  for (const Unit& u : work) p.items.push_back(u.item);
}

/// The CPU kernels read rows with unit stride.
void require_contiguous_rows(const TensorView& t, const char* what) {
  PAGODA_REQUIRE(t.numel() == 0 || t.stride(-1) == 1, kUnsupported,
                 "cpu attention: {} {} needs a contiguous last dimension (stride {})", what,
                 t.describe(), t.stride(-1));
}

class CpuBatchAttention final : public attention::BatchAttention {
 public:
  explicit CpuBatchAttention(CpuAttentionOptions options) : opt_(options) {}
  std::string name() const override { return "cpu"; }

  void plan(const PagedPlanInput& in, const AttentionShape& shape) override {
    validate_plan(in, shape);
    CpuPlan p;
    static_cast<attention::PagedPlan&>(p) = attention::PagedPlan::copy_of(in);
    p.shape = shape;
    p.num_threads = opt_.num_threads > 0 ? opt_.num_threads : omp_get_max_threads();
    for (int32_t id : p.kv_indices) p.max_page = std::max(p.max_page, id);
    p.kv_lens.resize(std::max(0, p.batch_size()));
    for (int b = 0; b < p.batch_size(); ++b) p.kv_lens[b] = static_cast<int32_t>(p.kv_len(b));
    build_schedule(p, opt_);
    // Workspace: grown here (host, may allocate), never in run().
    const int64_t scratch = kc::cpu_attention_scratch_floats(p.max_rows, p.max_rows,
                                                             shape.head_dim_qk, shape.head_dim_v,
                                                             opt_.kv_block);
    const size_t need_scratch = static_cast<size_t>(scratch * p.num_threads);
    const size_t need_out = static_cast<size_t>(p.num_partials) * p.max_rows * shape.head_dim_v;
    const size_t need_lse = static_cast<size_t>(p.num_partials) * p.max_rows;
    if (scratch_.size() < need_scratch) scratch_.resize(need_scratch);
    if (partial_out_.size() < need_out) partial_out_.resize(need_out);
    if (partial_lse_.size() < need_lse) partial_lse_.resize(need_lse);
    scratch_floats_ = scratch;
    plan_ = std::move(p);
    planned_ = true;
  }

  void run(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
           const TensorView& out, const TensorView& lse, const RunParams& params) override;

 private:
  CpuAttentionOptions opt_;
  CpuPlan plan_;
  bool planned_ = false;
  std::vector<float> scratch_, partial_out_, partial_lse_;
  int64_t scratch_floats_ = 0;
};

void CpuBatchAttention::run(const TensorView& q, const TensorView& k_cache,
                            const TensorView& v_cache, const TensorView& out,
                            const TensorView& lse, const RunParams& params) {
  PAGODA_REQUIRE(planned_, kFailedPrecondition, "cpu attention: run() before plan()");
  const AttentionShape& s = plan_.shape;
  const int64_t nnz = plan_.batch_size() >= 0 ? plan_.qo_indptr.back() : 0;
  attention::validate_run_args(s, nnz, plan_.page_size, DeviceKind::kCpu, q, k_cache, v_cache, out,
                                lse, params, "cpu");
  require_contiguous_rows(q, "q");
  require_contiguous_rows(out, "out");
  require_contiguous_rows(k_cache, "k_cache");
  require_contiguous_rows(v_cache, "v_cache");
  if (!lse.empty()) require_contiguous_rows(lse, "lse");
  PAGODA_REQUIRE(plan_.max_page < k_cache.size(0), kOutOfRange,
                 "cpu attention: page id {} outside the cache's {} pages", plan_.max_page,
                 k_cache.size(0));
  if (plan_.items.empty()) return;

  kc::CpuAttentionParams p;
  p.q = q.data();
  p.q_dtype = q.dtype();
  p.q_stride_token = q.stride(0);
  p.q_stride_head = q.stride(1);
  p.k = {k_cache.data(), k_cache.dtype(), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2)};
  p.v = {v_cache.data(), v_cache.dtype(), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2)};
  p.out = out.data();
  p.out_dtype = out.dtype();
  p.out_stride_token = out.stride(0);
  p.out_stride_head = out.stride(1);
  if (!lse.empty()) {
    p.lse = lse.data_as<float>();
    p.lse_stride_token = lse.stride(0);
    p.lse_stride_head = lse.stride(1);
  }
  p.num_qo_heads = s.num_qo_heads;
  p.num_kv_heads = s.num_kv_heads;
  p.head_dim_qk = s.head_dim_qk;
  p.head_dim_v = s.head_dim_v;
  p.page_size = plan_.page_size;
  p.qo_indptr = plan_.qo_indptr.data();
  p.kv_indptr = plan_.kv_indptr.data();
  p.kv_indices = plan_.kv_indices.data();
  p.kv_len = plan_.kv_lens.data();
  if (!plan_.custom_mask.empty()) {
    p.mask = kc::CpuMask::kCustom;
    p.custom_mask = plan_.custom_mask.data();
    p.mask_indptr = plan_.mask_indptr.data();
  } else {
    p.mask = params.mask == MaskKind::kCausal ? kc::CpuMask::kCausal : kc::CpuMask::kNone;
  }
  p.window_left = params.window_left;
  p.sm_scale = params.sm_scale;
  p.logit_cap = params.logit_cap;
  p.sinks = params.sinks.empty() ? nullptr : params.sinks.data();
  p.k_scale = params.k_scale;
  p.v_scale = params.v_scale;
  p.bf16_tiles = opt_.bf16_tiles;
  p.bf16_decode = opt_.bf16_decode;
  p.amx_decode = opt_.amx_decode;

  kc::CpuSchedule sch;
  sch.items = plan_.items.data();
  sch.num_items = static_cast<int64_t>(plan_.items.size());
  sch.merges = plan_.merges.data();
  sch.num_merges = static_cast<int64_t>(plan_.merges.size());
  sch.partial_out = partial_out_.data();
  sch.partial_lse = partial_lse_.data();
  sch.max_rows = plan_.max_rows;
  sch.kv_block = opt_.kv_block;
  sch.scratch = scratch_.data();
  sch.scratch_floats = scratch_floats_;
  sch.num_threads = plan_.num_threads;
  kc::run_cpu_paged_attention(p, sch);
}

}  // namespace

std::unique_ptr<attention::BatchAttention> make_cpu_batch_attention(CpuAttentionOptions options) {
  PAGODA_REQUIRE(options.num_threads >= 0, kInvalidArgument, "cpu attention: num_threads {} < 0",
                 options.num_threads);
  PAGODA_REQUIRE(options.kv_block >= 16 && options.kv_block <= 256 && options.kv_block % 16 == 0,
                 kInvalidArgument, "cpu attention: kv_block {} must be a multiple of 16 in [16, 256]",
                 options.kv_block);
  PAGODA_REQUIRE(options.rows_per_item >= 1 && options.rows_per_item <= kc::kCpuMaxRows,
                 kInvalidArgument, "cpu attention: rows_per_item {} outside [1, {}]",
                 options.rows_per_item, kc::kCpuMaxRows);
  PAGODA_REQUIRE(options.min_split_tokens >= 1 && options.items_per_thread >= 1, kInvalidArgument,
                 "cpu attention: min_split_tokens and items_per_thread must be positive");
  return std::make_unique<CpuBatchAttention>(options);
}

int cpu_max_head_dim() { return kc::kCpuMaxHeadDim; }

}  // namespace pagoda::backends
