#pragma once
/// Mamba2Mixer: one Mamba2 (SSD) linear-attention layer, as Bamba's BambaMixer (transformers)
/// computes it; its recurrent state lives in a kv::StatePool slot per sequence
/// (docs/design/state_pool.md). Per sequence of T new tokens, rows u_t [hidden] (the layer's
/// normed input):
///
///   [z | xBC | dt] = u·W_inᵀ (+ b_in)        z [d_inner], xBC [conv_dim], dt [n_heads]
///   y_t    = the linear-attention backend's recurrence over xBC and dt (causal depthwise conv
///            with the conv state, SiLU, h_t = exp(Δ_t·A)·h_{t-1} + Δ_t·x_t ⊗ B_t,
///            y = h_t·C_t + D ⊙ x_t: attention/linear_backend.h), which advances the slot's state
///   g_t    = RMSNorm_groups(y_t ⊙ SiLU(z_t))·w_norm   (Bamba: gate, then the norm, over
///            norm_groups equal groups of d_inner: the model's n_groups, as mamba_ssm's
///            RMSNormGated and transformers' BambaRMSNormGated group it)
///   out_t  = g_t·W_outᵀ (+ b_out)
///
/// The mixer owns the projections and the gated norm (model ops: linear, add_bias,
/// gated_rms_norm); the recurrence is the backend's ("reference": fp64 per token; "cpu": f32,
/// chunked SSD scan for prefill; "cuda": f32 kernels on the GPU), chosen per layer kind
/// (backends/builtin.h make_linear_backend).
///
/// Precision and memory: u and out are the ops' dtype on the ops' device; the in projection
/// writes f32 (ModelOps::linear's f32_out), so z, xBC, dt and the backend's y are f32 whatever
/// the ops' dtype; the gated norm rounds once to the ops' dtype for the out projection. On the
/// CPU every step is f32. Scratch (the projection rows, y, the normed rows) is the mixer's, in the
/// ops' platform memory, grow-only (a growth synchronizes the platform's stream). Every step is
/// enqueued on the ops' stream (nothing synchronizes otherwise). One thread.

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "pagoda/attention/linear_backend.h"
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
  int32_t norm_groups = 1;   ///< groups of the gated RMSNorm (divides d_inner; Bamba: n_groups)
  float norm_eps = 1e-6f;
  float dt_min = 0.f;  ///< time_step_limit[0] (Δ is clamped to [dt_min, dt_max])
  float dt_max = std::numeric_limits<float>::infinity();  ///< time_step_limit[1]

  int32_t d_inner() const { return num_heads * head_dim; }
  int32_t conv_dim() const { return d_inner() + 2 * num_groups * state_size; }
  /// in_proj rows: z, xBC, dt.
  int32_t in_proj_dim() const { return d_inner() + conv_dim() + num_heads; }
  /// The recurrence's sizes (what the linear-attention backend sees).
  attention::LinearShape linear() const;
  /// The state one layer keeps per slot.
  kv::StateShape state_shape() const { return linear().state_shape(); }
  /// Throws Error(kInvalidArgument) naming the first bad field.
  void validate() const;
};

/// The mixer shape of a hybrid model's Mamba2 layers (config.mamba; the gated norm has one
/// group and rms_norm_eps, as Bamba's).
Mamba2Shape mamba2_shape(const ModelConfig& config);

/// One layer's weights (HF layouts) on the ops' device: the two projections in the ops' dtype
/// (ModelOps::upload), everything else f32 (upload_f32; on the CPU, host f32 arrays). The biases
/// may be null.
struct Mamba2Weights {
  const void* in_proj = nullptr;     ///< [in_proj_dim, hidden]
  const float* in_bias = nullptr;    ///< [in_proj_dim]
  const float* conv = nullptr;       ///< [conv_dim, conv_kernel] (conv1d.weight [conv_dim, 1, K])
  const float* conv_bias = nullptr;  ///< [conv_dim]
  const float* dt_bias = nullptr;    ///< [num_heads]
  const float* a_log = nullptr;      ///< [num_heads]
  const float* d = nullptr;          ///< [num_heads]
  const float* norm = nullptr;       ///< [d_inner]
  const void* out_proj = nullptr;    ///< [hidden, d_inner]
  const float* out_bias = nullptr;   ///< [hidden]

  /// The weights the linear-attention backend reads (conv, conv_bias, dt_bias, a_log, d).
  attention::LinearWeights linear() const {
    return {.conv = conv, .conv_bias = conv_bias, .dt_bias = dt_bias, .a_log = a_log, .d = d};
  }
};

/// One sequence of a batch (state slot, token count, optional draft-tree nodes): the
/// linear-attention backend's LinearSeq.
using Mamba2Seq = attention::LinearSeq;

class Mamba2Mixer {
 public:
  /// Throws Error(kInvalidArgument) for a bad shape (Mamba2Shape::validate), kUnsupported when
  /// `ops` lack the Mamba2 dense ops (ModelOps::supports_mamba_ops), naming the platform. `ops`
  /// must outlive the mixer.
  Mamba2Mixer(const Mamba2Shape& shape, ModelOps& ops);

  const Mamba2Shape& shape() const { return shape_; }

  /// Runs layer `layer` of the step `backend` planned (LinearAttentionBackend::
  /// init_forward_metadata over the pool and the sequences) on rows u [backend.num_tokens(),
  /// hidden] into out [backend.num_tokens(), hidden] (both the ops' dtype, contiguous, on the
  /// ops' device; `backend` runs there too, with f32 views): the in projection, the backend's
  /// recurrence on state layer `layer` (advancing each sequence's slot, or writing its node
  /// slots for a tree verify), the gated norm and the out projection. Throws Error before
  /// anything visible changes (out, the pool) when a weight other than a bias is null, and as
  /// LinearAttentionBackend::forward (no plan, a pool whose state shape is not state_shape(), a
  /// layer outside the pool). Slots not named are not touched.
  void forward(attention::LinearAttentionBackend& backend, const Mamba2Weights& w, int32_t layer,
               const void* u, void* out);

 private:
  /// Makes the scratch hold `rows` rows.
  void reserve(int64_t rows);

  Mamba2Shape shape_;
  ModelOps* ops_;
  int64_t rows_ = 0;              ///< rows the scratch holds
  platform::DeviceBuffer proj_;   ///< [rows, in_proj_dim] f32: z | xBC | dt
  platform::DeviceBuffer y_;      ///< [rows, d_inner] f32: the backend's output
  platform::DeviceBuffer normed_; ///< [rows, d_inner] ops' dtype: the gated norm's output
};

}  // namespace pagoda::model
