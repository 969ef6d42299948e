// Decoder::mla_attention: one DeepSeek-V2/V3 attention block (decoder.h), absorbed or expanded.
//
//   q      = [rms_norm(h·W_qaᵀ)·w_qa]·W_qbᵀ  or  h·W_qᵀ           [t, Hq, nope + rope]
//   [c, k_pe] = h·W_kvaᵀ;  latent = rms_norm(c)·w_kva;  k_pe = rope_interleaved(k_pe)
//   q_pe   = rope_interleaved(q[:, :, nope:])
// Absorbed (decode, verify, draft; extend where the expanded form is not chosen):
//   q_abs  = [q_nope_h·W_UK_h | q_pe_h] per head                   [t, Hq, kv_lora + rope]
//   o_lat  = attention(q_abs, pool latent rows [latent | k_pe])    [t, Hq, kv_lora]
//   o      = concat_h(o_lat_h·W_UV_hᵀ)
// Expanded (extend steps, Decoder::expanded_mla_keys; SGLang's MHA prefill form):
//   the new latent rows go into the pool (save_kv); every row the step's requests see comes
//   back out (gather_kv, n = Σ seq_lens rows: prefix and new, in position order);
//   K_h    = [lat·W_UK_hᵀ | k_pe]                                   [n, Hq, nope + rope]
//   V_h    = lat·W_UV_hᵀ                                            [n, Hq, v]
//   o      = ragged attention(q, K, V)                              [t, Hq, v]
//   (more keys than a window holds: the same per key window, the new tokens' keys first, then
//   the prefixes', each with its LSE, merged by ModelOps::merge_attention: SGLang's chunked
//   prefix cache)
// and x = o·W_oᵀ either way. q_abs·[latent | k_pe] = q_nope·(W_UK·latent) + q_pe·k_pe is the
// expanded score exactly, and o_lat·W_UVᵀ the expanded output (V = W_UV·latent): the two forms
// differ by rounding only. The expanded form costs a kv_b_proj GEMM per key and attends at
// Dqk / Dv = nope + rope / v instead of kv_lora + rope / kv_lora per head (576 / 512 -> 192 / 128
// at DeepSeek's sizes: the dense prefill kernels). The layer's softmax scale (1/sqrt(nope +
// rope), times YaRN's mscale²) is in the AttentionLayer. DSA models (dsa_indexer.h) restrict
// each row's attention to the indexer's top-k positions through the backend's sparse hook
// (absorbed only).
#include <algorithm>

#include "pagoda/core/tensor_view.h"
#include "pagoda/model/decoder.h"
#include "pagoda/model/dsa_indexer.h"

