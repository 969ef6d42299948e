#pragma once
/// Mamba2Mixer: one Mamba2 (SSD) linear-attention layer on the CPU, as Bamba's BambaMixer
/// (transformers) computes it; its recurrent state lives in a kv::StatePool slot per sequence
/// (docs/design/state_pool.md). Per sequence of T new tokens, rows u_t [hidden] (the layer's
/// normed input):
///
///   [z | xBC | dt] = u·W_inᵀ (+ b_in)        z [d_inner], xBC [conv_dim], dt [n_heads]
///   xBC_t  = SiLU(b_conv + Σ_k w_conv[:, k] ⊙ xBC_{t-K+1+k})   causal depthwise conv, K = d_conv,
///            inputs before this call's first token read from the conv state (zero when fresh)
///   x | B | C = xBC_t                          x [n_heads, head_dim], B, C [n_groups, d_state];
///                                              head h reads group h / (n_heads / n_groups)
///   Δ_t    = clamp(softplus(dt_t + dt_bias), dt_min, dt_max),  A = -exp(A_log)   per head
///   h_t    = exp(Δ_t·A)·h_{t-1} + Δ_t·x_t ⊗ B_t                 [head_dim, d_state] per head
///   y_t    = h_t·C_t + D ⊙ x_t
///   g_t    = RMSNorm_groups(y_t ⊙ SiLU(z_t))·w_norm   (Bamba: gate, then the norm, over
///            norm_groups equal groups of d_inner; Bamba has 1 group)
///   out_t  = g_t·W_outᵀ (+ b_out)
///
/// The state after the call's last token is written back to the slot: the conv state keeps the
/// last d_conv - 1 xBC inputs (pre-conv), the SSM state h_T. A sequence of one token takes the
/// one-step recurrence (decode); a longer one the chunked SSD form (prefill / extend): chunks of
/// chunk_size tokens from the call's first token, each computing its outputs as a masked
/// "attention" inside the chunk, y_t = Σ_{s<=t} exp(cumA_t - cumA_s)·(C_t·B_s)·Δ_s·x_s, plus
/// exp(cumA_t)·(h_start·C_t) from the state entering the chunk, and passing
/// exp(cumA_L)·h_start + Σ_s exp(cumA_L - cumA_s)·Δ_s·x_s ⊗ B_s to the next. Both forms are the
/// same recurrence: prefill of T tokens equals T decode steps and any split into calls.
///
/// Precision: f32 storage and arithmetic (the state as SGLang's default float32).
/// Host memory only: the projections run through the CPU ModelOps (f32); the scan is plain C++.
/// One thread.

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "pagoda/kv/state_pool.h"
#include "pagoda/model/config.h"
#include "pagoda/model/model_ops.h"

namespace pagoda::model {

/// The sizes of one Mamba2 mixer (Bamba's mamba_* config fields).
struct Mamba2Shape {
  int32_t hidden_size = 0;
  int32_t num_heads = 0;     ///< mamba_n_heads
  int32_t head_dim = 0;      ///< mamba_d_head; d_inner = num_heads · head_dim
  int32_t state_size = 0;    ///< mamba_d_state
  int32_t num_groups = 1;    ///< mamba_n_groups (divides num_heads)
  int32_t conv_kernel = 4;   ///< mamba_d_conv (>= 1)
  int32_t chunk_size = 256;  ///< mamba_chunk_size
  int32_t norm_groups = 1;   ///< groups of the gated RMSNorm (divides d_inner; Bamba: 1)
  float norm_eps = 1e-6f;
  float dt_min = 0.f;  ///< time_step_limit[0] (Δ is clamped to [dt_min, dt_max])
  float dt_max = std::numeric_limits<float>::infinity();  ///< time_step_limit[1]

