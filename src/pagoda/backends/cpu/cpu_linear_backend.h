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
/// The chunk's products are OpenBLAS sgemms (docs/design/state_pool.md "The cpu backend's scan"),
/// heads on the OpenMP threads when OpenBLAS is single-threaded.
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
  /// The scan's chunk: layer.shape.chunk_size, at most this (64 and 128 measured equal and ~25 %
  /// faster than 256 at the bamba-1b shape: smaller masked C·Bᵀ products).
  static constexpr int64_t kMaxChunk = 64;

  std::string name() const override { return "cpu"; }
  /// Host f32, tree verify, no CUDA graphs (attention::host_linear_capabilities).
  const attention::LinearCapabilities& capabilities() const override {
    return attention::host_linear_capabilities();
  }

 protected:
  void run(const attention::LinearLayer& layer, const TensorView& xbc, const TensorView& dt,
           const TensorView& y) override;

 private:
  /// The conv + SiLU of one sequence's t xBC rows (row stride `stride`) into xbc_ [t, conv_dim];
  /// updates the conv state.
  void conv(const attention::LinearLayer& layer, float* conv_state, const float* rows,
            int64_t stride, int64_t t);
  /// One-step recurrence for one token: updates h (all heads), writes y [d_inner].
  void step(const attention::LinearLayer& layer, float* h, const float* xbc, const float* dt_raw,
            float* y) const;
  /// One-step recurrences over one sequence's t tokens (xbc_ after conv) from state h (updated);
  /// dt rows and y rows at the given strides.
  void steps(const attention::LinearLayer& layer, float* h, const float* dt_raw,
             int64_t dt_stride, int64_t t, float* y, int64_t y_stride) const;
  /// The chunked SSD scan of the same (sgemm + OpenMP over heads).
  void scan(const attention::LinearLayer& layer, float* h, const float* dt_raw, int64_t dt_stride,
            int64_t t, float* y, int64_t y_stride);
  /// A tree verify of one sequence (rows from `row` of the views).
  void tree_steps(const attention::LinearLayer& layer, const attention::LinearSeq& q, int64_t row,
                  const TensorView& xbc, const TensorView& dt, const TensorView& y);

  std::vector<float> xbc_;     ///< [rows of one sequence, conv_dim] after the conv
  std::vector<float> window_;  ///< the conv inputs of one sequence: state rows then new rows
  std::vector<float> delta_;  ///< scan: Δ [t, H]
  std::vector<float> gram_;   ///< scan: C·Bᵀ of one chunk per group [G, q, q]
  std::vector<float> work_;   ///< scan: each OpenMP thread's per-head scratch
};

/// Registers the linear kind of "cpu" in `registry`.
void register_cpu_linear_backend(attention::BackendRegistry& registry);

}  // namespace pagoda::backends
