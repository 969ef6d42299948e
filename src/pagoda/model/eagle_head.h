#pragma once
/// EagleHead: an EAGLE-style draft head (one decoder layer fed with the target's hidden states)
/// on the host: validated config and f32 weights, packed for EagleRunner (eagle_runner.h).
/// Two checkpoint layouts (docs/design/spec.md §2):
///
///   EAGLE-1 (LlamaForCausalLMEagle / yuhuili EAGLE-LLaMA*): `fc` [H, 2H] (+ `fc.bias` [H]) over
///     [embed(token) ; f], f = the target's final hidden state (after its final norm);
///     `layers.0.*` without input_layernorm; no final norm; the target's lm_head.
///       x0 = fc([e ; f]); r = x0; r += o_proj(attn(x0)); r += mlp(norm_post(r));
///       logits = lm_head(r); next hidden = r.
///   EAGLE-3 (LlamaForCausalLMEagle3): `fc` [H, 3H] over the outputs of three target layers
///     (SGLang's default low/mid/high: 1, L/2 − 1, L − 4, clamped to [0, L − 1]; or
///     config.eagle_config.eagle_aux_hidden_state_layer_ids); `midlayer.*` whose attention takes
///     [input_layernorm(e) ; hidden_norm(x0)] (2H inputs); `norm`; `lm_head` over a draft
///     vocabulary of draft_vocab_size ids with `d2t` (target id = draft id + d2t[draft id]) and
///     `t2d` (read and checked, not used).
///       x0 = fc(features) (or the head's own hidden state: no fc); r = x0;
///       r += o_proj(attn([norm_in(e) ; norm_hidden(x0)])); r += mlp(norm_post(r));
///       logits = lm_head(norm(r)); next hidden = r.
/// Both: the drafting recurrence feeds `r` of the node as the next step's hidden state; the
/// embedding (and EAGLE-1's lm_head) are the target's when the checkpoint lacks them.
/// Immutable after construction; safe to share between threads. The target must outlive it.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "pagoda/model/config.h"
#include "pagoda/model/llama.h"
#include "pagoda/model/ops.h"

namespace pagoda::model {

enum class EagleLayout : uint8_t { kEagle1, kEagle3 };

struct EagleConfig {
  EagleLayout layout = EagleLayout::kEagle3;
  int hidden_size = 0;  ///< must equal the target's
  int intermediate_size = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float rms_norm_eps = 1e-5f;
  RopeConfig rope;
  int vocab_size = 0;        ///< must equal the target's
  int draft_vocab_size = 0;  ///< lm_head rows (EAGLE-3 may be smaller; EAGLE-1: vocab_size)
  bool fc_bias = false;      ///< EAGLE-1 `fc.bias`
  /// EAGLE-3: the target layers whose outputs feed `fc` (3, ascending not required); empty =
  /// SGLang's default for the target. EAGLE-1 ignores it (the final hidden state).
  std::vector<int> aux_layers;
};

/// Parses an EAGLE head's config.json strictly: keys it does not implement are
/// Error(kUnsupported) naming them; bad values Error(kInvalidArgument) naming the key;
/// num_hidden_layers must be 1. The layout comes from `architectures`
/// (LlamaForCausalLMEagle → EAGLE-1, LlamaForCausalLMEagle3 → EAGLE-3; a plain
/// LlamaForCausalLM is EAGLE-1, as yuhuili's EAGLE-1 checkpoints declare).
EagleConfig eagle_config_from_json(const nlohmann::json& j);

/// The f32 weights of a head, HF [out, in] layout. Empty vectors mean "absent".
struct EagleWeights {
  std::vector<float> fc;           ///< [H, 2H] (EAGLE-1) or [H, 3H] (EAGLE-3)
  std::vector<float> fc_bias;      ///< [H] when config.fc_bias
  std::vector<float> input_norm;   ///< EAGLE-3 [H]
  std::vector<float> hidden_norm;  ///< EAGLE-3 [H]
  std::vector<float> q_proj, k_proj, v_proj;  ///< [Hq·D | Hkv·D, attn_in] attn_in = H or 2H
  std::vector<float> o_proj;       ///< [H, Hq·D]
  std::vector<float> post_norm;    ///< [H]
  std::vector<float> gate_proj, up_proj;  ///< [I, H]
  std::vector<float> down_proj;    ///< [H, I]
  std::vector<float> norm;         ///< EAGLE-3 [H]
  std::vector<float> embed;        ///< [V, H] or empty (the target's)
  std::vector<float> lm_head;      ///< [Vd, H] or empty (the target's; EAGLE-1 only)
  std::vector<int64_t> d2t;        ///< [Vd] or empty (identity)
};

class EagleHead {
 public:
  /// Validates `config` and `weights` against each other and against `target` (hidden size,
  /// vocabulary, aux layers in range, d2t targets in range): Error(kInvalidArgument) naming the
  /// field or tensor. `target` must outlive the head.
  EagleHead(EagleConfig config, EagleWeights weights, const LlamaModel& target);

