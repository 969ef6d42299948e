// AmxBatchAttention: the extend path of the amx backend over oneDNN matmuls (see amx_backend.h).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <vector>

#include "pagoda/backends/amx/amx_backend.h"
#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"
#include "pagoda/kernels/cpu/onednn_linear.h"
#include "pagoda/kernels/cpu/softmax_rows.h"

namespace pagoda::backends {

namespace {

using attention::AttentionShape;
using attention::PagedPlanInput;
using attention::RunParams;

/// Operand storage in the matmul's dtype (bf16 bits or f32; every value stored is bf16-exact).
/// Grows only: run after run it keeps its allocation, and nothing is zeroed that is overwritten.
class AmxOperand {
 public:
  /// Room for n elements of t (contents unspecified).
  void reserve(DType t, size_t n) {
    t_ = t;
    const size_t words = (n * dtype_size(t) + 3) / 4;
    if (words_.size() < words) words_.resize(words);
  }
  unsigned char* bytes() { return reinterpret_cast<unsigned char*>(words_.data()); }
  const unsigned char* bytes() const {
    return reinterpret_cast<const unsigned char*>(words_.data());
  }
  /// Elements [i, i + n) from the bf16 row `src` (rounded already: a copy or a widening).
  void set_row(size_t i, const uint16_t* src, int64_t n) {
    if (t_ == DType::kBF16) {
      std::memcpy(bytes() + 2 * i, src, static_cast<size_t>(n) * 2);
    } else {
      float* dst = reinterpret_cast<float*>(bytes()) + i;
      for (int64_t d = 0; d < n; ++d) dst[d] = bf16_bits_to_f32(src[d]);
    }
  }
  /// Elements [i, i + n) = 0.
  void zero(size_t i, size_t n) {
    std::memset(bytes() + i * dtype_size(t_), 0, n * dtype_size(t_));
  }

 private:
  DType t_ = DType::kBF16;
  std::vector<uint32_t> words_;
};

/// The bf16 row of tensor t at element offset `offset` (unit stride along it).
const uint16_t* amx_row(const TensorView& t, int64_t offset) {
  return static_cast<const uint16_t*>(t.data()) + offset;
}

/// Query positions per work item of the extend loop: a tile of kAmxQueryTile positions of one
/// request and KV head (rows = group × tile) reads the key blocks up to its last visible key only.
constexpr int64_t kAmxQueryTile = 64;

/// One thread's matmul object (oneDNN: one thread at a time per object) and scratch.
struct AmxScratch {
  std::unique_ptr<kernels::cpu::OnednnMatmul> mm;
  AmxOperand qa, pa;
  std::vector<float> s, acc, m, l;
  std::vector<int32_t> visible;
};

/// One (request, KV head)'s keys and values, gathered into contiguous rows, zero-padded to a
/// multiple of kAmxKeyAlign keys.
struct AmxHeadKv {
  AmxOperand k, v;
  int64_t kv_len = 0;
};

/// The contract of the unit-stride row copies: the last dimension of every tensor is contiguous.
void amx_require_rows(const TensorView& t, const char* what) {
  PAGODA_REQUIRE(t.numel() == 0 || t.stride(-1) == 1, kUnsupported,
                 "amx: {} {} needs a contiguous last dimension (stride {})", what, t.describe(),
                 t.stride(-1));
}

class AmxBatchAttention final : public attention::BatchAttention {
 public:
  explicit AmxBatchAttention(CpuAttentionOptions decode_options)
      : decode_(make_cpu_batch_attention(decode_options)) {}

  std::string name() const override { return "amx"; }

