// AmxBatchAttention: the extend path of the amx backend: query tiles over key blocks, the two
// products on AMX tiles or oneDNN (amx_operands.h), the online softmax between them
// (kernels/cpu/softmax_rows.h). See amx_backend.h.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <mutex>
#include <utility>
#include <vector>

#include "pagoda/backends/amx/amx_backend.h"
#include "pagoda/backends/amx/amx_operands.h"
#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"
#include "pagoda/kernels/cpu/amx_tile.h"
#include "pagoda/kernels/cpu/softmax_rows.h"

namespace pagoda::backends {

namespace {

using attention::AttentionShape;
using attention::PagedPlanInput;
using attention::RunParams;

using amx_detail::amx_round_up;
using amx_detail::AmxDims;
using amx_detail::AmxHeadKv;
using amx_detail::AmxOperand;
using amx_detail::AmxPath;
using amx_detail::AmxProducts;

/// The bf16 row of tensor t at element offset `offset` (unit stride along it).
const uint16_t* amx_row(const TensorView& t, int64_t offset) {
  return static_cast<const uint16_t*>(t.data()) + offset;
}

/// Query positions per work item of the extend loop: a tile of kAmxQueryTile positions of one
/// request and KV head (rows = group × tile) reads the key blocks up to its last visible key only.
constexpr int64_t kAmxQueryTile = 64;

/// One thread's product engine and scratch.
struct AmxScratch {
  std::unique_ptr<AmxProducts> products;
  AmxOperand qa, pa;
  std::vector<float> s, acc, m, l;
  std::vector<int32_t> visible;
  std::vector<uint16_t> q_row;  ///< an f32 query row rounded to bf16
};

/// The contract of the unit-stride row copies: the last dimension of every tensor is contiguous.
void amx_require_rows(const TensorView& t, const char* what) {
  PAGODA_REQUIRE(t.numel() == 0 || t.stride(-1) == 1, kUnsupported,
                 "amx: {} {} needs a contiguous last dimension (stride {})", what, t.describe(),
                 t.stride(-1));
}

class AmxBatchAttention final : public attention::BatchAttention {
 public:
  explicit AmxBatchAttention(AmxOptions options)
      : options_(options), decode_(make_cpu_batch_attention(options.decode)) {}

  std::string name() const override { return "amx"; }

  void plan(const PagedPlanInput& in, const AttentionShape& shape) override {
    attention::validate_plan_input(in, shape, "amx");
    PAGODA_REQUIRE(in.custom_mask.empty(), kUnsupported,
                   "amx: custom (tree) masks are not supported (use the cpu backend)");
    PAGODA_REQUIRE((shape.q_dtype == DType::kBF16 || shape.q_dtype == DType::kF32) &&
                       shape.kv_dtype == DType::kBF16,
                   kUnsupported, "amx: needs bf16 or f32 queries and bf16 KV (got q {}, KV {})",
                   shape.q_dtype, shape.kv_dtype);
    PAGODA_REQUIRE(shape.out_dtype == DType::kBF16 || shape.out_dtype == DType::kF32, kUnsupported,
                   "amx: writes bf16 or f32 outputs (got {})", shape.out_dtype);
    bool decode_only = true;
    for (int b = 0; b < in.batch_size(); ++b)
      decode_only &= in.qo_indptr[b + 1] - in.qo_indptr[b] == 1;
    if (decode_only) decode_->plan(in, shape);
    decode_only_ = decode_only;
    shape_ = shape;
    page_size_ = in.page_size;
    qo_indptr_.assign(in.qo_indptr.begin(), in.qo_indptr.end());
    kv_indptr_.assign(in.kv_indptr.begin(), in.kv_indptr.end());
    kv_indices_.assign(in.kv_indices.begin(), in.kv_indices.end());
    kv_last_.assign(in.kv_last_page_len.begin(), in.kv_last_page_len.end());
    planned_ = true;
  }

