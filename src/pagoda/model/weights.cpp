#include "pagoda/model/weights.h"

#include <cmath>
#include <string>

#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"
#include "pagoda/model/splitmix.h"

namespace pagoda::model {

namespace {

using Rng = SplitMix64;

std::vector<float> normal_vec(Rng& rng, int64_t n, double mean, double stddev) {
  return rng.normals(n, mean, stddev);
}

void require_size(const std::vector<float>& v, int64_t expected, const std::string& name) {
  PAGODA_REQUIRE(static_cast<int64_t>(v.size()) == expected, kInvalidArgument,
                 "weight {} has {} elements, expected {}", name, v.size(), expected);
}

/// A dense GEMM matrix in f32 or in bf16 (Bf16Matrices): one form holds `expected` values, the
/// other none.
void require_matrix(const std::vector<float>& f32, const std::vector<uint16_t>& bf16,
                    int64_t expected, const std::string& name) {
  if (bf16.empty()) return require_size(f32, expected, name);
  PAGODA_REQUIRE(f32.empty(), kInvalidArgument, "weight {} is given both in f32 and in bf16", name);
  PAGODA_REQUIRE(static_cast<int64_t>(bf16.size()) == expected, kInvalidArgument,
                 "weight {} has {} bf16 elements, expected {}", name, bf16.size(), expected);
}

/// The MLA tensors of one layer (q LoRA or q_proj, kv_a / kv_b, o_proj [hidden, Hq·v]).
void validate_mla(const ModelConfig& c, const LayerWeights& w, const std::string& p) {
  const MlaConfig& m = c.mla;
  const int64_t h = c.hidden_size, hq = c.num_q_heads, qr = m.q_lora_rank;
  const int64_t qk = int64_t{m.qk_nope_head_dim} + m.qk_rope_head_dim;
  require_size(w.q_proj, qr > 0 ? 0 : hq * qk * h, p + "q_proj");
  require_size(w.q_a_proj, qr * h, p + "q_a_proj");
  require_size(w.q_a_norm, qr, p + "q_a_layernorm");
  require_size(w.q_b_proj, qr > 0 ? hq * qk * qr : 0, p + "q_b_proj");
  require_size(w.kv_a_proj, (int64_t{m.kv_lora_rank} + m.qk_rope_head_dim) * h,
               p + "kv_a_proj_with_mqa");
  require_size(w.kv_a_norm, m.kv_lora_rank, p + "kv_a_layernorm");
  require_size(w.kv_b_proj, hq * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank,
               p + "kv_b_proj");
  require_size(w.o_proj, h * hq * m.v_head_dim, p + "o_proj");
  const int64_t ih = c.dsa.index_n_heads, id = c.dsa.index_head_dim;
  require_size(w.idx_wq_b, ih * id * qr, p + "indexer.wq_b");
  require_size(w.idx_wk, id * h, p + "indexer.wk");
  require_size(w.idx_k_norm, id, p + "indexer.k_norm.weight");
  require_size(w.idx_k_norm_bias, id, p + "indexer.k_norm.bias");
  require_size(w.idx_weights_proj, ih * h, p + "indexer.weights_proj");
}

/// Random MLA tensors for every layer (drawn after everything else).
void random_mla(const ModelConfig& c, Rng& rng, ModelWeights& w, double norm_mean) {
  const MlaConfig& m = c.mla;
  const int64_t h = c.hidden_size, hq = c.num_q_heads, qr = m.q_lora_rank;
  const int64_t qk = int64_t{m.qk_nope_head_dim} + m.qk_rope_head_dim;
  const int64_t kva = int64_t{m.kv_lora_rank} + m.qk_rope_head_dim;
  const double in_h = 1.0 / std::sqrt(static_cast<double>(h));
  for (LayerWeights& l : w.layers) {
    l.q_proj.clear();
    l.k_proj.clear();
    l.v_proj.clear();
    if (qr > 0) {
      l.q_a_proj = normal_vec(rng, qr * h, 0.0, in_h);
      l.q_a_norm = normal_vec(rng, qr, norm_mean, 0.1);
      l.q_b_proj = normal_vec(rng, hq * qk * qr, 0.0, 1.0 / std::sqrt(double(qr)));
    } else {
      l.q_proj = normal_vec(rng, hq * qk * h, 0.0, in_h);
    }
    l.kv_a_proj = normal_vec(rng, kva * h, 0.0, in_h);
    l.kv_a_norm = normal_vec(rng, m.kv_lora_rank, norm_mean, 0.1);
    l.kv_b_proj = normal_vec(rng, hq * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank, 0.0,
                             1.0 / std::sqrt(double(m.kv_lora_rank)));
    l.o_proj = normal_vec(rng, h * hq * m.v_head_dim, 0.0,
                          1.0 / std::sqrt(static_cast<double>(hq * m.v_head_dim)));
  }
  if (!c.is_dsa()) return;
  const int64_t ih = c.dsa.index_n_heads, id = c.dsa.index_head_dim;
  for (LayerWeights& l : w.layers) {
    l.idx_wq_b = normal_vec(rng, ih * id * qr, 0.0, 1.0 / std::sqrt(double(qr)));
    l.idx_wk = normal_vec(rng, id * h, 0.0, in_h);
    l.idx_k_norm = normal_vec(rng, id, 1.0, 0.1);
    l.idx_k_norm_bias = normal_vec(rng, id, 0.0, 0.1);
    l.idx_weights_proj = normal_vec(rng, ih * h, 0.0, in_h);
  }
}

/// The Mamba2 tensors of one layer (empty on an attention layer).
void validate_mamba(const ModelConfig& c, const LayerWeights& w, const std::string& p, bool on) {
  const MambaConfig& m = c.mamba;
  const int64_t h = on ? c.hidden_size : 0, di = m.d_inner(), cd = m.conv_dim();
  const int64_t proj = di + cd + m.num_heads, nh = on ? m.num_heads : 0;
  require_size(w.ssm_in_proj, proj * h, p + "mamba.in_proj.weight");
  require_size(w.ssm_in_bias, on && m.proj_bias ? proj : 0, p + "mamba.in_proj.bias");
  require_size(w.ssm_conv, on ? cd * m.conv_kernel : 0, p + "mamba.conv1d.weight");
  require_size(w.ssm_conv_bias, on && m.conv_bias ? cd : 0, p + "mamba.conv1d.bias");
  require_size(w.ssm_dt_bias, nh, p + "mamba.dt_bias");
  require_size(w.ssm_a_log, nh, p + "mamba.A_log");
  require_size(w.ssm_d, nh, p + "mamba.D");
  require_size(w.ssm_norm, on ? di : 0, p + "mamba.norm.weight");
  require_size(w.ssm_out_proj, h * di, p + "mamba.out_proj.weight");
  require_size(w.ssm_out_bias, on && m.proj_bias ? h : 0, p + "mamba.out_proj.bias");
}

/// Random Mamba2 tensors for the linear layers (drawn after everything else); their attention
/// tensors are dropped.
void random_mamba(const ModelConfig& c, Rng& rng, ModelWeights& w) {
  const MambaConfig& m = c.mamba;
  const int64_t h = c.hidden_size, di = m.d_inner(), cd = m.conv_dim();
  const int64_t proj = di + cd + m.num_heads;
  for (int l = 0; l < c.num_layers; ++l) {
    if (!c.is_linear_layer(l)) continue;
    LayerWeights& x = w.layers[static_cast<size_t>(l)];
    x.q_proj.clear();
    x.k_proj.clear();
    x.v_proj.clear();
    x.o_proj.clear();
    x.ssm_in_proj = normal_vec(rng, proj * h, 0.0, 1.0 / std::sqrt(double(h)));
    if (m.proj_bias) x.ssm_in_bias = normal_vec(rng, proj, 0.0, 0.1);
    x.ssm_conv = normal_vec(rng, cd * m.conv_kernel, 0.0, 1.0 / std::sqrt(double(m.conv_kernel)));
    if (m.conv_bias) x.ssm_conv_bias = normal_vec(rng, cd, 0.0, 0.1);
    x.ssm_dt_bias = normal_vec(rng, m.num_heads, -1.0, 0.5);
    x.ssm_a_log.resize(static_cast<size_t>(m.num_heads));
    for (float& a : x.ssm_a_log) a = static_cast<float>(std::log(1.0 + 15.0 * rng.uniform()));
    x.ssm_d = normal_vec(rng, m.num_heads, 1.0, 0.1);
    x.ssm_norm = normal_vec(rng, di, 1.0, 0.1);
    x.ssm_out_proj = normal_vec(rng, h * di, 0.0, 1.0 / std::sqrt(double(di)));
    if (m.proj_bias) x.ssm_out_bias = normal_vec(rng, h, 0.0, 0.1);
  }
}

}  // namespace

void ModelWeights::validate(const ModelConfig& c) const {
  const int64_t h = c.hidden_size;
  const int64_t qd = int64_t{c.num_q_heads} * c.head_dim;
  const int64_t kvd = int64_t{c.num_kv_heads} * c.head_dim;
  const int64_t inter = c.intermediate_size;
  require_matrix(embed, embed_bf16, int64_t{c.vocab_size} * h, "embed_tokens");
  require_size(final_norm, h, "norm");
  if (!c.tie_word_embeddings || !lm_head.empty() || !lm_head_bf16.empty())
    require_matrix(lm_head, lm_head_bf16, int64_t{c.vocab_size} * h, "lm_head");
  PAGODA_REQUIRE(static_cast<int>(layers.size()) == c.num_layers, kInvalidArgument,
                 "{} layers of weights for {} layers", layers.size(), c.num_layers);
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerWeights& w = layers[l];
    const std::string p = "layers." + std::to_string(l) + ".";
    require_size(w.input_norm, h, p + "input_layernorm");
    const bool linear = c.is_linear_layer(static_cast<int>(l));
    const Bf16Matrices& b = w.bf16;
    if (c.is_mla() || linear)
      PAGODA_REQUIRE(b.q_proj.empty() && b.k_proj.empty() && b.v_proj.empty() && b.o_proj.empty(),
                     kInvalidArgument, "{}: bf16 attention matrices on an {} layer (f32 only)", p,
                     linear ? "Mamba2" : "MLA");
    if (c.is_mla()) {
      validate_mla(c, w, p);
    } else {
      require_matrix(w.q_proj, b.q_proj, linear ? 0 : qd * h, p + "q_proj");
      require_matrix(w.o_proj, b.o_proj, linear ? 0 : h * qd, p + "o_proj");
    }
    require_matrix(w.k_proj, b.k_proj, c.is_mla() || linear ? 0 : kvd * h, p + "k_proj");
    require_matrix(w.v_proj, b.v_proj, c.is_mla() || linear ? 0 : kvd * h, p + "v_proj");
    validate_mamba(c, w, p, linear);
    const int64_t bq = c.qkv_bias ? qd : 0, bkv = c.qkv_bias ? kvd : 0;
    require_size(w.q_bias, bq, p + "q_proj.bias");
    require_size(w.k_bias, bkv, p + "k_proj.bias");
    require_size(w.v_bias, bkv, p + "v_proj.bias");
    require_size(w.post_norm, h, p + "post_attention_layernorm");
    require_matrix(w.gate_proj, b.gate_proj, inter * h, p + "gate_proj");
    require_matrix(w.up_proj, b.up_proj, inter * h, p + "up_proj");
    require_matrix(w.down_proj, b.down_proj, h * inter, p + "down_proj");
    require_size(w.attn_out_norm, c.sandwich_norms ? h : 0, p + "post_attention_layernorm");
    require_size(w.mlp_out_norm, c.sandwich_norms ? h : 0, p + "post_feedforward_layernorm");
    require_size(w.q_norm, c.qk_norm ? c.head_dim : 0, p + "q_norm");
    require_size(w.k_norm, c.qk_norm ? c.head_dim : 0, p + "k_norm");
  }
}

