#include "pagoda/model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"

namespace pagoda::model {

namespace {

template <typename T>
std::vector<T> concat(const std::vector<T>& a, const std::vector<T>& b,
                      const std::vector<T>& c = {}) {
  std::vector<T> out;
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

/// Partial RoPE (rotary_dim r < head_dim d: NeoX pairs (i, i + r/2) for i < r/2, the last d - r
/// dims unrotated) laid out for the full-width NeoX RoPE, whose pairs are (j, j + d/2): each
/// head's rows of a q or k projection [heads·d, cols] are reordered so that new row j < r/2 is
/// old row j, new row d/2 + j is old row r/2 + j, and the d - r unrotated rows fill the rest in
/// order. Rope(config, d, r) gives the pairs past r/2 frequency 0. q and k of a head are
/// permuted alike, so every q·k (the only use of q and k) is unchanged.
template <typename T>
void permute_partial_rope(std::vector<T>& w, int heads, int d, int r, int64_t cols) {
  std::vector<int> from(static_cast<size_t>(d));  // new row -> old row within a head
  const int half = d / 2, rh = r / 2, pass = half - rh;
  for (int j = 0; j < rh; ++j) {
    from[static_cast<size_t>(j)] = j;
    from[static_cast<size_t>(half + j)] = rh + j;
  }
  for (int j = 0; j < pass; ++j) {
    from[static_cast<size_t>(rh + j)] = r + j;
    from[static_cast<size_t>(half + rh + j)] = r + pass + j;
  }
  const std::vector<T> old = w;
  for (int h = 0; h < heads; ++h)
    for (int j = 0; j < d; ++j)
      std::copy_n(old.begin() + (int64_t{h} * d + from[static_cast<size_t>(j)]) * cols, cols,
                  w.begin() + (int64_t{h} * d + j) * cols);
}

template <typename T>
void release(std::vector<T>& v) {
  std::vector<T>().swap(v);
}

/// q, k and v fused into one [(Hq + 2 Hkv) D, hidden] matrix (q's and k's rows first permuted
/// for a partial RoPE), each freed once fused; empty when q is (the other form, Mamba2 layers).
template <typename T>
std::vector<T> fuse_qkv(std::vector<T>& q, std::vector<T>& k, std::vector<T>& v,
                        const ModelConfig& c) {
  const int d = c.head_dim, r = c.rotary_dim;
  if (r > 0 && r < d && !q.empty()) {
    permute_partial_rope(q, c.num_q_heads, d, r, c.hidden_size);
    permute_partial_rope(k, c.num_kv_heads, d, r, c.hidden_size);
  }
  std::vector<T> out = concat(q, k, v);
  release(q);
  release(k);
  release(v);
  return out;
}

/// a's rows then b's (gate / up), both freed once fused.
template <typename T>
std::vector<T> fuse(std::vector<T>& a, std::vector<T>& b) {
  std::vector<T> out = concat(a, b);
  release(a);
  release(b);
  return out;
}

/// Moves a bf16 matrix into its f32 field, widened (a fused group whose matrices the checkpoint
/// stored in different dtypes is packed in f32).
void widen_into(std::vector<uint16_t>& bf16, std::vector<float>& f32) {
  if (bf16.empty()) return;
  f32 = widened_bf16(bf16);
  release(bf16);
}

ModelConfig validated(ModelConfig c) {
  c.validate();
  return c;
}

}  // namespace

LlamaModel::LlamaModel(ModelConfig config, ModelWeights weights)
    : config_(validated(std::move(config))),
      rope_(config_.rope, config_.rope_dim(), config_.rotary_dim),
      local_rope_(config_.local_rope.theta > 0.0 ? config_.local_rope : config_.rope,
                  config_.rope_dim(), config_.rotary_dim) {
  weights.validate(config_);
  const bool off = config_.norm_weight_offset;
  embed_ = std::move(weights.embed);
  lm_head_ = std::move(weights.lm_head);
  embed16_ = std::move(weights.embed_bf16);
  lm_head16_ = std::move(weights.lm_head_bf16);
  final_norm_ = norm_scale(weights.final_norm, off);
  packed_.reserve(config_.num_layers);
  // Each layer's matrices are moved or freed once packed (pack_mla reads its own fields first).
  for (LayerWeights& w : weights.layers) {
    if (config_.is_mla()) pack_mla(w, packed_.emplace_back());
    Bf16Matrices& b = w.bf16;
    // A fused group stays bf16 only when the checkpoint stored each of its matrices in bf16;
    // after this each matrix is in one form, the other empty.
    if (b.q_proj.empty() || b.k_proj.empty() || b.v_proj.empty()) {
      widen_into(b.q_proj, w.q_proj);
      widen_into(b.k_proj, w.k_proj);
      widen_into(b.v_proj, w.v_proj);
    }
    if (b.gate_proj.empty() || b.up_proj.empty()) {
      widen_into(b.gate_proj, w.gate_proj);
      widen_into(b.up_proj, w.up_proj);
    }
    if (!config_.is_mla()) packed_.emplace_back();
    PackedLayer& p = packed_.back();
    p.input_norm = norm_scale(w.input_norm, off);
    if (config_.is_mla()) {
      release(w.q_proj);  // pack_mla read it (no q LoRA)
    } else {
      p.qkv_proj = fuse_qkv(w.q_proj, w.k_proj, w.v_proj, config_);
      p.bf16.qkv_proj = fuse_qkv(b.q_proj, b.k_proj, b.v_proj, config_);
    }
    if (config_.qkv_bias) p.qkv_bias = concat(w.q_bias, w.k_bias, w.v_bias);
    p.o_proj = std::move(w.o_proj);
    p.bf16.o_proj = std::move(b.o_proj);
    p.post_norm = norm_scale(w.post_norm, off);
    p.gate_up = fuse(w.gate_proj, w.up_proj);
    p.bf16.gate_up = fuse(b.gate_proj, b.up_proj);
    p.down_proj = std::move(w.down_proj);
    p.bf16.down_proj = std::move(b.down_proj);
    p.attn_out_norm = norm_scale(w.attn_out_norm, off);
    p.mlp_out_norm = norm_scale(w.mlp_out_norm, off);
    p.q_norm = norm_scale(w.q_norm, off);
    p.k_norm = norm_scale(w.k_norm, off);
    p.ssm_in_proj = std::move(w.ssm_in_proj);
    p.ssm_in_bias = w.ssm_in_bias;
    p.ssm_conv = w.ssm_conv;
    p.ssm_conv_bias = w.ssm_conv_bias;
    p.ssm_dt_bias = w.ssm_dt_bias;
    p.ssm_a_log = w.ssm_a_log;
    p.ssm_d = w.ssm_d;
    p.ssm_norm = w.ssm_norm;
    p.ssm_out_proj = std::move(w.ssm_out_proj);
    p.ssm_out_bias = w.ssm_out_bias;
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
    if (config_.is_mla()) {  // the absorbed form over the latent pool
      attention::AttentionLayer& a = layers_.back();
      a.num_kv_heads = 1;
      a.head_dim_qk = config_.mla.kv_lora_rank + config_.mla.qk_rope_head_dim;
      a.head_dim_v = config_.mla.kv_lora_rank;
      a.is_mla = true;
    }
  }
}

void LlamaModel::pack_mla(const LayerWeights& w, PackedLayer& p) const {
  const MlaConfig& m = config_.mla;
  const int64_t hq = config_.num_q_heads, r = m.kv_lora_rank, nope = m.qk_nope_head_dim;
  const int64_t dv = m.v_head_dim;
  p.qkv_proj.clear();
  p.q_a_proj = w.q_a_proj;
  p.q_a_norm = w.q_a_norm;
  p.q_proj = m.q_lora_rank > 0 ? w.q_b_proj : w.q_proj;
  p.kv_a_proj = w.kv_a_proj;
  p.kv_a_norm = w.kv_a_norm;
  p.idx_wq_b = w.idx_wq_b;
  p.idx_wk = w.idx_wk;
  p.idx_k_norm = w.idx_k_norm;
  p.idx_k_norm_bias = w.idx_k_norm_bias;
  p.idx_weights_proj = w.idx_weights_proj;
  p.w_uk_t.resize(static_cast<size_t>(hq * r * nope));
  p.w_uk.resize(static_cast<size_t>(hq * nope * r));
  p.w_uv.resize(static_cast<size_t>(hq * dv * r));
  for (int64_t h = 0; h < hq; ++h) {
    const float* rows = w.kv_b_proj.data() + h * (nope + dv) * r;  // [nope + v, r] of head h
    float* uk = p.w_uk_t.data() + h * r * nope;
    for (int64_t i = 0; i < nope; ++i)
      for (int64_t c = 0; c < r; ++c) uk[c * nope + i] = rows[i * r + c];
    std::copy(rows, rows + nope * r, p.w_uk.begin() + h * nope * r);
    std::copy(rows + nope * r, rows + (nope + dv) * r, p.w_uv.begin() + h * dv * r);
  }
}

attention::BackendRequirements LlamaModel::backend_requirements(int page_size) const {
  attention::BackendRequirements req{
      .page_size = page_size,
      .head_dim_qk = config_.head_dim,
      .head_dim_v = config_.head_dim,
      .q_dtype = DType::kF32,
      .kv_dtype = DType::kF32,
      .sliding_window = config_.has_sliding_window(),
      .logit_cap = config_.attn_logit_softcap > 0.f,
  };
  if (config_.is_mla()) {
    req.head_dim_qk = config_.mla.kv_lora_rank + config_.mla.qk_rope_head_dim;
    req.head_dim_v = config_.mla.kv_lora_rank;
    req.mla = true;
    req.dsa = config_.is_dsa();
    req.dsa_indexer = config_.is_dsa();
  }
  return req;
}

LayerId LlamaModel::pool_layer(int l, bool split) const {
  PAGODA_REQUIRE(l >= 0 && l < config_.num_layers, kOutOfRange, "layer {} of a {}-layer model",
                 l, config_.num_layers);
  if (config_.has_linear_layers()) {  // the KV pool holds the attention layers only
    PAGODA_REQUIRE(!config_.is_linear_layer(l), kInvalidArgument,
                   "layer {} is a Mamba2 layer: it has no KV pool layer", l);
    int rank = 0;
    for (int i = 0; i < l; ++i) rank += !config_.is_linear_layer(i);
    return LayerId{rank};
  }
  if (!split) return LayerId{l};
  const bool window = config_.window_of(l) >= 0;
  int rank = 0;
  for (int i = 0; i < l; ++i) rank += (config_.window_of(i) >= 0) == window;
  return LayerId{rank};
}

bool LlamaModel::has_bf16_weights() const {
  if (!embed16_.empty() || !lm_head16_.empty()) return true;
  for (const PackedLayer& p : packed_)
    if (!p.bf16.qkv_proj.empty() || !p.bf16.o_proj.empty() || !p.bf16.gate_up.empty() ||
        !p.bf16.down_proj.empty())
      return true;
  return false;
}

int64_t LlamaModel::weight_elements() const {
  auto n = [](const std::vector<float>& v) { return static_cast<int64_t>(v.size()); };
  int64_t total = n(embed_) + n(lm_head_) + n(final_norm_) +
                  static_cast<int64_t>(embed16_.size() + lm_head16_.size());
  for (const PackedLayer& p : packed_) {
    for (const std::vector<float>* v : {&p.input_norm,    &p.qkv_proj,        &p.qkv_bias,
                                        &p.o_proj,        &p.post_norm,       &p.gate_up,
                                        &p.down_proj,     &p.attn_out_norm,   &p.mlp_out_norm,
                                        &p.q_norm,        &p.k_norm,          &p.q_a_proj,
                                        &p.q_a_norm,      &p.q_proj,          &p.kv_a_proj,
                                        &p.kv_a_norm,     &p.w_uk_t,          &p.w_uk,
                                        &p.w_uv,          &p.idx_wq_b,        &p.idx_wk,
                                        &p.idx_k_norm,    &p.idx_k_norm_bias, &p.idx_weights_proj,
                                        &p.ssm_in_proj,   &p.ssm_in_bias,     &p.ssm_conv,
                                        &p.ssm_conv_bias, &p.ssm_dt_bias,     &p.ssm_a_log,
                                        &p.ssm_d,         &p.ssm_norm,        &p.ssm_out_proj,
                                        &p.ssm_out_bias})
      total += n(*v);
    for (const std::vector<uint16_t>* v :
         {&p.bf16.qkv_proj, &p.bf16.o_proj, &p.bf16.gate_up, &p.bf16.down_proj})
      total += static_cast<int64_t>(v->size());
  }
  return total;
}

kv::KvPoolConfig LlamaModel::kv_pool_config(int32_t num_pages, int32_t page_size,
                                            PoolLayers which) const {
  int32_t layers = config_.num_attention_layers();
  if (which != PoolLayers::kAll) {
    layers = 0;
    for (int l = 0; l < config_.num_layers; ++l)
      layers += (config_.window_of(l) >= 0) == (which == PoolLayers::kWindow);
  }
  if (config_.is_mla())
    return kv::KvPoolConfig{.layout = kv::KvLayout::kMla,
                            .num_layers = layers,
                            .num_pages = num_pages,
                            .page_size = page_size,
                            .dtype = DType::kF32,
                            .kv_lora_rank = config_.mla.kv_lora_rank,
                            .rope_dim = config_.mla.qk_rope_head_dim,
                            .index_head_dim = config_.dsa.index_head_dim};
  return kv::KvPoolConfig{
      .layout = kv::KvLayout::kMha,
      .num_layers = layers,
      .num_pages = num_pages,
      .page_size = page_size,
      .dtype = DType::kF32,
      .num_kv_heads = config_.num_kv_heads,
      .head_dim = config_.head_dim,
      .head_dim_v = config_.head_dim,
  };
}

}  // namespace pagoda::model
