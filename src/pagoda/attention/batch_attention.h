#pragma once
/// BatchAttention: the kernel-level API over a CSR page table (FlashInfer conventions), below
/// AttentionBackend. Users with their own cache manager can call it directly:
///
///   auto attn = make_reference_batch_attention();        // or a cpu / cuda implementation
///   attn->plan(input, shape);                             // host arrays, once per step
///   for each layer: attn->run(q, k_cache, v_cache, out, lse, params);
///
/// Conventions (ARCHITECTURE §3, kernel_anchors (c) C0):
///  - request b has qo_len = qo_indptr[b+1] - qo_indptr[b] query rows and
///    kv_len = (kv_indptr[b+1] - kv_indptr[b] - 1) * page_size + kv_last_page_len[b] keys
///    (0 when it has no pages); its keys are the pages kv_indices[kv_indptr[b] .. kv_indptr[b+1]),
///    in order, all slots of a page used except on the last page;
///  - causal is bottom-right aligned: query i sees key j iff j <= kv_len - qo_len + i;
///  - window_left W >= 0 additionally requires j >= kv_len - qo_len + i - W (W + 1 keys);
///    under a custom mask it keeps a query's last W + 1 visible keys instead: query i sits at
///    position p_i = (keys its mask row sees) - 1, its r-th visible key (0-based, in key order)
///    at position r, and it sees that key iff r >= p_i - W. A tree verify row sees its cached
///    prefix and its ancestors, so these are its RoPE positions (prefix + depth, never the
///    node's index in the flattened tree) and the window is the model's sliding window;
///  - soft cap: s = cap * tanh(sm_scale * q·k / cap) when cap > 0, else s = sm_scale * q·k;
///  - sinks: per-head logit added to the softmax denominator only;
///  - fp8 KV: k = stored * k_scale, v = stored * v_scale (scales applied inside the kernel);
///  - custom mask: bit-packed, little-endian within each byte; request b's bits start at byte
///    mask_indptr[b] and are row-major [qo_len, kv_len]; a 1 bit means "may attend". The custom
///    mask replaces the causal mask (the window still applies, in the positions above);
///  - LSE is log2(Σ exp(s)) over the visible keys (base 2, sinks included), f32; a query that
///    sees no key gets out = 0 and lse = -inf;
///  - all indices int32.
///
/// Tensors (row-major unless strides say otherwise; views are honoured with their strides):
///   q       [nnz_qo, Hq, Dqk]                       dtype f32 / f16 / bf16
///   k_cache [num_pages, page_size, Hkv, Dqk]        dtype f32 / f16 / bf16 / fp8 (NHD)
///   v_cache [num_pages, page_size, Hkv, Dv]         same dtype as k_cache (MLA: a strided view
///                                                   of the latent buffer's first Dv elements)
///   out     [nnz_qo, Hq, Dv]                        dtype f32 / f16 / bf16 (usually q's)
///   lse     [nnz_qo, Hq] f32, or an empty view to skip it

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "pagoda/attention/layer.h"
#include "pagoda/core/dtype.h"
#include "pagoda/core/tensor_view.h"

