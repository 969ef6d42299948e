#include "pagoda/model/decoder.h"

#include <algorithm>

#include "pagoda/core/error.h"
#include "pagoda/core/tensor_view.h"
#include "pagoda/model/dsa_indexer.h"

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

/// Rows [begin, begin + count) of a row-major matrix with `cols` columns, appended to `out`.
void append_rows(std::vector<float>& out, std::span<const float> w, int64_t cols, int64_t begin,
                 int64_t count) {
  out.insert(out.end(), w.begin() + begin * cols, w.begin() + (begin + count) * cols);
}

/// Columns [begin, begin + count) of a row-major [rows, cols] matrix.
std::vector<float> slice_cols(std::span<const float> w, int64_t cols, int64_t begin,
                              int64_t count) {
  const int64_t rows = static_cast<int64_t>(w.size()) / cols;
  std::vector<float> out;
  out.reserve(static_cast<size_t>(rows * count));
  for (int64_t r = 0; r < rows; ++r)
    out.insert(out.end(), w.begin() + r * cols + begin, w.begin() + r * cols + begin + count);
  return out;
}

}  // namespace

Decoder::Shard Decoder::shard_of(const ModelConfig& c, int rank, int size) {
  PAGODA_REQUIRE(size >= 1 && rank >= 0 && rank < size, kInvalidArgument,
                 "rank {} of a tensor-parallel group of {}", rank, size);
  auto divisible = [&](int64_t n, const char* what) {
    PAGODA_REQUIRE(n % size == 0, kUnsupported,
                   "tensor parallelism {} needs {} ({}) divisible by {}; use a size that divides "
                   "it",
                   size, what, n, size);
  };
  divisible(c.num_q_heads, "num_attention_heads");
  divisible(c.num_kv_heads, "num_key_value_heads");
  divisible(c.intermediate_size, "intermediate_size");
  divisible(c.vocab_size, "vocab_size");
  const int64_t vocab_rows = c.vocab_size / size;
  return Shard{.rank = rank,
               .size = size,
               .num_q_heads = c.num_q_heads / size,
               .num_kv_heads = c.num_kv_heads / size,
               .intermediate = c.intermediate_size / size,
               .vocab_begin = rank * vocab_rows,
               .vocab_rows = vocab_rows};
}

const void* Decoder::upload_owned(std::vector<float> host) {
  if (!ops_->device().is_cpu()) return ops_->upload(host);  // copied: the slice can go
  host_slices_.push_back(std::move(host));  // the CPU ops use it in place
  return ops_->upload(host_slices_.back());
}

Decoder::~Decoder() = default;