  const EagleConfig& config() const { return config_; }
  const LlamaModel& target() const { return *target_; }
  /// The target layers whose outputs (residual stream after the layer) the head is fed, in
  /// the order fc expects: EAGLE-1 {L − 1} (the head applies the target's final norm), EAGLE-3
  /// the three aux layers.
  const std::vector<int32_t>& feature_layers() const { return feature_layers_; }
  /// Columns of one row of target features: feature_layers().size() × H.
  int64_t feature_dim() const;
  /// Columns of the attention input: H (EAGLE-1) or 2H (EAGLE-3).
  int64_t attn_in_dim() const;
  /// fc input columns as packed: EAGLE-1 2H (+1: the bias folded in as a last column), EAGLE-3 3H.
  int64_t fc_in_dim() const;
  /// Target id of draft id `d` (d2t; identity without it).
  int32_t to_target(int32_t d) const {
    return d2t_.empty() ? d : static_cast<int32_t>(d + d2t_[static_cast<size_t>(d)]);
  }

  const EagleWeights& weights() const { return w_; }
  /// fc with the bias as its last column (EAGLE-1 with fc.bias), else fc.
  const std::vector<float>& fc_packed() const { return fc_packed_; }
  const std::vector<float>& qkv_packed() const { return qkv_; }
  const std::vector<float>& gate_up_packed() const { return gate_up_; }
  /// The embedding [V, H] (the head's or the target's).
  const std::vector<float>& embed() const;
  /// The LM head [Vd, H] (the head's or the target's).
  const std::vector<float>& lm_head() const;
  const Rope& rope() const { return rope_; }

 private:
  EagleConfig config_;
  EagleWeights w_;
  const LlamaModel* target_;
  std::vector<int32_t> feature_layers_;
  std::vector<float> fc_packed_, qkv_, gate_up_;
  std::vector<int64_t> d2t_;
  Rope rope_;
};

/// Loads a head from `dir` (config.json + *.safetensors) for `target`. Tensor names as the
/// layouts above (an optional "model." prefix is accepted); any other tensor is an Error naming
/// it, as is a missing or mis-shaped one.
std::unique_ptr<EagleHead> load_eagle_head(const std::filesystem::path& dir,
                                           const LlamaModel& target);

/// A head config for `target` (head shapes = the target's, one layer; EAGLE-3 with a draft
/// vocabulary of `draft_vocab` ids, 0 = the target's).
EagleConfig eagle_config_for(const ModelConfig& target, EagleLayout layout, int draft_vocab = 0);

/// Deterministic random weights (normals as make_random_weights; no embed / EAGLE-1 lm_head, as
/// the real checkpoints; EAGLE-3 d2t maps draft id d to a seeded random distinct target id).
EagleWeights make_random_eagle_weights(const EagleConfig& config, const ModelConfig& target,
                                       uint64_t seed);

/// Writes a head folder (config.json + model.safetensors, f32; d2t as I64, t2d as BOOL).
void save_eagle_head(const std::filesystem::path& dir, const EagleConfig& config,
                     const EagleWeights& weights);

}  // namespace pagoda::model