  void plan(const PagedPlanInput& in, const AttentionShape& shape) override {
    attention::validate_plan_input(in, shape, "amx");
    PAGODA_REQUIRE(in.custom_mask.empty(), kUnsupported,
                   "amx: custom (tree) masks are not supported (use the cpu backend)");
    PAGODA_REQUIRE(shape.q_dtype == DType::kBF16 && shape.kv_dtype == DType::kBF16, kUnsupported,
                   "amx: needs bf16 queries and KV (got q {}, KV {})", shape.q_dtype,
                   shape.kv_dtype);
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
    const auto threads = static_cast<size_t>(std::max(1, omp_get_max_threads()));
    if (scratch_.size() < threads) scratch_.resize(threads);
    for (AmxScratch& sc : scratch_)
      if (!sc.mm) sc.mm = std::make_unique<kernels::cpu::OnednnMatmul>();
    const DType t = scratch_[0].mm->operand_dtype();
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
        gather_kv(static_cast<int>(g / hk_count), static_cast<int>(g % hk_count), t, k_cache,
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

  /// Request b's keys and values of KV head hk into heads_[b · Hk + hk] (one row copy per key,
  /// zero-padded to a multiple of kAmxKeyAlign keys).
  void gather_kv(int b, int hk, DType t, const TensorView& kc, const TensorView& vc) {
    AmxHeadKv& h = heads_[static_cast<size_t>(b) * shape_.num_kv_heads + hk];
    const int32_t npages = kv_indptr_[b + 1] - kv_indptr_[b];
    h.kv_len =
        npages == 0 ? 0 : int64_t{npages - 1} * page_size_ + kv_last_[static_cast<size_t>(b)];
    const int64_t dq = shape_.head_dim_qk, dv = shape_.head_dim_v;
    const int64_t padded = (h.kv_len + kAmxKeyAlign - 1) / kAmxKeyAlign * kAmxKeyAlign;
    h.k.reserve(t, static_cast<size_t>(padded * dq));
    h.v.reserve(t, static_cast<size_t>(padded * dv));
    for (int64_t j = 0; j < h.kv_len; ++j) {
      const int64_t page = kv_indices_[static_cast<size_t>(kv_indptr_[b] + j / page_size_)];
      const int64_t slot = j % page_size_;
      h.k.set_row(static_cast<size_t>(j * dq),
                  amx_row(kc, page * kc.stride(0) + slot * kc.stride(1) + hk * kc.stride(2)), dq);
      h.v.set_row(static_cast<size_t>(j * dv),
                  amx_row(vc, page * vc.stride(0) + slot * vc.stride(1) + hk * vc.stride(2)), dv);
    }
    h.k.zero(static_cast<size_t>(h.kv_len * dq), static_cast<size_t>((padded - h.kv_len) * dq));
    h.v.zero(static_cast<size_t>(h.kv_len * dv), static_cast<size_t>((padded - h.kv_len) * dv));
  }

  /// One tile: the query positions [i0, i0 + tq) of request b, every query head of KV head hk,
  /// rows r = hl · tq + (i − i0); key blocks of up to kAmxKeyBlock keys (the last one cut to a
  /// multiple of kAmxKeyAlign) up to the tile's last visible key.
  void run_tile(const Item& it, bool causal, float sm_scale, const TensorView& q,
                const TensorView& out, const TensorView& lse, AmxScratch& sc) {
    const int b = it.b, hk = it.hk;
    const AmxHeadKv& h = heads_[static_cast<size_t>(b) * shape_.num_kv_heads + hk];
    const int64_t t0 = qo_indptr_[b], qo = qo_indptr_[b + 1] - t0, kv_len = h.kv_len;
    const int64_t tq = std::min(kAmxQueryTile, qo - it.i0);
    const int group = shape_.num_qo_heads / shape_.num_kv_heads;
    const int64_t dq = shape_.head_dim_qk, dv = shape_.head_dim_v, rows = group * tq;
    const DType t = sc.mm->operand_dtype();
    const auto urows = static_cast<size_t>(rows);
    sc.qa.reserve(t, urows * static_cast<size_t>(dq));
    for (int64_t r = 0; r < rows; ++r)
      sc.qa.set_row(static_cast<size_t>(r * dq),
                    amx_row(q, (t0 + it.i0 + r % tq) * q.stride(0) +
                                   (int64_t{hk} * group + r / tq) * q.stride(1)),
                    dq);
    sc.m.assign(urows, -std::numeric_limits<float>::infinity());
    sc.l.assign(urows, 0.f);
    sc.acc.assign(urows * static_cast<size_t>(dv), 0.f);
    sc.s.resize(urows * kAmxKeyBlock);
    sc.visible.resize(urows);
    sc.pa.reserve(t, urows * kAmxKeyBlock);
    const size_t es = dtype_size(t);
    // Keys past the tile's last row's last visible key are visible to none of its rows.
    const int64_t end = causal ? std::clamp<int64_t>(kv_len - qo + it.i0 + tq, 0, kv_len) : kv_len;
    for (int64_t j0 = 0; j0 < end; j0 += kAmxKeyBlock) {
      const int64_t n = (std::min<int64_t>(kAmxKeyBlock, end - j0) + kAmxKeyAlign - 1) /
                        kAmxKeyAlign * kAmxKeyAlign;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t last =
            causal ? kv_len - qo + it.i0 + r % tq : kv_len - 1;  // last visible key
        sc.visible[static_cast<size_t>(r)] =
            static_cast<int32_t>(std::clamp<int64_t>(last - j0 + 1, 0, n));
      }
      sc.mm->run(sc.qa.bytes(), h.k.bytes() + static_cast<size_t>(j0 * dq) * es, sc.s.data(), rows,
                 n, dq, kernels::cpu::MatmulB::kRowsAreN);
      kernels::cpu::softmax_rows_block({.s = sc.s.data(),
                                        .rows = static_cast<int>(rows),
                                        .n = static_cast<int>(n),
                                        .visible = sc.visible.data(),
                                        .scale = sm_scale,
                                        .m = sc.m.data(),
                                        .l = sc.l.data(),
                                        .p_dtype = t,
                                        .p = sc.pa.bytes(),
                                        .acc = sc.acc.data(),
                                        .dv = static_cast<int>(dv)});
      sc.mm->run(sc.pa.bytes(), h.v.bytes() + static_cast<size_t>(j0 * dv) * es, sc.acc.data(),
                 rows, dv, n, kernels::cpu::MatmulB::kRowsAreK, kernels::cpu::MatmulC::kAccumulate);
    }
    auto* obytes = static_cast<unsigned char*>(out.data());
    const size_t os = dtype_size(out.dtype());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t tok = t0 + it.i0 + r % tq, head = int64_t{hk} * group + r / tq;
      const float l = sc.l[static_cast<size_t>(r)];  // 0: no visible key (out 0, lse -inf)
      kernels::cpu::scale_row_to(
          sc.acc.data() + r * dv, static_cast<int>(dv), l == 0.f ? 0.f : 1.f / l,
          obytes + static_cast<size_t>(tok * out.stride(0) + head * out.stride(1)) * os,
          out.dtype());
      if (!lse.empty())
        lse.data_as<float>()[tok * lse.stride(0) + head * lse.stride(1)] =
            l == 0.f ? -std::numeric_limits<float>::infinity()
                     : sc.m[static_cast<size_t>(r)] + std::log2(l);
    }
  }

  std::unique_ptr<attention::BatchAttention> decode_;
  AttentionShape shape_{};
  int page_size_ = 1;
  bool planned_ = false, decode_only_ = false;
  std::vector<int32_t> qo_indptr_, kv_indptr_, kv_indices_, kv_last_;
  std::vector<Item> items_;
  std::vector<AmxHeadKv> heads_;     ///< per (request, KV head), refilled each extend run
  std::vector<AmxScratch> scratch_;  ///< per OpenMP thread (matmul objects made once)
};

}  // namespace

std::unique_ptr<attention::BatchAttention> make_amx_batch_attention(
    CpuAttentionOptions decode_options) {
  return std::make_unique<AmxBatchAttention>(decode_options);
}

}  // namespace pagoda::backends