Decoder::Decoder(const LlamaModel& model, ModelOps& ops, kv::KvPool* kv_pool,
                 dist::Communicator* comm, bool swa_pool)
    : model_(&model), ops_(&ops), comm_(comm), kv_pool_(kv_pool), swa_pool_(swa_pool) {
  const ModelConfig& c = model.config();
  const int tp = comm == nullptr ? 1 : comm->world_size();
  shard_ = shard_of(c, comm == nullptr ? 0 : comm->rank(), tp);
  if (tp == 1) comm_ = nullptr;
  attn_layers_ = model.attention_layers();
  for (int l = 0; l < c.num_layers; ++l)
    if (!c.is_linear_layer(l))
      attn_layers_[static_cast<size_t>(l)].layer_id = model.pool_layer(l, swa_pool);
  if (c.has_linear_layers()) {
    PAGODA_REQUIRE(tp == 1, kUnsupported,
                   "tensor parallelism with {} (Mamba2 layers on the hybrid state pool) is not "
                   "implemented; use --tp 1",
                   hf_architecture_name(c.family));
    mixer_ = std::make_unique<Mamba2Mixer>(mamba2_shape(c), ops);  // refuses ops without its ops
    // The projections in the ops' dtype, the small weights and biases in f32 (both on the ops'
    // device; the CPU ops use the model's arrays in place or keep f32 copies).
    auto mat = [&](const std::vector<float>& v) -> const void* {
      return v.empty() ? nullptr : ops.upload(v);
    };
    auto vec = [&](const std::vector<float>& v) -> const float* {
      return v.empty() ? nullptr : ops.upload_f32(v);
    };
    int32_t next = 0;
    for (int l = 0; l < c.num_layers; ++l) {
      const LlamaModel::PackedLayer& w = model.packed_layers()[static_cast<size_t>(l)];
      const bool linear = c.is_linear_layer(l);
      state_layer_.push_back(linear ? next++ : -1);
      ssm_weights_.push_back(!linear ? Mamba2Weights{}
                                     : Mamba2Weights{.in_proj = mat(w.ssm_in_proj),
                                                     .in_bias = vec(w.ssm_in_bias),
                                                     .conv = vec(w.ssm_conv),
                                                     .conv_bias = vec(w.ssm_conv_bias),
                                                     .dt_bias = vec(w.ssm_dt_bias),
                                                     .a_log = vec(w.ssm_a_log),
                                                     .d = vec(w.ssm_d),
                                                     .norm = vec(w.ssm_norm),
                                                     .out_proj = mat(w.ssm_out_proj),
                                                     .out_bias = vec(w.ssm_out_bias)});
    }
  }
  for (attention::AttentionLayer& l : attn_layers_) {
    PAGODA_REQUIRE(tp == 1 || l.sinks.empty(), kUnsupported,
                   "tensor parallelism with attention sinks is not implemented");
    l.num_q_heads = shard_.num_q_heads;
    if (!l.is_mla) l.num_kv_heads = shard_.num_kv_heads;  // MLA: one latent head
  }
  if (kv_pool != nullptr && kv_pool->config().layout == kv::KvLayout::kMha &&
      kv_pool->config().dtype == ops.dtype() && kv_pool->device() == ops.device()) {
    PAGODA_REQUIRE(kv_pool->config().num_kv_heads == shard_.num_kv_heads, kInvalidArgument,
                   "the KV pool has {} heads but this rank holds {}",
                   kv_pool->config().num_kv_heads, shard_.num_kv_heads);
    stores_.resize(static_cast<size_t>(c.num_layers));
    for (int l = 0; l < c.num_layers; ++l) {
      if (swa_pool && c.window_of(l) >= 0) continue;  // stored by the SWA backend
      if (c.is_linear_layer(l)) continue;              // a Mamba2 layer keeps no KV
      const LayerId in_pool = attn_layers_[static_cast<size_t>(l)].layer_id;
      stores_[static_cast<size_t>(l)] = KvStore{.k_cache = kv_pool->k_view(in_pool).data(),
                                                .v_cache = kv_pool->v_view(in_pool).data(),
                                                .out_cache_loc = nullptr,
                                                .num_slots = kv_pool->num_slots()};
    }
  }
  PAGODA_REQUIRE(!c.is_mla() || ops.supports_mla_ops(), kUnsupported,
                 "{} (multi-head latent attention) needs the dense op rope_interleaved "
                 "(DeepSeek's RoPE), which the model ops on {} do not implement; run it on the "
                 "CPU",
                 hf_architecture_name(c.family), ops.platform().name());
  PAGODA_REQUIRE(!c.is_mla() || tp == 1, kUnsupported,
                 "tensor parallelism with {} (MLA) is not implemented; use --tp 1",
                 hf_architecture_name(c.family));
  if (c.is_dsa()) {
    PAGODA_REQUIRE(kv_pool != nullptr && kv_pool->config().index_head_dim ==
                                             c.dsa.index_head_dim,
                   kInvalidArgument,
                   "{} (DeepSeek sparse attention) needs a KV pool with index keys of {} dims",
                   hf_architecture_name(c.family), c.dsa.index_head_dim);
    dsa_ = std::make_unique<DsaIndexer>(c, ops);  // refuses ops without the DSA ops, by name
  }
  const bool gemma_ops =
      c.sandwich_norms || c.qk_norm || c.embed_scale != 1.f || c.activation != Activation::kSilu;
  PAGODA_REQUIRE(!gemma_ops || ops.supports_gemma_ops(), kUnsupported,
                 "{} needs Gemma's dense ops (GeGLU, sandwich / q-k norms, embedding scale), "
                 "which the model ops on {} do not implement; run it on the CPU",
                 hf_architecture_name(c.family), ops.platform().name());
  final_norm_ = ops.upload(model.final_norm_weights());
  auto upload_rope = [&](const Rope& rope) {
    const auto& inv = rope.inv_freq();
    const std::vector<float> inv_f32(inv.begin(), inv.end());
    return ops.upload_f32(inv_f32);
  };
  const float* global_freq = upload_rope(model.rope());
  const float* local_freq =
      c.local_rope.theta > 0.0 ? upload_rope(model.local_rope()) : global_freq;
  layers_.reserve(model.packed_layers().size());
  // The weights of one layer every rank holds whole (norms; q/k norms are per head).
  auto gemma_ptrs = [&](LayerPtrs p, const LlamaModel::PackedLayer& w, int l) {
    auto opt = [&](const std::vector<float>& v) { return v.empty() ? nullptr : ops.upload(v); };
    p.attn_out_norm = opt(w.attn_out_norm);
    p.mlp_out_norm = opt(w.mlp_out_norm);
    p.q_norm = opt(w.q_norm);
    p.k_norm = opt(w.k_norm);
    p.inv_freq = &model.rope_of(l) == &model.rope() ? global_freq : local_freq;
    return p;
  };
  const bool tied = model.lm_head_tied();
  // A GEMM matrix in the dtype the model keeps it (LlamaModel::Bf16Packed); nullptr when absent.
  auto matrix = [&](const std::vector<float>& f32, const std::vector<uint16_t>& bf16) -> void* {
    if (!bf16.empty()) return ops.upload_bf16(bf16);
    return f32.empty() ? nullptr : ops.upload(f32);
  };
  if (tp == 1) {
    embed_ = matrix(model.embed_weights(), model.embed_bf16());
    lm_head_ = tied ? embed_ : matrix(model.lm_head_weights(), model.lm_head_bf16());
    int l = 0;
    for (const LlamaModel::PackedLayer& w : model.packed_layers()) {
      const std::span<const float> bias = qkv_bias_of(w);
      layers_.push_back(gemma_ptrs(LayerPtrs{.input_norm = ops.upload(w.input_norm),
                                             .qkv = matrix(w.qkv_proj, w.bf16.qkv_proj),
                                             .qkv_bias = bias.empty() ? nullptr : ops.upload(bias),
                                             .o_proj = matrix(w.o_proj, w.bf16.o_proj),
                                             .post_norm = ops.upload(w.post_norm),
                                             .gate_up = matrix(w.gate_up, w.bf16.gate_up),
                                             .down = matrix(w.down_proj, w.bf16.down_proj)},
                                   w, l++));
      if (c.is_mla()) upload_mla(layers_.back(), w);
    }
    prepare_linears();
    return;
  }
  PAGODA_REQUIRE(!model.has_bf16_weights(), kUnsupported,
                 "tensor parallelism slices f32 weights: load the checkpoint without keep_bf16");
  // This rank's slices (host copies, uploaded one at a time to bound host memory).
  const int64_t hd = c.hidden_size, d = c.head_dim;
  const int64_t hq = c.num_q_heads, hkv = c.num_kv_heads, inter = c.intermediate_size;
  const int64_t hq_l = shard_.num_q_heads, hkv_l = shard_.num_kv_heads, r = shard_.rank;
  const int64_t inter_l = shard_.intermediate;
  auto qkv_rows = [&](std::span<const float> w, int64_t cols) {  // q, k, v heads of this rank
    std::vector<float> out;
    out.reserve(static_cast<size_t>((hq_l + 2 * hkv_l) * d * cols));
    append_rows(out, w, cols, r * hq_l * d, hq_l * d);
    append_rows(out, w, cols, hq * d + r * hkv_l * d, hkv_l * d);
    append_rows(out, w, cols, (hq + hkv) * d + r * hkv_l * d, hkv_l * d);
    return out;
  };
  auto vocab_rows = [&](const std::vector<float>& w) {
    std::vector<float> out;
    append_rows(out, w, hd, shard_.vocab_begin, shard_.vocab_rows);
    return out;
  };
  embed_ = upload_owned(vocab_rows(model.embed_weights()));
  lm_head_ = tied ? embed_ : upload_owned(vocab_rows(model.lm_head_weights()));
  int l = 0;
  for (const LlamaModel::PackedLayer& w : model.packed_layers()) {
    const std::span<const float> bias = qkv_bias_of(w);
    std::vector<float> gate_up;
    gate_up.reserve(static_cast<size_t>(2 * inter_l * hd));
    append_rows(gate_up, w.gate_up, hd, r * inter_l, inter_l);
    append_rows(gate_up, w.gate_up, hd, inter + r * inter_l, inter_l);
    layers_.push_back(gemma_ptrs(
        LayerPtrs{.input_norm = ops.upload(w.input_norm),
                  .qkv = upload_owned(qkv_rows(w.qkv_proj, hd)),
                  .qkv_bias = bias.empty() ? nullptr : upload_owned(qkv_rows(bias, 1)),
                  .o_proj = upload_owned(slice_cols(w.o_proj, hq * d, r * hq_l * d, hq_l * d)),
                  .post_norm = ops.upload(w.post_norm),
                  .gate_up = upload_owned(std::move(gate_up)),
                  .down = upload_owned(slice_cols(w.down_proj, inter, r * inter_l, inter_l))},
        w, l++));
  }
  prepare_linears();
}

