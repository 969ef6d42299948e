// AmxBatchAttention: the extend path of the amx backend over oneDNN matmuls (see amx_backend.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
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
    if (!mm_) mm_ = std::make_unique<kernels::cpu::OnednnMatmul>();
    const bool causal = params.mask == attention::MaskKind::kCausal;
    for (int b = 0; b + 1 < static_cast<int>(qo_indptr_.size()); ++b) {
      const int32_t npages = kv_indptr_[b + 1] - kv_indptr_[b];
      const int64_t kv_len =
          npages == 0 ? 0 : int64_t{npages - 1} * page_size_ + kv_last_[static_cast<size_t>(b)];
      for (int hk = 0; hk < shape_.num_kv_heads; ++hk)
        run_head_group(b, hk, kv_len, causal, params.sm_scale, q, k_cache, v_cache, out, lse);
    }
  }

 private:
  /// One request's query heads of KV head `hk`: rows r = hl * qo + i (hl < group, i < qo).
  void run_head_group(int b, int hk, int64_t kv_len, bool causal, float sm_scale,
                      const TensorView& q, const TensorView& kc, const TensorView& vc,
                      const TensorView& out, const TensorView& lse) {
    const int64_t t0 = qo_indptr_[b], qo = qo_indptr_[b + 1] - t0;
    if (qo == 0) return;
    const int group = shape_.num_qo_heads / shape_.num_kv_heads;
    const int64_t dq = shape_.head_dim_qk, dv = shape_.head_dim_v, rows = group * qo;
    const int64_t blk = kAmxKeyBlock;
    const int64_t padded = (kv_len + blk - 1) / blk * blk;
    const DType t = mm_->operand_dtype();
    // Operands: the stacked queries and the gathered (packed) keys and values of this request.
    qa_.reset(t, static_cast<size_t>(rows * dq));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t d = 0; d < dq; ++d)
        qa_.set_bits(static_cast<size_t>(r * dq + d),
                     amx_bits_at(q, (t0 + r % qo) * q.stride(0) +
                                        (int64_t{hk} * group + r / qo) * q.stride(1) +
                                        d * q.stride(2)));
    ka_.reset(t, static_cast<size_t>(padded * dq));
    va_.reset(t, static_cast<size_t>(padded * dv));
    for (int64_t j = 0; j < kv_len; ++j) {
      const int64_t page = kv_indices_[static_cast<size_t>(kv_indptr_[b] + j / page_size_)];
      const int64_t slot = j % page_size_;
      const int64_t kbase = page * kc.stride(0) + slot * kc.stride(1) + hk * kc.stride(2);
      const int64_t vbase = page * vc.stride(0) + slot * vc.stride(1) + hk * vc.stride(2);
      for (int64_t d = 0; d < dq; ++d)
        ka_.set_bits(static_cast<size_t>(j * dq + d), amx_bits_at(kc, kbase + d * kc.stride(3)));
      for (int64_t d = 0; d < dv; ++d)
        va_.set_bits(static_cast<size_t>(j * dv + d), amx_bits_at(vc, vbase + d * vc.stride(3)));
    }
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    m_.assign(static_cast<size_t>(rows), kNegInf);
    l_.assign(static_cast<size_t>(rows), 0.f);
    acc_.assign(static_cast<size_t>(rows * dv), 0.f);
    s_.resize(static_cast<size_t>(rows * blk));
    pv_.resize(static_cast<size_t>(rows * dv));
    pa_.reset(t, static_cast<size_t>(rows * blk));
    const unsigned char* kbytes = static_cast<const unsigned char*>(ka_.data());
    const unsigned char* vbytes = static_cast<const unsigned char*>(va_.data());
    const size_t es = dtype_size(t);
    for (int64_t j0 = 0; j0 < kv_len; j0 += blk) {
      mm_->run(qa_.data(), kbytes + static_cast<size_t>(j0 * dq) * es, s_.data(), rows, blk, dq,
               /*b_rows_are_n=*/true);
      bool any = false;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = r % qo;
        const int64_t last = causal ? kv_len - qo + i : kv_len - 1;  // last visible key
        const int64_t n_vis = std::clamp<int64_t>(last - j0 + 1, 0, blk);
        float* s = s_.data() + r * blk;
        float mx = m_[static_cast<size_t>(r)];
        for (int64_t j = 0; j < n_vis; ++j) mx = std::max(mx, s[j] * sm_scale);
        const float alpha = mx == kNegInf ? 1.f : std::exp(m_[static_cast<size_t>(r)] - mx);
        float sum = 0.f;
        for (int64_t j = 0; j < blk; ++j) {
          const float p = j < n_vis ? std::exp(s[j] * sm_scale - mx) : 0.f;
          sum += p;
          pa_.set_bits(static_cast<size_t>(r * blk + j), f32_to_bf16_bits(p));
        }
        any |= n_vis > 0;
        m_[static_cast<size_t>(r)] = mx;
        l_[static_cast<size_t>(r)] = l_[static_cast<size_t>(r)] * alpha + sum;
        float* a = acc_.data() + r * dv;
        for (int64_t d = 0; d < dv; ++d) a[d] *= alpha;
      }
      if (!any) continue;
      mm_->run(pa_.data(), vbytes + static_cast<size_t>(j0 * dv) * es, pv_.data(), rows, dv, blk,
               /*b_rows_are_n=*/false);
      for (size_t x = 0; x < acc_.size(); ++x) acc_[x] += pv_[x];
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t tok = t0 + r % qo, head = int64_t{hk} * group + r / qo;
      const float l = l_[static_cast<size_t>(r)];
      for (int64_t d = 0; d < dv; ++d)
        write_from_f32(out.data(), out.dtype(),
                       static_cast<size_t>(tok * out.stride(0) + head * out.stride(1) +
                                           d * out.stride(2)),
                       l > 0.f ? acc_[static_cast<size_t>(r * dv + d)] / l : 0.f);
      if (!lse.empty())
        lse.data_as<float>()[tok * lse.stride(0) + head * lse.stride(1)] =
            l > 0.f ? (m_[static_cast<size_t>(r)] + std::log(l)) * std::numbers::log2e_v<float>
                    : kNegInf;
    }
  }

  std::unique_ptr<attention::BatchAttention> decode_;
  std::unique_ptr<kernels::cpu::OnednnMatmul> mm_;  ///< made on the first extend run
  AttentionShape shape_{};
  int page_size_ = 1;
  bool planned_ = false, decode_only_ = false;
  std::vector<int32_t> qo_indptr_, kv_indptr_, kv_indices_, kv_last_;
  AmxOperand qa_, ka_, va_, pa_;
  std::vector<float> s_, pv_, acc_, m_, l_;
};

}  // namespace

std::unique_ptr<attention::BatchAttention> make_amx_batch_attention(
    CpuAttentionOptions decode_options) {
  return std::make_unique<AmxBatchAttention>(decode_options);
}

}  // namespace pagoda::backends
