#include "pagoda/model/llama.h"

#include <cmath>
#include <cstring>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"

namespace pagoda::model {

namespace {

std::vector<float> concat(const std::vector<float>& a, const std::vector<float>& b,
                          const std::vector<float>& c = {}) {
  std::vector<float> out;
  out.reserve(a.size() + b.size() + c.size());
  out.insert(out.end(), a.begin(), a.end());
  out.insert(out.end(), b.begin(), b.end());
  out.insert(out.end(), c.begin(), c.end());
  return out;
}

/// A norm weight as the forward pass scales by it: w, or 1 + w (Gemma).
std::vector<float> norm_scale(const std::vector<float>& w, bool offset) {
  std::vector<float> out = w;
  if (offset)
    for (float& x : out) x += 1.f;
  return out;
}

ModelConfig validated(ModelConfig c) {
  c.validate();
  return c;
}

}  // namespace

LlamaModel::LlamaModel(ModelConfig config, const ModelWeights& weights)
    : config_(validated(std::move(config))),
      rope_(config_.rope, config_.head_dim),
      local_rope_(config_.local_rope.theta > 0.0 ? config_.local_rope : config_.rope,
                  config_.head_dim) {
  weights.validate(config_);
  const bool off = config_.norm_weight_offset;
  embed_ = weights.embed;
  lm_head_ = weights.lm_head;
  final_norm_ = norm_scale(weights.final_norm, off);
  packed_.reserve(config_.num_layers);
  for (const LayerWeights& w : weights.layers) {
    packed_.push_back(PackedLayer{
        .input_norm = norm_scale(w.input_norm, off),
        .qkv_proj = concat(w.q_proj, w.k_proj, w.v_proj),
        .qkv_bias = config_.qkv_bias ? concat(w.q_bias, w.k_bias, w.v_bias) : std::vector<float>{},
        .o_proj = w.o_proj,
        .post_norm = norm_scale(w.post_norm, off),
        .gate_up = concat(w.gate_proj, w.up_proj),
        .down_proj = w.down_proj,
        .attn_out_norm = norm_scale(w.attn_out_norm, off),
        .mlp_out_norm = norm_scale(w.mlp_out_norm, off),
        .q_norm = norm_scale(w.q_norm, off),
        .k_norm = norm_scale(w.k_norm, off),
    });
  }
  for (int l = 0; l < config_.num_layers; ++l) {
    layers_.push_back(attention::AttentionLayer{
        .layer_id = LayerId{l},
        .num_q_heads = config_.num_q_heads,
        .num_kv_heads = config_.num_kv_heads,
        .head_dim_qk = config_.head_dim,
        .head_dim_v = config_.head_dim,
        .scaling = config_.attention_scaling(),
        .logit_cap = config_.attn_logit_softcap,
        .sliding_window = config_.window_of(l),
    });
  }
}

attention::BackendRequirements LlamaModel::backend_requirements(int page_size) const {
  return attention::BackendRequirements{
      .page_size = page_size,
      .head_dim_qk = config_.head_dim,
      .head_dim_v = config_.head_dim,
      .q_dtype = DType::kF32,
      .kv_dtype = DType::kF32,
      .sliding_window = config_.has_sliding_window(),
      .logit_cap = config_.attn_logit_softcap > 0.f,
  };
}

kv::KvPoolConfig LlamaModel::kv_pool_config(int32_t num_pages, int32_t page_size) const {
  return kv::KvPoolConfig{
      .layout = kv::KvLayout::kMha,
      .num_layers = config_.num_layers,
      .num_pages = num_pages,
      .page_size = page_size,
      .dtype = DType::kF32,
      .num_kv_heads = config_.num_kv_heads,
      .head_dim = config_.head_dim,
      .head_dim_v = config_.head_dim,
  };
}

}  // namespace pagoda::model