void Decoder::prepare_linears() {
  const ModelConfig& c = model_->config();
  ModelOps& ops = *ops_;
  const int64_t hd = c.hidden_size, d = c.head_dim, inter = shard_.intermediate;
  const int64_t hq = shard_.num_q_heads, hkv = shard_.num_kv_heads;
  for (const LayerPtrs& w : layers_) {
    if (w.qkv != nullptr) ops.prepare_linear(w.qkv, (hq + 2 * hkv) * d, hd);
    if (w.o_proj != nullptr && !c.is_mla()) ops.prepare_linear(w.o_proj, hd, hq * d);
    ops.prepare_linear(w.gate_up, 2 * inter, hd);
    ops.prepare_linear(w.down, hd, inter);
  }
  if (mixer_ != nullptr) {
    const Mamba2Shape s = mamba2_shape(c);
    for (const Mamba2Weights& w : ssm_weights_) {
      if (w.in_proj == nullptr) continue;  // an attention layer
      ops.prepare_linear(w.in_proj, s.in_proj_dim(), s.hidden_size);
      ops.prepare_linear(w.out_proj, s.hidden_size, s.d_inner());
    }
  }
  ops.prepare_linear(lm_head_, shard_.vocab_rows, hd);
}

void Decoder::reserve(Activations& a, int64_t tokens, int64_t rows, int64_t mla_keys) const {
  const ModelConfig& c = model_->config();
  if (c.is_mla() && mla_keys > a.mla_keys) {  // in steps of 4,096 keys, not doubled
    ops_->platform().synchronize_stream();
    a.mla_kv = {};
    a.mla_keys = (mla_keys + 4095) / 4096 * 4096;
    a.mla_kv = platform::make_buffer(
        ops_->platform().allocator(),
        static_cast<size_t>(mla_key_scratch_elems(a.mla_keys)) * dtype_size(ops_->dtype()));
  }
  if (tokens <= a.tokens && rows <= a.rows) return;
  platform::DeviceBuffer mla_kv = std::move(a.mla_kv);  // kept across the rows' reallocation
  const int64_t keys = a.mla_keys;
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
  const int64_t hq = shard_.num_q_heads, hkv = shard_.num_kv_heads, inter = shard_.intermediate;
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
  if (shard_.size > 1) {
    a.shard_logits = make(r * shard_.vocab_rows, sizeof(float));
    a.gathered = make(r * c.vocab_size, sizeof(float));
  }
  a.ints = make(3 * t + 3 * r + 1, sizeof(int32_t));
  a.sample_params = make(r, sizeof(SampleRow));
  a.token_mask = make(r * token_mask_words(c.vocab_size), sizeof(uint32_t));
  if (c.is_mla()) a.mla = make(mla_scratch_elems(t), es);
  if (dsa_) a.dsa = make(dsa_->scratch_floats(t), sizeof(float));
  a.mla_kv = std::move(mla_kv);
  a.mla_keys = keys;
  a.tokens = t;
  a.rows = r;
}