  void run(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
           const TensorView& out, const TensorView& lse, const RunParams& params) override {
    PAGODA_REQUIRE(planned_, kFailedPrecondition, "amx: run() before plan()");
    const int64_t nnz = qo_indptr_.back();
    attention::validate_run_args(shape_, nnz, page_size_, DeviceKind::kCpu, q, k_cache, v_cache,
                                 out, lse, params, "amx");
    PAGODA_REQUIRE(params.window_left < 0 && params.logit_cap == 0.f && params.sinks.empty(),
                   kUnsupported,
                   "amx: sliding window, soft cap and sinks are not supported (window {}, cap "
                   "{}, {} sinks; use the cpu backend)",
                   params.window_left, params.logit_cap, params.sinks.size());
    if (decode_only_) return decode_->run(q, k_cache, v_cache, out, lse, params);
    amx_require_rows(q, "q");
    amx_require_rows(out, "out");
    amx_require_rows(k_cache, "k_cache");
    amx_require_rows(v_cache, "v_cache");
    const int64_t pages = k_cache.size(0);
    for (int32_t p : kv_indices_)
      PAGODA_REQUIRE(p < pages, kOutOfRange, "amx: page id {} outside the cache of {} pages", p,
                     pages);
    const AmxPath path = options_.tiles &&
                                 amx_detail::amx_tiles_fit(shape_.head_dim_qk, shape_.head_dim_v) &&
                                 kernels::cpu::detail::amx_tiles_available()
                             ? AmxPath::kTiles
                             : AmxPath::kOnednn;
    const auto threads = static_cast<size_t>(std::max(1, omp_get_max_threads()));
    if (scratch_.size() < threads) scratch_.resize(threads);
    for (AmxScratch& sc : scratch_)
      if (!sc.products || sc.products->path() != path)
        sc.products = std::make_unique<AmxProducts>(path);
    const DType t = scratch_[0].products->operand_dtype();
    const bool causal = params.mask == attention::MaskKind::kCausal;
    const int batch = static_cast<int>(qo_indptr_.size()) - 1;
    const int hk_count = shape_.num_kv_heads;
    // Work items: (request, KV head, query tile), the heaviest (latest, causal) tiles first.
    items_.clear();
    for (int b = 0; b < batch; ++b)
      for (int64_t i0 = 0; i0 < qo_indptr_[b + 1] - qo_indptr_[b]; i0 += kAmxQueryTile)
        for (int hk = 0; hk < hk_count; ++hk) items_.push_back({b, hk, i0});
    std::reverse(items_.begin(), items_.end());
    heads_.resize(static_cast<size_t>(batch) * hk_count);
    // oneDNN and the loops below may throw; nothing leaves an OpenMP region but its first error.
    std::exception_ptr error;
    std::mutex error_mu;
    auto guarded = [&](auto&& fn) {
      try {
        fn();
      } catch (...) {
        const std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
      }
    };
    const auto groups = static_cast<int64_t>(heads_.size());
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t g = 0; g < groups; ++g)
      guarded([&] {
        gather_kv(static_cast<int>(g / hk_count), static_cast<int>(g % hk_count), path, t, k_cache,
                  v_cache);
      });
    if (error) std::rethrow_exception(error);
    const auto n_items = static_cast<int64_t>(items_.size());
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t w = 0; w < n_items; ++w)
      guarded([&] {
        run_tile(items_[static_cast<size_t>(w)], causal, params.sm_scale, q, out, lse,
                 scratch_[static_cast<size_t>(omp_get_thread_num())]);
      });
    if (error) std::rethrow_exception(error);
  }

 private:
  struct Item {
    int b, hk;
    int64_t i0;  ///< first query position of the tile (within the request)
  };

  /// Request b's keys and values of KV head hk into heads_[b · Hk + hk] (the path's layout).
  void gather_kv(int b, int hk, AmxPath path, DType t, const TensorView& kc, const TensorView& vc) {
    const int32_t npages = kv_indptr_[b + 1] - kv_indptr_[b];
    const int64_t kv_len =
        npages == 0 ? 0 : int64_t{npages - 1} * page_size_ + kv_last_[static_cast<size_t>(b)];
    const int32_t* pages = kv_indices_.data() + kv_indptr_[b];
    heads_[static_cast<size_t>(b) * shape_.num_kv_heads + hk].gather(
        path, t, AmxDims::of(shape_.head_dim_qk, shape_.head_dim_v), kv_len, [&](int64_t j) {
          const int64_t page = pages[j / page_size_], slot = j % page_size_;
          return std::pair{
              amx_row(kc, page * kc.stride(0) + slot * kc.stride(1) + hk * kc.stride(2)),
              amx_row(vc, page * vc.stride(0) + slot * vc.stride(1) + hk * vc.stride(2))};
        });
  }

