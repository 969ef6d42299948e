#include "pagoda/attention/batch_attention.h"

#include <cmath>
#include <initializer_list>
#include <limits>

#include "pagoda/core/error.h"

namespace pagoda::attention {

RunParams run_params_for(const AttentionLayer& layer) {
  return RunParams{.sm_scale = layer.scaling,
                   .logit_cap = layer.logit_cap,
                   .window_left = layer.sliding_window,
                   .mask = layer.mask,
                   .sinks = layer.sinks,
                   .k_scale = layer.k_scale,
                   .v_scale = layer.v_scale};
}

namespace {

void require_state(const TensorView& v, const TensorView& s, int64_t n, int64_t h, int64_t d,
                   const char* what) {
  PAGODA_REQUIRE(v.device().is_cpu() && s.device().is_cpu(), kInvalidArgument,
                 "merge_state is host-only; {} lives on {}", what, v.device().to_string());
  PAGODA_REQUIRE(v.dtype() == DType::kF32 && s.dtype() == DType::kF32, kInvalidArgument,
                 "merge_state {} must be f32 (got {} and {})", what, v.dtype(), s.dtype());
  PAGODA_REQUIRE(v.rank() == 3 && v.size(0) == n && v.size(1) == h && v.size(2) == d,
                 kInvalidArgument, "merge_state {} value {} is not [{}, {}, {}]", what,
                 v.describe(), n, h, d);
  PAGODA_REQUIRE(s.rank() == 2 && s.size(0) == n && s.size(1) == h, kInvalidArgument,
                 "merge_state {} lse {} is not [{}, {}]", what, s.describe(), n, h);
}

float& at2(const TensorView& t, int64_t i, int64_t j) {
  return t.data_as<float>()[i * t.stride(0) + j * t.stride(1)];
}
float& at3(const TensorView& t, int64_t i, int64_t j, int64_t k) {
  return t.data_as<float>()[i * t.stride(0) + j * t.stride(1) + k * t.stride(2)];
}

}  // namespace

void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                 const TensorView& s_b, const TensorView& v_out, const TensorView& s_out) {
  PAGODA_REQUIRE(v_a.rank() == 3, kInvalidArgument, "merge_state value must be [n, H, D], got {}",
                 v_a.describe());
  const int64_t n = v_a.size(0), h = v_a.size(1), d = v_a.size(2);
  require_state(v_a, s_a, n, h, d, "state a");
  require_state(v_b, s_b, n, h, d, "state b");
  require_state(v_out, s_out, n, h, d, "output");
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < h; ++j) {
      const double sa = at2(s_a, i, j), sb = at2(s_b, i, j);
      const double m = std::max(sa, sb);
      if (m == -std::numeric_limits<double>::infinity()) {
        for (int64_t k = 0; k < d; ++k) at3(v_out, i, j, k) = 0.f;
        at2(s_out, i, j) = kNegInf;
        continue;
      }
      const double wa = std::exp2(sa - m), wb = std::exp2(sb - m);
      const double sum = wa + wb;
      for (int64_t k = 0; k < d; ++k) {
        // Read both inputs before writing: v_out may alias v_a (merge in place).
        const double va = at3(v_a, i, j, k), vb = at3(v_b, i, j, k);
        at3(v_out, i, j, k) =
            static_cast<float>(((wa > 0 ? wa * va : 0.0) + (wb > 0 ? wb * vb : 0.0)) / sum);
      }
      at2(s_out, i, j) = static_cast<float>(m + std::log2(sum));
    }
  }
}

}  // namespace pagoda::attention