std::vector<float> widened_bf16(std::span<const uint16_t> bits) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_bits_to_f32(bits[i]);
  return out;
}

ModelWeights make_random_weights(const ModelConfig& c, uint64_t seed) {
  c.validate();
  Rng rng(seed ^ 0x5EED5EED5EED5EEDull);
  const int64_t h = c.hidden_size;
  const int64_t qd = int64_t{c.num_q_heads} * c.head_dim;
  const int64_t kvd = int64_t{c.num_kv_heads} * c.head_dim;
  const int64_t inter = c.intermediate_size;
  const double in_h = 1.0 / std::sqrt(static_cast<double>(h));
  const double norm_mean = c.norm_weight_offset ? 0.0 : 1.0;
  ModelWeights w;
  w.embed = normal_vec(rng, int64_t{c.vocab_size} * h, 0.0, 1.0);
  w.layers.resize(c.num_layers);
  for (LayerWeights& l : w.layers) {
    l.input_norm = normal_vec(rng, h, norm_mean, 0.1);
    l.q_proj = normal_vec(rng, qd * h, 0.0, in_h);
    l.k_proj = normal_vec(rng, kvd * h, 0.0, in_h);
    l.v_proj = normal_vec(rng, kvd * h, 0.0, in_h);
    l.o_proj = normal_vec(rng, h * qd, 0.0, 1.0 / std::sqrt(static_cast<double>(qd)));
    l.post_norm = normal_vec(rng, h, norm_mean, 0.1);
    l.gate_proj = normal_vec(rng, inter * h, 0.0, in_h);
    l.up_proj = normal_vec(rng, inter * h, 0.0, in_h);
    l.down_proj = normal_vec(rng, h * inter, 0.0, 1.0 / std::sqrt(static_cast<double>(inter)));
  }
  w.final_norm = normal_vec(rng, h, norm_mean, 0.1);
  if (!c.tie_word_embeddings) w.lm_head = normal_vec(rng, int64_t{c.vocab_size} * h, 0.0, in_h);
  // Drawn last so configs without biases keep the weights they always had.
  if (c.qkv_bias) {
    for (LayerWeights& l : w.layers) {
      l.q_bias = normal_vec(rng, qd, 0.0, 0.5);
      l.k_bias = normal_vec(rng, kvd, 0.0, 0.5);
      l.v_bias = normal_vec(rng, kvd, 0.0, 0.5);
    }
  }
  for (LayerWeights& l : w.layers) {
    if (c.sandwich_norms) {
      l.attn_out_norm = normal_vec(rng, h, norm_mean, 0.1);
      l.mlp_out_norm = normal_vec(rng, h, norm_mean, 0.1);
    }
    if (c.qk_norm) {
      l.q_norm = normal_vec(rng, c.head_dim, norm_mean, 0.1);
      l.k_norm = normal_vec(rng, c.head_dim, norm_mean, 0.1);
    }
  }
  if (c.is_mla()) random_mla(c, rng, w, norm_mean);
  if (c.has_linear_layers()) random_mamba(c, rng, w);
  return w;
}

}  // namespace pagoda::model