namespace pagoda::attention {

/// The CSR page table of one step (host memory; plan() copies what it keeps).
struct PagedPlanInput {
  std::span<const int32_t> qo_indptr;         ///< [bs + 1]
  std::span<const int32_t> kv_indptr;         ///< [bs + 1], in pages
  std::span<const int32_t> kv_indices;        ///< [kv_indptr[bs]] page ids
  std::span<const int32_t> kv_last_page_len;  ///< [bs], in [1, page_size] (0 if no pages)
  int page_size = 1;
  std::span<const uint8_t> custom_mask{};     ///< packed bits; empty = no custom mask
  std::span<const int64_t> mask_indptr{};     ///< [bs + 1] byte offsets into custom_mask
  int batch_size() const { return static_cast<int>(qo_indptr.size()) - 1; }
};

/// Shapes and dtypes fixed for a plan.
struct AttentionShape {
  int num_qo_heads = 0;
  int num_kv_heads = 0;
  int head_dim_qk = 0;
  int head_dim_v = 0;
  DType q_dtype = DType::kBF16;
  DType kv_dtype = DType::kBF16;
  DType out_dtype = DType::kBF16;
  bool operator==(const AttentionShape&) const = default;
};

/// Per-layer values that may change between runs of one plan.
struct RunParams {
  float sm_scale = 1.f;
  float logit_cap = 0.f;                 ///< 0 disables
  int window_left = -1;                  ///< -1 disables
  MaskKind mask = MaskKind::kCausal;     ///< ignored where a custom mask is planned
  /// [Hq] or empty. A view: the values must outlive every run() that reads these params (bind a
  /// named vector or the layer's weights, never a temporary: `{.sinks = std::vector{...}}` dangles).
  std::span<const float> sinks{};
  float k_scale = 1.f;
  float v_scale = 1.f;
};

/// Checks a plan against the conventions above: sizes of the CSR arrays, indptrs starting at 0
/// and non-decreasing, kv_last_page_len in [1, page_size] (0 without pages), page ids >= 0,
/// custom-mask segments large enough, Hq a positive multiple of Hkv, positive head dims, q/out
/// f32/f16/bf16 and a float KV dtype. Throws Error (kInvalidArgument / kOutOfRange /
/// kUnsupported) whose message starts with `who`. Backend-specific limits (head dims a kernel
/// supports) are checked by the backend on top. Page ids against the cache are checked in run().
void validate_plan_input(const PagedPlanInput& in, const AttentionShape& shape,
                         std::string_view who);

/// Checks run() arguments against a plan: every tensor on a `device` device; q [nnz, Hq, Dqk]
/// in q_dtype and out [nnz, Hq, Dv] in out_dtype; k_cache [pages, page_size, Hkv, Dqk] and
/// v_cache [same pages, page_size, Hkv, Dv] in kv_dtype; lse [nnz, Hq] f32 unless empty; sinks
/// empty or Hq entries; window_left >= -1; logit_cap >= 0. Throws Error (kInvalidArgument, or
/// kUnsupported for the device) whose message starts with `who`. Page ids against the cache
/// size are the caller's (it knows its plan's page ids).
void validate_run_args(const AttentionShape& shape, int64_t nnz, int page_size, DeviceKind device,
                       const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                       const TensorView& out, const TensorView& lse, const RunParams& params,
                       std::string_view who);

/// RunParams for a layer (sm_scale = scaling, window_left = sliding_window, ...).
RunParams run_params_for(const AttentionLayer& layer);

class BatchAttention {
 public:
  virtual ~BatchAttention() = default;
  /// Implementation name ("reference", "cpu", "cuda").
  virtual std::string name() const = 0;
  /// Plans the step: validates the CSR table (monotone indptrs, last_page_len in range, page ids
  /// non-negative, mask sizes) and throws Error(kInvalidArgument/kOutOfRange/kUnsupported) without
  /// changing the previous plan when something is wrong. Host only; may allocate.
  virtual void plan(const PagedPlanInput& input, const AttentionShape& shape) = 0;
  /// Computes attention for the planned step. Checks tensor shapes/dtypes against the plan
  /// (Error on mismatch) and page ids against k_cache's page count. Never allocates on device
  /// implementations (CUDA-graph safe).
  virtual void run(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                   const TensorView& out, const TensorView& lse, const RunParams& params) = 0;
};

/// Merges two partial attention states over disjoint key sets (cascade / split-KV):
/// with LSEs in base 2, s = log2(2^s_a + 2^s_b), v = (2^(s_a - s) v_a + 2^(s_b - s) v_b).
/// v_* are [n, H, D] f32, s_* are [n, H] f32 (host). -inf states contribute nothing.
void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                 const TensorView& s_b, const TensorView& v_out, const TensorView& s_out);

}  // namespace pagoda::attention
