#pragma once
/// Dense f32 building blocks of the decoder on the host (CPU). GEMMs go through OpenBLAS
/// (cblas_sgemm); the rest are plain loops, split over the OpenMP threads (rows, or chunks of a
/// long row) once the work passes kParallelMinElems elements: each element's arithmetic is the
/// same whatever the split, so results do not depend on the thread count. All arrays are
/// row-major and must not alias unless stated. These are the seam for a device implementation (cuBLAS + small kernels): LlamaModel
/// calls only these functions for dense math.

#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/model/config.h"

namespace pagoda::model {

/// Elements below which the elementwise ops run on the calling thread alone (a decode row of a
/// small model: an OpenMP fork would cost more than it saves).
inline constexpr int64_t kParallelMinElems = int64_t{1} << 15;

/// Sets the OpenBLAS thread count for this process (n >= 1). Process-wide; call before running.
void set_blas_num_threads(int n);

/// y[m, n] = beta * y + x[m, k] · w[n, k]ᵀ (w in HF [out, in] layout). beta 0 or 1.
void linear(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
            float beta = 0.f);

/// out[t, :] = x[t, :] / sqrt(mean(x[t, :]²) + eps) * weight, for t in [0, rows). out may alias x.
void rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim,
              float eps);

/// out[t, i] = silu(gate_up[t, i]) * gate_up[t, inter + i] for a fused [rows, 2 * inter] input.
void silu_mul(const float* gate_up, float* out, int64_t rows, int64_t inter);

/// silu_mul rounded to bf16 (RNE, as uint16 bits) as it is written: the operand of the next
/// GEMM where that GEMM reads bf16 (the oneDNN bf16 path), with no f32 intermediate. exp is an
/// inline polynomial (relative error about 1e-7; vectorized for AVX2 / AVX-512), so a value
/// within that of a bf16 rounding boundary may round the other way than silu_mul's f32 result
/// would: at most one bf16 ulp apart. NaN stays NaN.
void silu_mul_bf16(const float* gate_up, uint16_t* out, int64_t rows, int64_t inter);

/// out[t, i] = gelu_tanh(gate_up[t, i]) * gate_up[t, inter + i] (HF gelu_pytorch_tanh: 0.5 g
/// (1 + tanh(sqrt(2/π) (g + 0.044715 g³))), f32).
void gelu_tanh_mul(const float* gate_up, float* out, int64_t rows, int64_t inter);

/// x = cap * tanh(x / cap) elementwise (cap > 0).
void soft_cap(float* x, int64_t n, float cap);

/// Rotary embedding tables (HF "rotate_half" / NeoX layout: pairs (i, i + D/2)).
class Rope {
 public:
  /// inv_freq[i] = theta^(-2i/R), then linear, llama3 or yarn scaling as configured, for
  /// i < R/2 with R = rotary_dim (0 = head_dim); inv_freq[i] = 0 (those pairs stay as they are)
  /// for R/2 <= i < head_dim/2. LlamaModel lays a partial RoPE's pairs out so that this
  /// full-width table rotates them (llama.h).
  Rope(const RopeConfig& config, int head_dim, int rotary_dim = 0);
  int head_dim() const { return head_dim_; }
  /// The (scaled) inverse frequencies, [head_dim / 2].
  const std::vector<double>& inv_freq() const { return inv_freq_; }
  /// The factor on cos and sin: 1 except with YaRN (get_mscale(factor, mscale) /
  /// get_mscale(factor, mscale_all_dim)). apply() ignores it (no family that calls it has YaRN).
  double attention_factor() const { return attention_factor_; }
  /// Rotates `x` [rows, num_heads, head_dim] in place; row t uses positions[t].
  /// angle = float(position) * float(inv_freq) in f32, as HF computes it.
  void apply(float* x, std::span<const int32_t> positions, int num_heads) const;

 private:
  int head_dim_;
  double attention_factor_ = 1.0;
  std::vector<double> inv_freq_;
  std::vector<float> inv_freq_f32_;
};

}  // namespace pagoda::model