  int32_t d_inner() const { return num_heads * head_dim; }
  int32_t conv_dim() const { return d_inner() + 2 * num_groups * state_size; }
  /// in_proj rows: z, xBC, dt.
  int32_t in_proj_dim() const { return d_inner() + conv_dim() + num_heads; }
  /// The state one layer keeps per slot.
  kv::StateShape state_shape() const;
  /// Throws Error(kInvalidArgument) naming the first bad field.
  void validate() const;
};

/// The mixer shape of a hybrid model's Mamba2 layers (config.mamba; the gated norm has one
/// group and rms_norm_eps, as Bamba's).
Mamba2Shape mamba2_shape(const ModelConfig& config);

/// One layer's weights (host f32, HF layouts); the biases may be null.
struct Mamba2Weights {
  const float* in_proj = nullptr;    ///< [in_proj_dim, hidden]
  const float* in_bias = nullptr;    ///< [in_proj_dim]
  const float* conv = nullptr;       ///< [conv_dim, conv_kernel] (conv1d.weight [conv_dim, 1, K])
  const float* conv_bias = nullptr;  ///< [conv_dim]
  const float* dt_bias = nullptr;    ///< [num_heads]
  const float* a_log = nullptr;      ///< [num_heads]
  const float* d = nullptr;          ///< [num_heads]
  const float* norm = nullptr;       ///< [d_inner]
  const float* out_proj = nullptr;   ///< [hidden, d_inner]
  const float* out_bias = nullptr;   ///< [hidden]
};

/// One sequence of a batch: its state slot and how many of the batch's rows are its new
/// tokens (consecutive rows, sequences in order).
struct Mamba2Seq {
  int32_t slot = 0;
  int32_t num_tokens = 0;
  /// A tree verify (speculative decoding) when not empty: num_tokens slots, one per token
  /// (a draft-tree node), and each node's parent among them (-1 for the first, the root, whose
  /// parent state is `slot`'s; otherwise an earlier node). Node t's state is its parent's
  /// advanced by token t (one recurrence step) and goes to node_slots[t]; `slot` is only read,
  /// so a rejected draft costs nothing and the caller keeps the state of the last accepted node.
  std::span<const int32_t> node_slots;
  std::span<const int32_t> node_parents;
};

class Mamba2Mixer {
 public:
  /// Throws Error(kInvalidArgument) for a bad shape (Mamba2Shape::validate). `ops` must be the
  /// CPU ops (host f32) and outlive the mixer.
  Mamba2Mixer(const Mamba2Shape& shape, ModelOps& ops);

  const Mamba2Shape& shape() const { return shape_; }

  /// Runs the mixer for `seqs` (rows u [Σ num_tokens, hidden]) into out [Σ num_tokens,
  /// hidden], reading and updating layer `layer`'s state of each sequence's slot in `pool` (a
  /// tree verify: writing its node slots instead, Mamba2Seq::node_slots). Throws Error (nothing
  /// changed) when the pool's state shape is not state_shape(), a slot is not held or named
  /// twice (node slots included), a count is < 1, node slots or parents do not match the
  /// count, a parent is not an earlier node (the first's is -1), or a weight other than a bias
  /// is null. Slots not named are not touched.
  void forward(const Mamba2Weights& w, kv::StatePool& pool, int32_t layer,
               std::span<const Mamba2Seq> seqs, const float* u, float* out);

 private:
  /// The conv + SiLU of one sequence's xBC rows (inside proj_, row stride in_proj_dim) into
  /// xbc_ [T, conv_dim]; updates the conv state.
  void conv(const Mamba2Weights& w, float* conv_state, const float* rows, int64_t t);
  /// One-step recurrence for one token: updates h (all heads), writes y [d_inner].
  void step(const Mamba2Weights& w, float* h, const float* xbc, const float* dt_raw, float* y);
  /// A tree verify of one sequence (its proj_ rows from `row`, y rows from `y`): node by node,
  /// the parent's state copied into the node's slot, then one conv and recurrence step there.
  void tree_steps(const Mamba2Weights& w, kv::StatePool& pool, int32_t layer, const Mamba2Seq& q,
                  const float* row, float* y);
  /// The chunked SSD scan of one sequence's t tokens from state h (updated), y [t, d_inner].
  void scan(const Mamba2Weights& w, float* h, const float* dt_raw, int64_t t, float* y);
  /// y ⊙ SiLU(z), then the grouped RMSNorm times w_norm, in place on rows of y.
  void gated_norm(const Mamba2Weights& w, float* y, int64_t rows) const;

  Mamba2Shape shape_;
  ModelOps* ops_;
  std::vector<float> proj_;    ///< [rows, in_proj_dim]
  std::vector<float> xbc_;     ///< [rows of one sequence, conv_dim] after the conv
  std::vector<float> y_;       ///< [rows, d_inner]
  std::vector<float> window_;  ///< the conv inputs of one sequence: state rows then new rows
  std::vector<float> delta_, cum_, gram_;  ///< scan scratch: Δ, cumulative Δ·A, C·B per chunk
};

}  // namespace pagoda::model