namespace pagoda::model {

namespace {

/// Offsets (elements of es bytes) of the parts of Activations::mla for t rows. The expanded
/// form's window merge keeps f32 states there (acc_o [t, Hq, v], acc_lse and part_lse [t, Hq]),
/// over q_abs and o_lat, which that form does not use, when they fit (DeepSeek's sizes), else
/// after the rest.
struct MlaScratch {
  int64_t qa = 0, q = 0, kv = 0, q_abs = 0, o_lat = 0, ov = 0, acc = 0, end = 0;
  MlaScratch(const ModelConfig& c, int64_t t, int64_t es) {
    const MlaConfig& m = c.mla;
    const int64_t hq = c.num_q_heads, r = m.kv_lora_rank, p = m.qk_rope_head_dim;
    q = qa + t * m.q_lora_rank;
    kv = q + t * hq * (m.qk_nope_head_dim + p);
    q_abs = kv + t * (r + p);
    o_lat = q_abs + t * hq * (r + p);
    ov = o_lat + t * hq * r;
    end = ov + t * hq * m.v_head_dim;
    const int64_t acc_elems = (t * hq * (m.v_head_dim + 2) * 4 + es - 1) / es;
    acc = acc_elems <= ov - q_abs ? q_abs : end;
    if (acc == end) end += acc_elems;
  }
};

/// Offsets (elements) of the parts of Activations::mla_kv for n keys: the gathered latent rows
/// and the expanded K / V, each starting on a 64-element boundary.
struct MlaKeyScratch {
  int64_t lat = 0, k = 0, v = 0, end = 0;
  MlaKeyScratch(const ModelConfig& c, int64_t n) {
    const MlaConfig& m = c.mla;
    const int64_t hq = c.num_q_heads;
    auto after = [](int64_t at, int64_t elems) { return (at + elems + 63) / 64 * 64; };
    k = after(lat, n * (m.kv_lora_rank + m.qk_rope_head_dim));
    v = after(k, n * hq * (m.qk_nope_head_dim + m.qk_rope_head_dim));
    end = after(v, n * hq * m.v_head_dim);
  }
};

}  // namespace

int64_t Decoder::mla_scratch_elems(int64_t tokens) const {
  return MlaScratch(model_->config(), tokens, static_cast<int64_t>(dtype_size(ops_->dtype()))).end;
}

int64_t Decoder::mla_key_scratch_elems(int64_t keys) const {
  return MlaKeyScratch(model_->config(), keys).end;
}

namespace {

/// The key windows of an expanded step whose keys exceed one window (Decoder::mla_attention):
/// first every request's new tokens (causal), then the prefixes in windows of at most `keys`
/// keys in all, request by request (each request at most one range a window).
struct KeyWindowList {
  std::vector<std::vector<int32_t>> begin, end;
};
KeyWindowList key_windows(const attention::ForwardBatch& batch, int64_t keys) {
  const auto bs = static_cast<size_t>(batch.batch_size);
  KeyWindowList w;
  w.begin.emplace_back(batch.extend_prefix_lens.begin(), batch.extend_prefix_lens.end());
  w.end.emplace_back(batch.seq_lens.begin(), batch.seq_lens.end());
  int64_t used = keys;  // the current prefix window is full: open one at the first key
  for (size_t b = 0; b < bs; ++b) {
    for (int32_t pos = 0; pos < batch.extend_prefix_lens[b];) {
      if (used == keys) {
        w.begin.emplace_back(bs, 0);
        w.end.emplace_back(bs, 0);
        used = 0;
      }
      const auto take =
          static_cast<int32_t>(std::min<int64_t>(batch.extend_prefix_lens[b] - pos, keys - used));
      w.begin.back()[b] = pos;
      w.end.back()[b] = pos + take;
      pos += take;
      used += take;
    }
  }
  return w;
}

}  // namespace

int64_t Decoder::expanded_mla_keys(const attention::ForwardBatch& batch,
                                   const attention::AttentionBackend& backend) const {
  using attention::ForwardMode;
  const ModelConfig& c = model_->config();
  if (!c.is_mla() || mla_prefill_ != MlaPrefill::kAuto || dsa_ != nullptr ||
      (batch.mode != ForwardMode::kExtend && batch.mode != ForwardMode::kMixed) ||
      !batch.kv_start.empty() || !backend.capabilities().ragged || kv_pool_ == nullptr ||
      kv_pool_->config().dtype != ops_->dtype() ||
      batch.extend_seq_lens.size() != batch.seq_lens.size())
    return 0;
  const MlaConfig& m = c.mla;
  int64_t window = mla_window_keys_;
  if (window <= 0) {  // the most keys whose scratch fits the bound (its 3 parts' alignment too)
    const int64_t per_key = mla_key_scratch_elems(1) - 2 * 64,
                  elems = kExpandedMlaScratchBytes / int64_t(dtype_size(ops_->dtype()));
    window = (elems - 3 * 64) / std::max<int64_t>(per_key, 1);
  }
  int64_t news = 0;
  for (int32_t n : batch.extend_seq_lens) news += n;
  if (news > window) return 0;  // the new tokens' window
  // Multiply-adds per head: absorbed n·T·(2r + p) + n·r·(nope + v) (the wide dot products, the
  // queries' W_UK and the outputs' W_UV), expanded n·T·(nope + rope + v) + T·r·(nope + v) (the
  // narrow ones, kv_b_proj on every key).
  const double r = m.kv_lora_rank, wide = 2 * r + m.qk_rope_head_dim,
               narrow = m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim,
               expand = r * (m.qk_nope_head_dim + m.v_head_dim);
  double absorbed = 0, expanded = 0;
  for (size_t b = 0; b < batch.seq_lens.size(); ++b) {
    const double n = batch.extend_seq_lens[b], keys = batch.seq_lens[b];
    absorbed += n * keys * wide + n * expand;
    expanded += n * keys * narrow + keys * expand;
  }
  return expanded < absorbed ? std::min(batch.seq_lens_sum(), window) : 0;
}

void Decoder::upload_mla(LayerPtrs& p, const LlamaModel::PackedLayer& w) const {
  ModelOps& ops = *ops_;
  p.q_a_proj = w.q_a_proj.empty() ? nullptr : ops.upload(w.q_a_proj);
  p.q_a_norm = w.q_a_norm.empty() ? nullptr : ops.upload(w.q_a_norm);
  p.q_proj = ops.upload(w.q_proj);
  p.kv_a_proj = ops.upload(w.kv_a_proj);
  p.kv_a_norm = ops.upload(w.kv_a_norm);
  p.w_uk_t = ops.upload(w.w_uk_t);
  p.w_uk = ops.upload(w.w_uk);
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
                            attention::AttentionBackend& backend, int64_t t,
                            int64_t window_keys) const {
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
  const MlaScratch s(c, t, es);
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

  if (kv_pool_ != nullptr) kv_pool_->wait_layer(LayerId{l});  // HiCache load-back, layer l
  const attention::AttentionLayer& layer = attn_layers_[static_cast<size_t>(l)];
  if (window_keys > 0) {
    // The new latent rows into the pool; then per window of keys its latent rows out of it,
    // expanded into per-head K / V and attended (all n keys at once when they fit a window).
    const MlaKeyScratch ks(c, a.mla_keys);
    char* keys = static_cast<char*>(a.mla_kv.get());
    auto key_at = [&](int64_t off) { return keys + off * es; };
    backend.save_kv(TensorView(at(s.kv), dt, {t, 1, r + p}, dev), TensorView(), layer, batch);
    attention::AttentionLayer per_head = layer;
    per_head.num_kv_heads = static_cast<int>(hq);
    per_head.head_dim_qk = static_cast<int>(qk);
    per_head.head_dim_v = static_cast<int>(dv);
    per_head.is_mla = false;
    const TensorView q_view(at(s.q), dt, {t, hq, qk}, dev), o_view(at(s.ov), dt, {t, hq, dv}, dev);
    // Window `windows` (n of its keys): gathered, expanded, attended into ov (and `lse`).
    auto attend = [&](const attention::KeyWindows& windows, int64_t n, const TensorView& lse) {
      backend.gather_kv(layer, batch, windows, TensorView(key_at(ks.lat), dt, {n, 1, r + p}, dev),
                        TensorView());
      // K_h = [lat·W_UK_hᵀ | k_pe]: k_pe into head 0, then doubled into the other heads (a span
      // from head 0's rope part to head c-1's: the nope parts it carries are written next),
      // then every head's nope part and V in one grouped GEMM each (x_group 0: all read lat).
      const int64_t krow = hq * qk * es;
      ops.copy_2d(key_at(ks.k) + nope * es, krow, key_at(ks.lat) + r * es, (r + p) * es, p * es, n);
      for (int64_t h = 1; h < hq; h *= 2) {
        const int64_t heads = std::min(h, hq - h);
        ops.copy_2d(key_at(ks.k) + (h * qk + nope) * es, krow, key_at(ks.k) + nope * es, krow,
                    ((heads - 1) * qk + p) * es, n);
      }
      ops.linear_groups(key_at(ks.lat), r + p, 0, w.w_uk, key_at(ks.k), hq * qk, qk, n, nope, r,
                        hq);
      ops.linear_groups(key_at(ks.lat), r + p, 0, w.w_uv, key_at(ks.v), hq * dv, dv, n, dv, r, hq);
      backend.forward_ragged(q_view, TensorView(key_at(ks.k), dt, {n, hq, qk}, dev),
                             TensorView(key_at(ks.v), dt, {n, hq, dv}, dev), per_head, batch,
                             windows, o_view, lse);
    };
    const int64_t n_all = batch.seq_lens_sum();
    if (n_all <= window_keys) {
      attend({}, n_all, TensorView());
    } else {  // windows merged by LSE into f32 states (MlaScratch::acc), the last into ov
      auto* acc_o = reinterpret_cast<float*>(at(s.acc));
      float* acc_lse = acc_o + t * hq * dv;
      float* part_lse = acc_lse + t * hq;
      const KeyWindowList list = key_windows(batch, window_keys);
      for (size_t j = 0; j < list.begin.size(); ++j) {
        const attention::KeyWindows wj{.begin = list.begin[j], .end = list.end[j]};
        int64_t n = 0;
        for (size_t b = 0; b < list.begin[j].size(); ++b) n += list.end[j][b] - list.begin[j][b];
        attend(wj, n, TensorView(part_lse, DType::kF32, {t, hq}, dev));
        ops.merge_attention(at(s.ov), part_lse, acc_o, acc_lse,
                            j + 1 == list.begin.size() ? at(s.ov) : nullptr, t, hq, dv, j == 0);
      }
    }
  } else {
    // Absorb W_UK into each head's query: q_abs_h = [q_nope_h·W_UK_h | q_pe_h] (the rope parts
    // of all t·hq heads in one 2-D copy: a head's row is qk elements in q, r + p in q_abs).
    ops.linear_groups(at(s.q), hq * qk, qk, w.w_uk_t, at(s.q_abs), hq * (r + p), r + p, t, r, nope,
                      hq);
    ops.copy_2d(at(s.q_abs) + r * es, (r + p) * es, at(s.q) + nope * es, qk * es, p * es, t * hq);
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
                backend, static_cast<float*>(a.dsa.get()));
    }
    backend.forward(TensorView(at(s.q_abs), dt, {t, hq, r + p}, dev),
                    TensorView(at(s.kv), dt, {t, 1, r + p}, dev), TensorView(), layer, batch,
                    TensorView(at(s.o_lat), dt, {t, hq, r}, dev), attention::SaveKv::kYes);
    // Per head v_h = o_lat_h·W_UV_hᵀ into [t, Hq·v].
    ops.linear_groups(at(s.o_lat), hq * r, r, w.w_uv, at(s.ov), hq * dv, dv, t, dv, r, hq);
  }
  ops.linear(at(s.ov), w.o_proj, a.x.get(), t, hd, hq * dv);
}

}  // namespace pagoda::model
