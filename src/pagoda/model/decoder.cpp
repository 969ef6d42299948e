#include "pagoda/model/decoder.h"

#include <algorithm>

#include "pagoda/core/error.h"
#include "pagoda/core/tensor_view.h"

namespace pagoda::model {

namespace {

/// The fused q/k/v bias of a packed layer (empty when the model has none).
template <typename Layer>
std::span<const float> qkv_bias_of(const Layer& w) {
  if constexpr (requires { w.qkv_bias; }) {
    return w.qkv_bias;
  } else {
    return {};
  }
}

}  // namespace

Decoder::Decoder(const LlamaModel& model, ModelOps& ops, const kv::KvPool* kv_pool)
    : model_(&model), ops_(&ops), kv_pool_(kv_pool) {
  if (kv_pool != nullptr && kv_pool->config().layout == kv::KvLayout::kMha &&
      kv_pool->config().dtype == ops.dtype() && kv_pool->device() == ops.device()) {
    for (int l = 0; l < model.config().num_layers; ++l)
      stores_.push_back(KvStore{.k_cache = kv_pool->k_view(LayerId{l}).data(),
                                .v_cache = kv_pool->v_view(LayerId{l}).data(),
                                .out_cache_loc = nullptr,
                                .num_slots = kv_pool->num_slots()});
  }
  embed_ = ops.upload(model.embed_weights());
  lm_head_ = &model.lm_head_weights() == &model.embed_weights()
                 ? embed_
                 : ops.upload(model.lm_head_weights());
  final_norm_ = ops.upload(model.final_norm_weights());
  const auto& inv = model.rope().inv_freq();
  const std::vector<float> inv_f32(inv.begin(), inv.end());
  inv_freq_ = ops.upload_f32(inv_f32);
  layers_.reserve(model.packed_layers().size());
  for (const LlamaModel::PackedLayer& w : model.packed_layers()) {
    const std::span<const float> bias = qkv_bias_of(w);
    layers_.push_back(LayerPtrs{.input_norm = ops.upload(w.input_norm),
                                .qkv = ops.upload(w.qkv_proj),
                                .qkv_bias = bias.empty() ? nullptr : ops.upload(bias),
                                .o_proj = ops.upload(w.o_proj),
                                .post_norm = ops.upload(w.post_norm),
                                .gate_up = ops.upload(w.gate_up),
                                .down = ops.upload(w.down_proj)});
  }
}

void Decoder::reserve(Activations& a, int64_t tokens, int64_t rows) const {
  if (tokens <= a.tokens && rows <= a.rows) return;
  const ModelConfig& c = model_->config();
  const int64_t t = std::max({tokens, a.tokens * 2, int64_t{16}});
  const int64_t r = std::max({rows, a.rows * 2, int64_t{16}});
  platform::Platform& p = ops_->platform();
  p.synchronize_stream();  // in-flight work may still read the old buffers
  const size_t es = dtype_size(ops_->dtype());
  auto make = [&](int64_t elems, size_t elem_size) {
    return platform::make_buffer(p.allocator(),
                                 static_cast<size_t>(std::max<int64_t>(elems, 1)) * elem_size);
  };
  const int64_t hd = c.hidden_size, d = c.head_dim;
  const int64_t hq = c.num_q_heads, hkv = c.num_kv_heads, inter = c.intermediate_size;
  a = Activations{};
  a.residual = make(t * hd, sizeof(float));
  a.x = make(t * hd, es);
  a.h = make(t * hd, es);
  a.qkv = make(t * (hq + 2 * hkv) * d, es);
  a.q = make(t * hq * d, es);
  a.k = make(t * hkv * d, es);
  a.v = make(t * hkv * d, es);
  a.attn = make(t * hq * d, es);
  a.mlp = make(t * 2 * inter, es);
  a.act = make(t * inter, es);
  a.sel = make(r * hd, es);
  a.logits = make(r * c.vocab_size, sizeof(float));
  a.ints = make(3 * t + 2 * r, sizeof(int32_t));
  a.sample_params = make(r, sizeof(SampleRow));
  a.tokens = t;
  a.rows = r;
}

void Decoder::forward(Activations& a, const attention::ForwardBatch& batch,
                      attention::AttentionBackend& backend, int64_t t, int64_t rows) const {
  PAGODA_REQUIRE(t <= a.tokens && rows <= a.rows, kInvalidArgument,
                 "activations hold {} tokens / {} rows, forward needs {} / {}", a.tokens, a.rows,
                 t, rows);
  ModelOps& ops = *ops_;
  const ModelConfig& c = model_->config();
  const int64_t hd = c.hidden_size, vocab = c.vocab_size, inter = c.intermediate_size;
  const int hq = c.num_q_heads, hkv = c.num_kv_heads, d = c.head_dim;
  const int64_t qkv_w = static_cast<int64_t>(hq + 2 * hkv) * d;
  const DType dt = ops.dtype();
  const Device dev = ops.device();
  const float eps = c.rms_norm_eps;
  float* residual = static_cast<float*>(a.residual.get());
  const TensorView q_view(a.q.get(), dt, {t, hq, d}, dev);
  const TensorView k_view(a.k.get(), dt, {t, hkv, d}, dev);
  const TensorView v_view(a.v.get(), dt, {t, hkv, d}, dev);
  const TensorView o_view(a.attn.get(), dt, {t, hq, d}, dev);
  const auto& attn_layers = model_->attention_layers();

  ops.embed(embed_, a.ids(), a.x.get(), t, hd);
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerPtrs& w = layers_[static_cast<size_t>(l)];
    ops.add_rms_norm(a.x.get(), residual, w.input_norm, a.h.get(), t, hd, eps, l == 0);
    ops.linear(a.h.get(), w.qkv, a.qkv.get(), t, qkv_w, hd);
    bool stored = false;
    if (!stores_.empty() && kv_pool_->k_scale(LayerId{l}) == 1.f &&
        kv_pool_->v_scale(LayerId{l}) == 1.f) {
      KvStore st = stores_[static_cast<size_t>(l)];
      st.out_cache_loc = a.cache_loc();
      stored = ops.qkv_rope_store(a.qkv.get(), w.qkv_bias, a.positions(), inv_freq_, a.q.get(),
                                  st, t, hq, hkv, d);
    }
    if (!stored)
      ops.qkv_rope(a.qkv.get(), w.qkv_bias, a.positions(), inv_freq_, a.q.get(), a.k.get(),
                   a.v.get(), t, hq, hkv, d);
    backend.forward(q_view, k_view, v_view, attn_layers[static_cast<size_t>(l)], batch, o_view,
                    stored ? attention::SaveKv::kNo : attention::SaveKv::kYes);
    ops.linear(a.attn.get(), w.o_proj, a.x.get(), t, hd, static_cast<int64_t>(hq) * d);
    ops.add_rms_norm(a.x.get(), residual, w.post_norm, a.h.get(), t, hd, eps, false);
    ops.linear(a.h.get(), w.gate_up, a.mlp.get(), t, 2 * inter, hd);
    if (!ops.swiglu_linear(a.mlp.get(), w.down, a.x.get(), t, hd, inter)) {
      ops.silu_mul(a.mlp.get(), a.act.get(), t, inter);
      ops.linear(a.act.get(), w.down, a.x.get(), t, hd, inter);
    }
  }
  // The last layer's MLP output joins the residual stream; the final norm runs on logit rows.
  ops.add_rms_norm(a.x.get(), residual, final_norm_, a.h.get(), t, hd, eps, false);
  if (rows == 0) return;
  ops.rms_norm_rows(residual, a.logit_rows(), final_norm_, a.sel.get(), rows, hd, eps);
  ops.linear(a.sel.get(), lm_head_, a.logits.get(), rows, vocab, hd, /*f32_out=*/true);
  if (c.final_logit_softcap > 0.f)
    ops.soft_cap(a.logits_f32(), rows * vocab, c.final_logit_softcap);
}

void Decoder::sample(Activations& a, int64_t rows) const {
  if (rows == 0) return;
  ops_->sample(a.logits_f32(), a.params(), a.out_ids(), rows, model_->config().vocab_size);
}

}  // namespace pagoda::model
