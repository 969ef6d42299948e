// Decoder::mla_attention: one DeepSeek-V2/V3 attention block in the absorbed form (decoder.h).
//
//   q      = [rms_norm(h·W_qaᵀ)·w_qa]·W_qbᵀ  or  h·W_qᵀ           [t, Hq, nope + rope]
//   [c, k_pe] = h·W_kvaᵀ;  latent = rms_norm(c)·w_kva;  k_pe = rope_interleaved(k_pe)
//   q_pe   = rope_interleaved(q[:, :, nope:])
//   q_abs  = [q_nope_h·W_UK_h | q_pe_h] per head                   [t, Hq, kv_lora + rope]
//   o_lat  = attention(q_abs, pool latent rows [latent | k_pe])    [t, Hq, kv_lora]
//   x      = concat_h(o_lat_h·W_UV_hᵀ)·W_oᵀ
// q_abs·[latent | k_pe] = q_nope·(W_UK·latent) + q_pe·k_pe is the non-absorbed score exactly,
// and o_lat·W_UVᵀ is the non-absorbed output (V = W_UV·latent), so one path serves decode,
// extend, prefix hits and verify. The layer's softmax scale (1/sqrt(nope + rope), times YaRN's
// mscale²) is in the AttentionLayer. DSA models (dsa_indexer.h) restrict each row's attention
// to the indexer's top-k positions through the backend's sparse hook.
#include "pagoda/core/tensor_view.h"
#include "pagoda/model/decoder.h"
#include "pagoda/model/dsa_indexer.h"

