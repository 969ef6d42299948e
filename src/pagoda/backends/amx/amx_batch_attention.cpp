// AmxBatchAttention: the extend path of the amx backend over oneDNN matmuls (see amx_backend.h).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <numbers>
#include <vector>

#include "pagoda/backends/amx/amx_backend.h"
#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"
#include "pagoda/kernels/cpu/onednn_linear.h"

namespace pagoda::backends {

namespace {

using attention::AttentionShape;
using attention::PagedPlanInput;
using attention::RunParams;

/// Operand buffer in the matmul's dtype (bf16 bits or f32); every value stored is bf16-exact.
class AmxOperand {
 public:
  void reset(DType t, size_t n) {
    t_ = t;
    bytes_.assign(n * dtype_size(t), 0);
  }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  /// Element i = the bf16 value with bits `b`.
  void set_bits(size_t i, uint16_t b) {
    if (t_ == DType::kBF16) {
      std::memcpy(bytes_.data() + 2 * i, &b, 2);
    } else {
      const float f = bf16_bits_to_f32(b);
      std::memcpy(bytes_.data() + 4 * i, &f, 4);
    }
  }

 private:
  DType t_ = DType::kBF16;
  std::vector<unsigned char> bytes_;
};

uint16_t amx_bits_at(const TensorView& t, int64_t offset) {
  uint16_t b;
  std::memcpy(&b, static_cast<const unsigned char*>(t.data()) + 2 * offset, 2);
  return b;
}

/// Query positions per work item of the extend loop: a tile of kAmxQueryTile positions of one
/// request and KV head (rows = group × tile) reads the key blocks up to its last visible key only.
constexpr int64_t kAmxQueryTile = 64;

/// One thread's matmul object (oneDNN: one thread at a time per object) and scratch.
struct AmxScratch {
  std::unique_ptr<kernels::cpu::OnednnMatmul> mm;
  AmxOperand qa, pa;
  std::vector<float> s, pv, acc, m, l;
};

/// One (request, KV head)'s keys and values, gathered into contiguous zero-padded blocks.
struct AmxHeadKv {
  AmxOperand k, v;
  int64_t kv_len = 0;
};

class AmxBatchAttention final : public attention::BatchAttention {
 public:
  explicit AmxBatchAttention(CpuAttentionOptions decode_options)
      : decode_(make_cpu_batch_attention(decode_options)) {}

  std::string name() const override { return "amx"; }