void Decoder::forward(Activations& a, const attention::ForwardBatch& batch,
                      attention::AttentionBackend& backend, int64_t t, int64_t rows,
                      const HiddenCapture* capture, const WindowSide* window,
                      const StateSide* state) const {
  PAGODA_REQUIRE(t <= a.tokens && rows <= a.rows, kInvalidArgument,
                 "activations hold {} tokens / {} rows, forward needs {} / {}", a.tokens, a.rows,
                 t, rows);
  PAGODA_REQUIRE(swa_pool_ == (window != nullptr), kInvalidArgument,
                 "a decoder {} the SWA pool got a forward {} a window side",
                 swa_pool_ ? "on" : "without", window != nullptr ? "with" : "without");
  ModelOps& ops = *ops_;
  const ModelConfig& c = model_->config();
  if (mixer_ != nullptr) {
    PAGODA_REQUIRE(state != nullptr && state->pool != nullptr && state->backend != nullptr,
                   kInvalidArgument,
                   "{} has Mamba2 layers: its forward needs the sequences' state slots and a "
                   "linear-attention backend",
                   hf_architecture_name(c.family));
    int64_t n = 0;
    for (const Mamba2Seq& q : state->seqs) n += q.num_tokens;
    PAGODA_REQUIRE(n == t, kInvalidArgument,
                   "the state slots' sequences hold {} tokens but the forward has {}", n, t);
    state->backend->init_forward_metadata(*state->pool, state->seqs);  // once for every layer
  }
  const int64_t hd = c.hidden_size, vocab = c.vocab_size, inter = shard_.intermediate;
  const int hq = shard_.num_q_heads, hkv = shard_.num_kv_heads, d = c.head_dim;
  const int64_t qkv_w = static_cast<int64_t>(hq + 2 * hkv) * d;
  const DType dt = ops.dtype();
  const Device dev = ops.device();
  const float eps = c.rms_norm_eps;
  float* residual = static_cast<float*>(a.residual.get());
  const TensorView q_view(a.q.get(), dt, {t, hq, d}, dev);
  const TensorView k_view(a.k.get(), dt, {t, hkv, d}, dev);
  const TensorView v_view(a.v.get(), dt, {t, hkv, d}, dev);
  const TensorView o_view(a.attn.get(), dt, {t, hq, d}, dev);
  const auto& attn_layers = attn_layers_;
  // Tensor parallelism: each rank's partial sums of x add up to the unsharded value.
  auto reduce_x = [&] {
    if (comm_ != nullptr) comm_->all_reduce_sum(a.x.get(), t * hd, dt);
  };

  // The residual stream holds layer l's output once the next add_rms_norm has added its MLP.
  auto capture_layer = [&](int l) {
    if (capture == nullptr) return;
    const int64_t row = hd * static_cast<int64_t>(sizeof(float));
    const int64_t n = static_cast<int64_t>(capture->layers.size());
    for (int64_t k = 0; k < n; ++k)
      if (capture->layers[static_cast<size_t>(k)] == l)
        ops.copy_2d(capture->dst + k * hd, n * row, residual, row, row, t);
  };
  ops.embed(embed_, a.ids(), a.x.get(), t, hd, shard_.vocab_begin, shard_.vocab_rows);
  reduce_x();
  if (c.embed_scale != 1.f) ops.scale(a.x.get(), t * hd, c.embed_scale);
  // Gemma's sandwich norm of a block output (x, [t, hd]) before it joins the residual stream.
  auto out_norm = [&](const void* weight) {
    if (weight != nullptr) ops.rms_norm_groups(a.x.get(), t, hd, 1, hd, weight, eps);
  };
  int64_t window_keys = c.is_mla() ? expanded_mla_keys(batch, backend) : 0;  // once a step
  if (window_keys > a.mla_keys) window_keys = 0;  // not reserved: absorbed
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerPtrs& w = layers_[static_cast<size_t>(l)];
    ops.add_rms_norm(a.x.get(), residual, w.input_norm, a.h.get(), t, hd, eps, l == 0);
    if (l > 0) capture_layer(l - 1);
    if (c.is_linear_layer(l)) {
      mixer_->forward(*state->backend, ssm_weights_[static_cast<size_t>(l)],
                      state_layer_[static_cast<size_t>(l)], a.h.get(), a.x.get());
    } else if (c.is_mla()) {
      mla_attention(a, w, l, batch, backend, t, window_keys);
    } else {
      ops.linear(a.h.get(), w.qkv, a.qkv.get(), t, qkv_w, hd);
      if (w.q_norm != nullptr) {  // per-head norms of q (heads [0, hq)) and k (the next hkv)
        const int64_t es = static_cast<int64_t>(dtype_size(dt));
        char* qkv = static_cast<char*>(a.qkv.get());
        ops.rms_norm_groups(qkv, t, qkv_w, hq, d, w.q_norm, eps);
        ops.rms_norm_groups(qkv + int64_t{hq} * d * es, t, qkv_w, hkv, d, w.k_norm, eps);
      }
      const bool on_swa = swa_pool_ && c.window_of(l) >= 0;
      const LayerId in_pool = attn_layers[static_cast<size_t>(l)].layer_id;
      bool stored = false;
      if (!on_swa && !stores_.empty() && kv_pool_->k_scale(in_pool) == 1.f &&
          kv_pool_->v_scale(in_pool) == 1.f) {
        KvStore st = stores_[static_cast<size_t>(l)];
        st.out_cache_loc = a.cache_loc();
        stored = ops.qkv_rope_store(a.qkv.get(), w.qkv_bias, a.positions(), w.inv_freq, a.q.get(),
                                    st, t, hq, hkv, d);
      }
      if (!stored)
        ops.qkv_rope(a.qkv.get(), w.qkv_bias, a.positions(), w.inv_freq, a.q.get(), a.k.get(),
                     a.v.get(), t, hq, hkv, d);
      if (kv_pool_ != nullptr && !on_swa) kv_pool_->wait_layer(in_pool);  // HiCache load-back
      (on_swa ? *window->backend : backend)
          .forward(q_view, k_view, v_view, attn_layers[static_cast<size_t>(l)],
                   on_swa ? *window->batch : batch, o_view,
                   stored ? attention::SaveKv::kNo : attention::SaveKv::kYes);
      ops.linear(a.attn.get(), w.o_proj, a.x.get(), t, hd, static_cast<int64_t>(hq) * d);
    }
    reduce_x();
    out_norm(w.attn_out_norm);
    ops.add_rms_norm(a.x.get(), residual, w.post_norm, a.h.get(), t, hd, eps, false);
    ops.linear(a.h.get(), w.gate_up, a.mlp.get(), t, 2 * inter, hd);
    if (c.activation == Activation::kGeluTanh) {
      ops.gelu_tanh_mul(a.mlp.get(), a.act.get(), t, inter);
      ops.linear(a.act.get(), w.down, a.x.get(), t, hd, inter);
    } else if (!ops.swiglu_linear(a.mlp.get(), w.down, a.x.get(), t, hd, inter)) {
      ops.silu_mul(a.mlp.get(), a.act.get(), t, inter);
      ops.linear(a.act.get(), w.down, a.x.get(), t, hd, inter);
    }
    reduce_x();
    out_norm(w.mlp_out_norm);
  }
  // The last layer's MLP output joins the residual stream; the final norm runs on logit rows.
  ops.add_rms_norm(a.x.get(), residual, final_norm_, a.h.get(), t, hd, eps, false);
  capture_layer(c.num_layers - 1);
  if (rows == 0) return;
  ops.rms_norm_rows(residual, a.logit_rows(), final_norm_, a.sel.get(), rows, hd, eps);
  if (comm_ == nullptr) {
    ops.linear(a.sel.get(), lm_head_, a.logits.get(), rows, vocab, hd, /*f32_out=*/true);
  } else {
    // [rows, V/N] per rank → all-gather [N, rows, V/N] → interleave into [rows, V].
    const int64_t vl = shard_.vocab_rows;
    ops.linear(a.sel.get(), lm_head_, a.shard_logits.get(), rows, vl, hd, /*f32_out=*/true);
    comm_->all_gather(a.shard_logits.get(), a.gathered.get(), rows * vl, DType::kF32);
    const int64_t row_bytes = vl * static_cast<int64_t>(sizeof(float));
    for (int s = 0; s < shard_.size; ++s)
      ops.copy_2d(a.logits_f32() + s * vl, vocab * static_cast<int64_t>(sizeof(float)),
                  static_cast<const float*>(a.gathered.get()) + s * rows * vl, row_bytes,
                  row_bytes, rows);
  }
  if (c.final_logit_softcap > 0.f)
    ops.soft_cap(a.logits_f32(), rows * vocab, c.final_logit_softcap);
}

void Decoder::sample(Activations& a, int64_t rows, bool masked) const {
  if (rows == 0) return;
  const int64_t vocab = model_->config().vocab_size;
  if (masked)
    ops_->mask_logits(a.logits_f32(), vocab, a.mask_rows(), a.mask_words(), a.mask_count(), rows);
  ops_->sample(a.logits_f32(), a.params(), a.out_ids(), rows, vocab);
}

}  // namespace pagoda::model
