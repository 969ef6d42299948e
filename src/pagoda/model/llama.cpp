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

ModelConfig validated(ModelConfig c) {
  c.validate();
  return c;
}

}  // namespace

LlamaModel::LlamaModel(ModelConfig config, const ModelWeights& weights)
    : config_(validated(std::move(config))), rope_(config_.rope, config_.head_dim) {
  weights.validate(config_);
  embed_ = weights.embed;
  lm_head_ = weights.lm_head;
  final_norm_ = weights.final_norm;
  packed_.reserve(config_.num_layers);
  for (const LayerWeights& w : weights.layers) {
    packed_.push_back(PackedLayer{
        .input_norm = w.input_norm,
        .qkv_proj = concat(w.q_proj, w.k_proj, w.v_proj),
        .qkv_bias = config_.qkv_bias ? concat(w.q_bias, w.k_bias, w.v_bias) : std::vector<float>{},
        .o_proj = w.o_proj,
        .post_norm = w.post_norm,
        .gate_up = concat(w.gate_proj, w.up_proj),
        .down_proj = w.down_proj,
    });
  }
  for (int l = 0; l < config_.num_layers; ++l) {
    layers_.push_back(attention::AttentionLayer{
        .layer_id = LayerId{l},
        .num_q_heads = config_.num_q_heads,
        .num_kv_heads = config_.num_kv_heads,
        .head_dim_qk = config_.head_dim,
        .head_dim_v = config_.head_dim,
        .scaling = static_cast<float>(1.0 / std::sqrt(static_cast<double>(config_.head_dim))),
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

void LlamaModel::forward(const attention::ForwardBatch& batch, std::span<const int32_t> input_ids,
                         attention::AttentionBackend& backend,
                         std::span<const int32_t> logit_rows, std::span<float> logits) {
  const int64_t t = batch.num_tokens();
  const int64_t hd = config_.hidden_size;
  const int64_t vocab = config_.vocab_size;
  const int64_t hq = config_.num_q_heads, hkv = config_.num_kv_heads, d = config_.head_dim;
  const int64_t inter = config_.intermediate_size;
  const int64_t qkv_w = (hq + 2 * hkv) * d;
  PAGODA_REQUIRE(static_cast<int64_t>(input_ids.size()) == t, kInvalidArgument,
                 "{} input ids for a batch of {} tokens", input_ids.size(), t);
  PAGODA_REQUIRE(static_cast<int64_t>(batch.positions.size()) == t, kInvalidArgument,
                 "{} positions for a batch of {} tokens", batch.positions.size(), t);
  PAGODA_REQUIRE(static_cast<int64_t>(logits.size()) ==
                     static_cast<int64_t>(logit_rows.size()) * vocab,
                 kInvalidArgument, "logits buffer has {} floats, need {} rows x {}",
                 logits.size(), logit_rows.size(), vocab);
  for (int32_t id : input_ids)
    PAGODA_REQUIRE(id >= 0 && id < vocab, kOutOfRange, "token id {} outside [0, {})", id, vocab);
  for (int32_t r : logit_rows)
    PAGODA_REQUIRE(r >= 0 && r < t, kOutOfRange, "logit row {} outside [0, {})", r, t);
  if (batch.mode == attention::ForwardMode::kIdle || t == 0) return;

  x_.resize(t * hd);
  h_.resize(t * hd);
  qkv_.resize(t * qkv_w);
  q_.resize(t * hq * d);
  k_.resize(t * hkv * d);
  v_.resize(t * hkv * d);
  attn_.resize(t * hq * d);
  mlp_.resize(t * 2 * inter);
  act_.resize(t * inter);
  for (int64_t i = 0; i < t; ++i)
    std::memcpy(&x_[i * hd], &embed_[input_ids[i] * hd], hd * sizeof(float));

  const TensorView q_view(q_.data(), DType::kF32, {t, hq, d});
  const TensorView k_view(k_.data(), DType::kF32, {t, hkv, d});
  const TensorView v_view(v_.data(), DType::kF32, {t, hkv, d});
  const TensorView o_view(attn_.data(), DType::kF32, {t, hq, d});
  for (int l = 0; l < config_.num_layers; ++l) {
    const PackedLayer& w = packed_[l];
    rms_norm(x_.data(), w.input_norm.data(), h_.data(), t, hd, config_.rms_norm_eps);
    linear(h_.data(), w.qkv_proj.data(), qkv_.data(), t, qkv_w, hd);
    if (!w.qkv_bias.empty()) {
      for (int64_t i = 0; i < t; ++i) {
        float* row = &qkv_[i * qkv_w];
        for (int64_t j = 0; j < qkv_w; ++j) row[j] += w.qkv_bias[j];
      }
    }
    for (int64_t i = 0; i < t; ++i) {
      const float* row = &qkv_[i * qkv_w];
      std::memcpy(&q_[i * hq * d], row, hq * d * sizeof(float));
      std::memcpy(&k_[i * hkv * d], row + hq * d, hkv * d * sizeof(float));
      std::memcpy(&v_[i * hkv * d], row + (hq + hkv) * d, hkv * d * sizeof(float));
    }
    rope_.apply(q_.data(), batch.positions, static_cast<int>(hq));
    rope_.apply(k_.data(), batch.positions, static_cast<int>(hkv));
    backend.forward(q_view, k_view, v_view, layers_[l], batch, o_view);
    linear(attn_.data(), w.o_proj.data(), x_.data(), t, hd, hq * d, 1.f);
    rms_norm(x_.data(), w.post_norm.data(), h_.data(), t, hd, config_.rms_norm_eps);
    linear(h_.data(), w.gate_up.data(), mlp_.data(), t, 2 * inter, hd);
    silu_mul(mlp_.data(), act_.data(), t, inter);
    linear(act_.data(), w.down_proj.data(), x_.data(), t, hd, inter, 1.f);
  }

  const int64_t rows = static_cast<int64_t>(logit_rows.size());
  sel_.resize(rows * hd);
  for (int64_t r = 0; r < rows; ++r)
    rms_norm(&x_[logit_rows[r] * hd], final_norm_.data(), &sel_[r * hd], 1, hd,
             config_.rms_norm_eps);
  const float* head = lm_head_.empty() ? embed_.data() : lm_head_.data();
  linear(sel_.data(), head, logits.data(), rows, vocab, hd);
  if (config_.final_logit_softcap > 0.f)
    soft_cap(logits.data(), rows * vocab, config_.final_logit_softcap);
}

}  // namespace pagoda::model