  void plan(const PagedPlanInput& in, const AttentionShape& shape) override {
    attention::validate_plan_input(in, shape, "amx");
    PAGODA_REQUIRE(in.custom_mask.empty(), kUnsupported,
                   "amx: custom (tree) masks are not supported (use the cpu backend)");
    PAGODA_REQUIRE(shape.q_dtype == DType::kBF16 && shape.kv_dtype == DType::kBF16,
                   kUnsupported, "amx: needs bf16 queries and KV (got q {}, KV {})",
                   shape.q_dtype, shape.kv_dtype);
    PAGODA_REQUIRE(shape.out_dtype == DType::kBF16 || shape.out_dtype == DType::kF32,
                   kUnsupported, "amx: writes bf16 or f32 outputs (got {})", shape.out_dtype);
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
      guarded([&] { gather_kv(static_cast<int>(g / hk_count), static_cast<int>(g % hk_count), t,
                              k_cache, v_cache); });
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

  /// Request b's keys and values of KV head hk into heads_[b · Hk + hk] (blocks of kAmxKeyBlock
  /// keys, zero-padded).
  void gather_kv(int b, int hk, DType t, const TensorView& kc, const TensorView& vc) {
    AmxHeadKv& h = heads_[static_cast<size_t>(b) * shape_.num_kv_heads + hk];
    const int32_t npages = kv_indptr_[b + 1] - kv_indptr_[b];
    h.kv_len = npages == 0 ? 0 : int64_t{npages - 1} * page_size_ + kv_last_[static_cast<size_t>(b)];
    const int64_t dq = shape_.head_dim_qk, dv = shape_.head_dim_v, blk = kAmxKeyBlock;
    const int64_t padded = (h.kv_len + blk - 1) / blk * blk;
    h.k.reset(t, static_cast<size_t>(padded * dq));
    h.v.reset(t, static_cast<size_t>(padded * dv));
    for (int64_t j = 0; j < h.kv_len; ++j) {
      const int64_t page = kv_indices_[static_cast<size_t>(kv_indptr_[b] + j / page_size_)];
      const int64_t slot = j % page_size_;
      const int64_t kbase = page * kc.stride(0) + slot * kc.stride(1) + hk * kc.stride(2);
      const int64_t vbase = page * vc.stride(0) + slot * vc.stride(1) + hk * vc.stride(2);
      for (int64_t d = 0; d < dq; ++d)
        h.k.set_bits(static_cast<size_t>(j * dq + d), amx_bits_at(kc, kbase + d * kc.stride(3)));
      for (int64_t d = 0; d < dv; ++d)
        h.v.set_bits(static_cast<size_t>(j * dv + d), amx_bits_at(vc, vbase + d * vc.stride(3)));
    }
  }

  /// One tile: the query positions [i0, i0 + tq) of request b, every query head of KV head hk,
  /// rows r = hl · tq + (i − i0); the key blocks up to the tile's last visible key.
  void run_tile(const Item& it, bool causal, float sm_scale, const TensorView& q,
                const TensorView& out, const TensorView& lse, AmxScratch& sc) {
    const int b = it.b, hk = it.hk;
    const AmxHeadKv& h = heads_[static_cast<size_t>(b) * shape_.num_kv_heads + hk];
    const int64_t t0 = qo_indptr_[b], qo = qo_indptr_[b + 1] - t0, kv_len = h.kv_len;
    const int64_t tq = std::min(kAmxQueryTile, qo - it.i0);
    const int group = shape_.num_qo_heads / shape_.num_kv_heads;
    const int64_t dq = shape_.head_dim_qk, dv = shape_.head_dim_v, rows = group * tq;
    const int64_t blk = kAmxKeyBlock;
    const DType t = sc.mm->operand_dtype();
    sc.qa.reset(t, static_cast<size_t>(rows * dq));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t d = 0; d < dq; ++d)
        sc.qa.set_bits(static_cast<size_t>(r * dq + d),
                       amx_bits_at(q, (t0 + it.i0 + r % tq) * q.stride(0) +
                                          (int64_t{hk} * group + r / tq) * q.stride(1) +
                                          d * q.stride(2)));
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    sc.m.assign(static_cast<size_t>(rows), kNegInf);
    sc.l.assign(static_cast<size_t>(rows), 0.f);
    sc.acc.assign(static_cast<size_t>(rows * dv), 0.f);
    sc.s.resize(static_cast<size_t>(rows * blk));
    sc.pv.resize(static_cast<size_t>(rows * dv));
    sc.pa.reset(t, static_cast<size_t>(rows * blk));
    const auto* kbytes = static_cast<const unsigned char*>(h.k.data());
    const auto* vbytes = static_cast<const unsigned char*>(h.v.data());
    const size_t es = dtype_size(t);
    // Keys past the tile's last row's last visible key are visible to none of its rows.
    const int64_t end = causal ? std::clamp<int64_t>(kv_len - qo + it.i0 + tq, 0, kv_len) : kv_len;
    for (int64_t j0 = 0; j0 < end; j0 += blk) {
      sc.mm->run(sc.qa.data(), kbytes + static_cast<size_t>(j0 * dq) * es, sc.s.data(), rows, blk,
                 dq, /*b_rows_are_n=*/true);
      bool any = false;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = it.i0 + r % tq;
        const int64_t last = causal ? kv_len - qo + i : kv_len - 1;  // last visible key
        const int64_t n_vis = std::clamp<int64_t>(last - j0 + 1, 0, blk);
        float* s = sc.s.data() + r * blk;
        float mx = sc.m[static_cast<size_t>(r)];
        for (int64_t j = 0; j < n_vis; ++j) mx = std::max(mx, s[j] * sm_scale);
        const float alpha = mx == kNegInf ? 1.f : std::exp(sc.m[static_cast<size_t>(r)] - mx);
        float sum = 0.f;
        for (int64_t j = 0; j < blk; ++j) {
          const float p = j < n_vis ? std::exp(s[j] * sm_scale - mx) : 0.f;
          sum += p;
          sc.pa.set_bits(static_cast<size_t>(r * blk + j), f32_to_bf16_bits(p));
        }
        any |= n_vis > 0;
        sc.m[static_cast<size_t>(r)] = mx;
        sc.l[static_cast<size_t>(r)] = sc.l[static_cast<size_t>(r)] * alpha + sum;
        float* a = sc.acc.data() + r * dv;
        for (int64_t d = 0; d < dv; ++d) a[d] *= alpha;
      }
      if (!any) continue;
      sc.mm->run(sc.pa.data(), vbytes + static_cast<size_t>(j0 * dv) * es, sc.pv.data(), rows, dv,
                 blk, /*b_rows_are_n=*/false);
      for (size_t x = 0; x < sc.acc.size(); ++x) sc.acc[x] += sc.pv[x];
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t tok = t0 + it.i0 + r % tq, head = int64_t{hk} * group + r / tq;
      const float l = sc.l[static_cast<size_t>(r)];
      for (int64_t d = 0; d < dv; ++d)
        write_from_f32(out.data(), out.dtype(),
                       static_cast<size_t>(tok * out.stride(0) + head * out.stride(1) +
                                           d * out.stride(2)),
                       l > 0.f ? sc.acc[static_cast<size_t>(r * dv + d)] / l : 0.f);
      if (!lse.empty())
        lse.data_as<float>()[tok * lse.stride(0) + head * lse.stride(1)] =
            l > 0.f ? (sc.m[static_cast<size_t>(r)] + std::log(l)) * std::numbers::log2e_v<float>
                    : kNegInf;
    }
  }

  std::unique_ptr<attention::BatchAttention> decode_;
  AttentionShape shape_{};
  int page_size_ = 1;
  bool planned_ = false, decode_only_ = false;
  std::vector<int32_t> qo_indptr_, kv_indptr_, kv_indices_, kv_last_;
  std::vector<Item> items_;
  std::vector<AmxHeadKv> heads_;       ///< per (request, KV head), refilled each extend run
  std::vector<AmxScratch> scratch_;    ///< per OpenMP thread (matmul objects made once)
};

}  // namespace

std::unique_ptr<attention::BatchAttention> make_amx_batch_attention(
    CpuAttentionOptions decode_options) {
  return std::make_unique<AmxBatchAttention>(decode_options);
}

}  // namespace pagoda::backends