namespace pagoda::model {

namespace {

/// Offsets (elements) of the parts of Activations::mla for t rows.
struct MlaScratch {
  int64_t qa = 0, q = 0, kv = 0, q_abs = 0, o_lat = 0, ov = 0, end = 0;
  MlaScratch(const ModelConfig& c, int64_t t) {
    const MlaConfig& m = c.mla;
    const int64_t hq = c.num_q_heads, r = m.kv_lora_rank, p = m.qk_rope_head_dim;
    q = qa + t * m.q_lora_rank;
    kv = q + t * hq * (m.qk_nope_head_dim + p);
    q_abs = kv + t * (r + p);
    o_lat = q_abs + t * hq * (r + p);
    ov = o_lat + t * hq * r;
    end = ov + t * hq * m.v_head_dim;
  }
};

}  // namespace

int64_t Decoder::mla_scratch_elems(int64_t tokens) const {
  return MlaScratch(model_->config(), tokens).end;
}

void Decoder::upload_mla(LayerPtrs& p, const LlamaModel::PackedLayer& w) const {
  ModelOps& ops = *ops_;
  p.q_a_proj = w.q_a_proj.empty() ? nullptr : ops.upload(w.q_a_proj);
  p.q_a_norm = w.q_a_norm.empty() ? nullptr : ops.upload(w.q_a_norm);
  p.q_proj = ops.upload(w.q_proj);
  p.kv_a_proj = ops.upload(w.kv_a_proj);
  p.kv_a_norm = ops.upload(w.kv_a_norm);
  p.w_uk_t = ops.upload(w.w_uk_t);
  p.w_uv = ops.upload(w.w_uv);
  if (w.idx_wq_b.empty()) return;
  p.idx_wq_b = ops.upload(w.idx_wq_b);
  p.idx_wk = ops.upload(w.idx_wk);
  p.idx_k_norm = ops.upload_f32(w.idx_k_norm);  // the indexer's LayerNorm reads f32
  p.idx_k_norm_bias = ops.upload_f32(w.idx_k_norm_bias);
  p.idx_weights_proj = ops.upload(w.idx_weights_proj);
}

void Decoder::mla_attention(Activations& a, const LayerPtrs& w, int l,
                            const attention::ForwardBatch& batch,
                            attention::AttentionBackend& backend, int64_t t) const {
  ModelOps& ops = *ops_;
  const ModelConfig& c = model_->config();
  const MlaConfig& m = c.mla;
  const int64_t hd = c.hidden_size, hq = c.num_q_heads, qr = m.q_lora_rank;
  const int64_t r = m.kv_lora_rank, p = m.qk_rope_head_dim, nope = m.qk_nope_head_dim;
  const int64_t dv = m.v_head_dim, qk = nope + p;
  const float eps = c.rms_norm_eps;
  const DType dt = ops.dtype();
  const Device dev = ops.device();
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  const MlaScratch s(c, t);
  char* base = static_cast<char*>(a.mla.get());
  auto at = [&](int64_t off) { return base + off * es; };
  const float factor = static_cast<float>(model_->rope_of(l).attention_factor());

  // q, and the latent row [c | k_pe] of every new token.
  if (qr > 0) {
    ops.linear(a.h.get(), w.q_a_proj, at(s.qa), t, qr, hd);
    ops.rms_norm_groups(at(s.qa), t, qr, 1, qr, w.q_a_norm, eps);
    ops.linear(at(s.qa), w.q_proj, at(s.q), t, hq * qk, qr);
  } else {
    ops.linear(a.h.get(), w.q_proj, at(s.q), t, hq * qk, hd);
  }
  ops.linear(a.h.get(), w.kv_a_proj, at(s.kv), t, r + p, hd);
  ops.rms_norm_groups(at(s.kv), t, r + p, 1, r, w.kv_a_norm, eps);
  ops.rope_interleaved(at(s.kv) + r * es, t, r + p, 1, 0, p, a.positions(), w.inv_freq, factor);
  ops.rope_interleaved(at(s.q) + nope * es, t, hq * qk, hq, qk, p, a.positions(), w.inv_freq,
                       factor);

  // Absorb W_UK into each head's query: q_abs_h = [q_nope_h·W_UK_h | q_pe_h] (the rope parts
  // of all t·hq heads in one 2-D copy: a head's row is qk elements in q, r + p in q_abs).
  ops.linear_groups(at(s.q), hq * qk, qk, w.w_uk_t, at(s.q_abs), hq * (r + p), r + p, t, r, nope,
                    hq);
  ops.copy_2d(at(s.q_abs) + r * es, (r + p) * es, at(s.q) + nope * es, qk * es, p * es, t * hq);
  if (kv_pool_ != nullptr) kv_pool_->wait_layer(LayerId{l});  // HiCache load-back, layer l
  if (dsa_ != nullptr) {  // DSA: index keys, and the top-k the attention may see
    auto f32 = [](const void* p) { return static_cast<const float*>(p); };
    const DsaLayerWeights dw{.wq_b = w.idx_wq_b,
                             .wk = w.idx_wk,
                             .k_norm = f32(w.idx_k_norm),
                             .k_norm_bias = f32(w.idx_k_norm_bias),
                             .weights_proj = w.idx_weights_proj,
                             .inv_freq = w.inv_freq,
                             .rope_factor = factor};
    dsa_->run(LayerId{l}, dw, a.h.get(), at(s.qa), a.positions(), a.cache_loc(), batch, *kv_pool_,
              backend);
  }
  backend.forward(TensorView(at(s.q_abs), dt, {t, hq, r + p}, dev),
                  TensorView(at(s.kv), dt, {t, 1, r + p}, dev), TensorView(),
                  attn_layers_[static_cast<size_t>(l)], batch,
                  TensorView(at(s.o_lat), dt, {t, hq, r}, dev), attention::SaveKv::kYes);

  // Per head v_h = o_lat_h·W_UV_hᵀ into [t, Hq·v], then o_proj.
  ops.linear_groups(at(s.o_lat), hq * r, r, w.w_uv, at(s.ov), hq * dv, dv, t, dv, r, hq);
  ops.linear(at(s.ov), w.o_proj, a.x.get(), t, hd, hq * dv);
}

}  // namespace pagoda::model
