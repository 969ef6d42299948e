#pragma once
/// CpuLinearBackend: the "cpu" linear-attention (Mamba2) backend, f32 on the host (the state as
/// SGLang's default float32). A sequence of fewer than kChunkedFromTokens tokens takes the
/// one-step recurrence (decode); a longer one the chunked SSD form (prefill / extend): chunks of
/// min(layer.shape.chunk_size, kMaxChunk) tokens from the call's first token, each computing its
/// outputs as a masked "attention" inside the chunk, y_t = Σ_{s<=t} exp(cumA_t - cumA_s)·(C_t·B_s)·Δ_s·x_s, plus exp(cumA_t)·(h_start·C_t)
/// from the state entering the chunk, and passing exp(cumA_L)·h_start +
/// Σ_s exp(cumA_L - cumA_s)·Δ_s·x_s ⊗ B_s to the next. Both forms are the recurrence of
/// attention/linear_backend.h: a prefill of T tokens equals T decode steps and any split into
/// calls. A tree verify runs node by node: the parent's conv and SSM state copied into the
/// node's slot, then one conv and recurrence step there.
/// The chunk's products are OpenBLAS sgemms (docs/design/state_pool.md "The cpu backend's scan"):
/// per group the lower row blocks of C·Bᵀ, per block of a group's heads one sgemm for the
/// outputs from the entering state and one for the state update, per head the lower row blocks
/// of the masked scores times x; the blocks on the OpenMP threads when OpenBLAS is
/// single-threaded. The conv + SiLU and the time steps are Highway rows (kernels/cpu/ssd_rows.h);
/// a chunk's conv rows are computed just before the chunk, and the decays are products of each
/// token's exp(Δ·A) (no exponential per entry).
/// Host memory, f32 xBC / dt / y; tree verify; no CUDA graphs.

#include <vector>

#include "pagoda/attention/linear_backend.h"
#include "pagoda/attention/registry.h"

namespace pagoda::backends {

class CpuLinearBackend final : public attention::LinearAttentionBackend {
 public:
  /// Sequences of at least this many tokens take the chunked scan, shorter ones the per-token
  /// recurrence (measured: docs/design/state_pool.md "The cpu backend's scan").
  static constexpr int32_t kChunkedFromTokens = 2;
  /// The scan's chunk: layer.shape.chunk_size, at most this (at the bamba-1b shape 64 measured
  /// ~4 % faster than 128, and 128 ~25 % faster than 256 before the triangle blocks).
  static constexpr int64_t kMaxChunk = 64;
  /// Rows of the blocks the chunk's two triangular products (C·Bᵀ and the masked scores · x) are
  /// cut into: only the blocks on and below the diagonal are computed.
  static constexpr int64_t kTriangleBlock = 16;
  /// The most columns (heads × head_dim) of a head block's products: its states and rows stay in
  /// a core's cache (1,024 measured ~10 % faster than a block of all 64 heads of bamba-1b).
  static constexpr int64_t kBlockColumns = 1024;

  std::string name() const override { return "cpu"; }
  /// Host f32, tree verify, no CUDA graphs (attention::host_linear_capabilities).
  const attention::LinearCapabilities& capabilities() const override {
    return attention::host_linear_capabilities();
  }

 protected:
  void run(const attention::LinearLayer& layer, const TensorView& xbc, const TensorView& dt,
           const TensorView& y) override;

 private:
  /// Prepares the conv + SiLU of one sequence's t xBC rows (row stride `stride`): the tap-major
  /// weights and each output row's input rows (from `conv_state` before the call's first row).
  void conv_inputs(const attention::LinearLayer& layer, const float* conv_state, const float* rows,
                   int64_t stride, int64_t t);
  /// Prepared output rows [i0, i1) into xbc_ [i1 - i0, conv_dim] (the per-token paths).
  void conv_rows(const attention::LinearLayer& layer, int64_t i0, int64_t i1);
  /// Prepared output row i into `out` [conv_dim].
  void conv_row(const attention::LinearLayer& layer, int64_t i, float* out) const;
  /// The conv state after the call: the last K - 1 inputs (after every conv row is computed).
  void conv_keep_inputs(const attention::LinearLayer& layer, float* conv_state, const float* rows,
                        int64_t stride, int64_t t);
  /// Δ and exp(Δ·A) of t tokens (dt rows at `dt_stride`) into delta_ / decay_ [t, H] (and a_).
  void time_steps(const attention::LinearLayer& layer, const float* dt_raw, int64_t dt_stride,
                  int64_t t);
  /// One-step recurrence for one token (its Δ and exp(Δ·A) per head): updates h (all heads),
  /// writes y [d_inner].
  void step(const attention::LinearLayer& layer, float* h, const float* xbc, const float* delta,
            const float* decay, float* y) const;
  /// One-step recurrences over one sequence's t tokens (xbc_ after conv_rows) from state h
  /// (updated); dt rows and y rows at the given strides.
  void steps(const attention::LinearLayer& layer, float* h, const float* dt_raw,
             int64_t dt_stride, int64_t t, float* y, int64_t y_stride);
  /// The chunked SSD scan of the same, computing each chunk's conv rows (conv_inputs prepared)
  /// into xbc_ [chunk, conv_dim] just before the chunk (sgemm + OpenMP over head blocks).
  void scan(const attention::LinearLayer& layer, float* h, const float* dt_raw, int64_t dt_stride,
            int64_t t, float* y, int64_t y_stride);
  /// A tree verify of one sequence (rows from `row` of the views).
  void tree_steps(const attention::LinearLayer& layer, const attention::LinearSeq& q, int64_t row,
                  const TensorView& xbc, const TensorView& dt, const TensorView& y);

  std::vector<float> xbc_;     ///< after the conv: [rows, conv_dim] of one call, or of a chunk
  std::vector<float> taps_;    ///< the conv weights tap-major [conv_kernel, conv_dim]
  std::vector<const float*> inputs_;  ///< conv: each output row's input row per tap [t, K]
  std::vector<float> a_;      ///< scan: A = -exp(a_log) [H]
  std::vector<float> delta_;  ///< Δ [t, H] of the call's tokens (time_steps)
  std::vector<float> decay_;  ///< exp(Δ·A) [t, H]
  std::vector<float> gram_;   ///< scan: C·Bᵀ of one chunk per group [G, q, q], lower blocks
  std::vector<float> work_;   ///< scan: each OpenMP thread's scratch for its head blocks
};

/// Registers the linear kind of "cpu" in `registry`.
void register_cpu_linear_backend(attention::BackendRegistry& registry);

}  // namespace pagoda::backends