  /// One tile: the query positions [i0, i0 + tq) of request b, every query head of KV head hk,
  /// rows r = hl · tq + (i − i0) (zero rows up to a multiple of 32); key blocks of up to
  /// kAmxKeyBlock keys (the last one cut to a multiple of kAmxKeyAlign) up to the tile's last
  /// visible key.
  void run_tile(const Item& it, bool causal, float sm_scale, const TensorView& q,
                const TensorView& out, const TensorView& lse, AmxScratch& sc) {
    const int b = it.b, hk = it.hk;
    const AmxHeadKv& h = heads_[static_cast<size_t>(b) * shape_.num_kv_heads + hk];
    const int64_t t0 = qo_indptr_[b], qo = qo_indptr_[b + 1] - t0, kv_len = h.kv_len();
    const int64_t tq = std::min(kAmxQueryTile, qo - it.i0);
    const int group = shape_.num_qo_heads / shape_.num_kv_heads;
    const AmxDims dims = AmxDims::of(shape_.head_dim_qk, shape_.head_dim_v);
    const int64_t rows = group * tq, rows_p = amx_round_up(rows, 32);
    const DType t = sc.products->operand_dtype();
    const auto urows = static_cast<size_t>(rows_p);
    sc.qa.reserve(t, urows * static_cast<size_t>(dims.dqp));
    const bool q_f32 = q.dtype() == DType::kF32;
    sc.q_row.resize(q_f32 ? static_cast<size_t>(dims.dq) : 0);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t at =
          (t0 + it.i0 + r % tq) * q.stride(0) + (int64_t{hk} * group + r / tq) * q.stride(1);
      const uint16_t* row = q_f32 ? sc.q_row.data() : amx_row(q, at);
      if (q_f32) {  // rounded to bf16 (nearest even), the operand's dtype on every path
        const float* src = q.data_as<float>() + at;
        for (int64_t d = 0; d < dims.dq; ++d)
          sc.q_row[static_cast<size_t>(d)] = f32_to_bf16_bits(src[d]);
      }
      sc.qa.set_row(static_cast<size_t>(r * dims.dqp), row, dims.dq, dims.dqp);
    }
    sc.qa.zero(static_cast<size_t>(rows * dims.dqp),
               static_cast<size_t>((rows_p - rows) * dims.dqp));
    sc.m.assign(urows, -std::numeric_limits<float>::infinity());
    sc.l.assign(urows, 0.f);
    sc.acc.assign(urows * static_cast<size_t>(dims.dvp), 0.f);
    sc.s.resize(urows * kAmxKeyBlock);
    sc.visible.assign(urows, 0);  // padding rows see nothing
    sc.pa.reserve(t, urows * kAmxKeyBlock);
    // Keys past the tile's last row's last visible key are visible to none of its rows.
    const int64_t end = causal ? std::clamp<int64_t>(kv_len - qo + it.i0 + tq, 0, kv_len) : kv_len;
    for (int64_t j0 = 0; j0 < end; j0 += kAmxKeyBlock) {
      const int64_t n = amx_round_up(std::min<int64_t>(kAmxKeyBlock, end - j0), kAmxKeyAlign);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t last = causal ? kv_len - qo + it.i0 + r % tq : kv_len - 1;  // last visible
        sc.visible[static_cast<size_t>(r)] =
            static_cast<int32_t>(std::clamp<int64_t>(last - j0 + 1, 0, n));
      }
      sc.products->scores(sc.qa, rows_p, h, j0, n, sc.s.data());
      kernels::cpu::softmax_rows_block({.s = sc.s.data(),
                                        .rows = static_cast<int>(rows_p),
                                        .n = static_cast<int>(n),
                                        .visible = sc.visible.data(),
                                        .scale = sm_scale,
                                        .m = sc.m.data(),
                                        .l = sc.l.data(),
                                        .p_dtype = t,
                                        .p = sc.pa.bytes(),
                                        .acc = sc.acc.data(),
                                        .dv = static_cast<int>(dims.dvp)});
      sc.products->pv(sc.pa, rows_p, h, j0, n, sc.acc.data());
    }
    auto* obytes = static_cast<unsigned char*>(out.data());
    const size_t os = dtype_size(out.dtype());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t tok = t0 + it.i0 + r % tq, head = int64_t{hk} * group + r / tq;
      const float l = sc.l[static_cast<size_t>(r)];  // 0: no visible key (out 0, lse -inf)
      kernels::cpu::scale_row_to(
          sc.acc.data() + r * dims.dvp, static_cast<int>(dims.dv), l == 0.f ? 0.f : 1.f / l,
          obytes + static_cast<size_t>(tok * out.stride(0) + head * out.stride(1)) * os,
          out.dtype());
      if (!lse.empty())
        lse.data_as<float>()[tok * lse.stride(0) + head * lse.stride(1)] =
            l == 0.f ? -std::numeric_limits<float>::infinity()
                     : sc.m[static_cast<size_t>(r)] + std::log2(l);
    }
  }

  AmxOptions options_;
  std::unique_ptr<attention::BatchAttention> decode_;
  AttentionShape shape_{};
  int page_size_ = 1;
  bool planned_ = false, decode_only_ = false;
  std::vector<int32_t> qo_indptr_, kv_indptr_, kv_indices_, kv_last_;
  std::vector<Item> items_;
  std::vector<AmxHeadKv> heads_;     ///< per (request, KV head), refilled each extend run
  std::vector<AmxScratch> scratch_;  ///< per OpenMP thread (product engines made once per path)
};

}  // namespace

std::unique_ptr<attention::BatchAttention> make_amx_batch_attention(AmxOptions options) {
  return std::make_unique<AmxBatchAttention>(options);
}

}  // namespace pagoda::backends
