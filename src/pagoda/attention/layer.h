#pragma once
/// AttentionLayer: the per-layer parameters a backend consumes (sglang_spec §1.4, RadixAttention).
/// A plain value; the model owns one per layer and passes it to every forward.

#include <cstdint>
#include <span>

#include "pagoda/core/ids.h"

namespace pagoda::attention {

/// Whether a query may see keys after its own position.
enum class MaskKind : uint8_t {
  kCausal,     ///< bottom-right aligned causal (decoder)
  kNonCausal,  ///< bidirectional: every query sees the whole kv range (encoder / cross)
};

/// Whether forward() first writes the new K/V into the pool at out_cache_loc.
enum class SaveKv : uint8_t { kYes, kNo };

struct AttentionLayer {
  LayerId layer_id{0};
  int num_q_heads = 0;   ///< query heads on this rank (Hq)
  int num_kv_heads = 0;  ///< key/value heads (Hkv); Hq % Hkv == 0 (MHA, GQA, MQA)
  int head_dim_qk = 0;   ///< Dqk: q·k dimension (MLA absorbed: kv_lora_rank + rope_dim = 576)
  int head_dim_v = 0;    ///< Dv: value/output dimension (MLA absorbed: kv_lora_rank = 512)
  float scaling = 0.f;   ///< softmax scale applied to q·k (usually 1/sqrt(Dqk))
  /// Tanh soft cap: s = cap * tanh(scaling * q·k / cap); 0 disables.
  float logit_cap = 0.f;
  /// Sliding window: a query at position p sees keys in [p - W, p] (W + 1 keys, FlashInfer
  /// window_left = W); -1 disables.
  int sliding_window = -1;
  MaskKind mask = MaskKind::kCausal;
  /// Attention sinks: one learned logit per query head, added to the softmax denominator as
  /// exp(sink - max). Empty disables. Host memory for CPU backends; backends that run on a device
  /// copy it at construction or plan time. Length must be num_q_heads.
  std::span<const float> sinks{};
  /// Per-layer fp8 dequantisation scales: the pool stores k / k_scale and v / v_scale.
  float k_scale = 1.f;
  float v_scale = 1.f;
  /// MLA absorbed form: K and V share one latent head ([kv_lora_rank | rope]) in an MLA pool;
  /// V is the first head_dim_v elements of the latent. num_kv_heads must be 1.
  bool is_mla = false;
};

}  // namespace pagoda::attention