namespace pagoda::attention {
namespace {

bool is_activation_dtype(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

}  // namespace

void validate_plan_input(const PagedPlanInput& in, const AttentionShape& s, std::string_view who) {
  const int bs = in.batch_size();
  PAGODA_REQUIRE(bs >= 0 && static_cast<int>(in.kv_indptr.size()) == bs + 1 &&
                     static_cast<int>(in.kv_last_page_len.size()) == bs,
                 kInvalidArgument,
                 "{} plan: qo_indptr {} / kv_indptr {} / kv_last_page_len {} sizes disagree", who,
                 in.qo_indptr.size(), in.kv_indptr.size(), in.kv_last_page_len.size());
  PAGODA_REQUIRE(in.page_size >= 1, kInvalidArgument, "{} plan: page size {} < 1", who,
                 in.page_size);
  PAGODA_REQUIRE(s.num_qo_heads > 0 && s.num_kv_heads > 0 && s.num_qo_heads % s.num_kv_heads == 0,
                 kInvalidArgument, "{} plan: Hq {} must be a positive multiple of Hkv {}", who,
                 s.num_qo_heads, s.num_kv_heads);
  PAGODA_REQUIRE(s.head_dim_qk > 0 && s.head_dim_v > 0, kInvalidArgument,
                 "{} plan: head dims {}/{} must be positive", who, s.head_dim_qk, s.head_dim_v);
  PAGODA_REQUIRE(is_activation_dtype(s.q_dtype) && is_activation_dtype(s.out_dtype) &&
                     dtype_is_float(s.kv_dtype),
                 kUnsupported,
                 "{} plan: dtypes q {} kv {} out {} unsupported (q/out f32, f16, bf16; kv also "
                 "fp8_e4m3, fp8_e5m2)",
                 who, s.q_dtype, s.kv_dtype, s.out_dtype);
  PAGODA_REQUIRE(in.qo_indptr[0] == 0 && in.kv_indptr[0] == 0, kInvalidArgument,
                 "{} plan: indptrs must start at 0", who);
  for (int b = 0; b < bs; ++b) {
    PAGODA_REQUIRE(in.qo_indptr[b + 1] >= in.qo_indptr[b] && in.kv_indptr[b + 1] >= in.kv_indptr[b],
                   kInvalidArgument, "{} plan: indptrs decrease at request {}", who, b);
    const int pages = in.kv_indptr[b + 1] - in.kv_indptr[b];
    const int last = in.kv_last_page_len[b];
    PAGODA_REQUIRE(pages == 0 ? last == 0 : (last >= 1 && last <= in.page_size), kOutOfRange,
                   "{} plan: request {} last_page_len {} outside [1, {}] ({} pages)", who, b, last,
                   in.page_size, pages);
  }
  PAGODA_REQUIRE(static_cast<size_t>(in.kv_indptr[bs]) == in.kv_indices.size(), kInvalidArgument,
                 "{} plan: kv_indices has {} entries, kv_indptr ends at {}", who,
                 in.kv_indices.size(), in.kv_indptr[bs]);
  for (int32_t p : in.kv_indices) {
    PAGODA_REQUIRE(p >= 0, kOutOfRange, "{} plan: negative page id {}", who, p);
  }
  if (in.custom_mask.empty()) return;
  PAGODA_REQUIRE(static_cast<int>(in.mask_indptr.size()) == bs + 1, kInvalidArgument,
                 "{} plan: mask_indptr has {} entries, expected {}", who, in.mask_indptr.size(),
                 bs + 1);
  for (int b = 0; b < bs; ++b) {
    const int64_t pages = in.kv_indptr[b + 1] - in.kv_indptr[b];
    const int64_t kv = pages == 0 ? 0 : (pages - 1) * in.page_size + in.kv_last_page_len[b];
    const int64_t bits = int64_t{in.qo_indptr[b + 1] - in.qo_indptr[b]} * kv;
    PAGODA_REQUIRE(in.mask_indptr[b] >= 0 &&
                       in.mask_indptr[b + 1] - in.mask_indptr[b] >= (bits + 7) / 8 &&
                       in.mask_indptr[b + 1] <= static_cast<int64_t>(in.custom_mask.size()),
                   kOutOfRange, "{} plan: request {} mask bytes [{}, {}) too small for {} bits",
                   who, b, in.mask_indptr[b], in.mask_indptr[b + 1], bits);
  }
}

namespace {

void require_tensor(const TensorView& t, std::initializer_list<int64_t> dims, DType dtype,
                    DeviceKind device, std::string_view who, std::string_view what) {
  PAGODA_REQUIRE(t.device().kind == device, kUnsupported, "{} attention: {} {} is on the wrong device",
                 who, what, t.describe());
  PAGODA_REQUIRE(t.dtype() == dtype, kInvalidArgument, "{} attention: {} {} has dtype {}, planned {}",
                 who, what, t.describe(), t.dtype(), dtype);
  PAGODA_REQUIRE(t.rank() == static_cast<int>(dims.size()), kInvalidArgument,
                 "{} attention: {} {} has rank {}, expected {}", who, what, t.describe(), t.rank(),
                 dims.size());
  int d = 0;
  for (int64_t want : dims) {
    PAGODA_REQUIRE(want < 0 || t.size(d) == want, kInvalidArgument,
                   "{} attention: {} {}: dim {} is {}, expected {}", who, what, t.describe(), d,
                   t.size(d), want);
    ++d;
  }
}

}  // namespace

void validate_run_args(const AttentionShape& s, int64_t nnz, int page_size, DeviceKind device,
                       const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                       const TensorView& out, const TensorView& lse, const RunParams& params,
                       std::string_view who) {
  require_tensor(q, {nnz, s.num_qo_heads, s.head_dim_qk}, s.q_dtype, device, who, "q");
  require_tensor(out, {nnz, s.num_qo_heads, s.head_dim_v}, s.out_dtype, device, who, "out");
  require_tensor(k_cache, {-1, page_size, s.num_kv_heads, s.head_dim_qk}, s.kv_dtype, device, who,
                 "k_cache");
  require_tensor(v_cache, {k_cache.size(0), page_size, s.num_kv_heads, s.head_dim_v}, s.kv_dtype,
                 device, who, "v_cache");
  if (!lse.empty()) require_tensor(lse, {nnz, s.num_qo_heads}, DType::kF32, device, who, "lse");
  PAGODA_REQUIRE(params.sinks.empty() || static_cast<int>(params.sinks.size()) == s.num_qo_heads,
                 kInvalidArgument, "{} attention: sinks has {} entries, expected Hq = {}", who,
                 params.sinks.size(), s.num_qo_heads);
  PAGODA_REQUIRE(params.window_left >= -1, kInvalidArgument, "{} attention: window_left {} < -1",
                 who, params.window_left);
  PAGODA_REQUIRE(params.logit_cap >= 0.f, kInvalidArgument, "{} attention: logit_cap {} < 0", who,
                 params.logit_cap);
}

}  // namespace pagoda::attention
