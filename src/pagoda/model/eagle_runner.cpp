#include "pagoda/model/eagle_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"
#include "pagoda/core/tensor_view.h"
#include "pagoda/model/ops.h"

namespace pagoda::model {

EagleRunner::EagleRunner(const EagleHead& head, std::unique_ptr<ModelOps> ops,
                         const EagleRunnerConfig& config, kv::ReqToTokenTable& table)
    : head_(&head), ops_(std::move(ops)), platform_(&ops_->platform()) {
  const EagleConfig& c = head.config();
  PAGODA_REQUIRE(config.page_size >= 1 && config.num_pages >= 1, kInvalidArgument,
                 "eagle runner needs page_size >= 1 and num_pages >= 1 (got {} / {})",
                 config.page_size, config.num_pages);
  const kv::KvPoolConfig pc{.layout = kv::KvLayout::kMha,
                            .num_layers = 1,
                            .num_pages = config.num_pages,
                            .page_size = config.page_size,
                            .dtype = config.kv_dtype,
                            .num_kv_heads = c.num_kv_heads,
                            .head_dim = c.head_dim,
                            .head_dim_v = c.head_dim};
  pool_ = std::make_unique<kv::KvPool>(pc, platform_->allocator());
  backends::register_builtin_backends(registry_, config.backend.kernels);
  attention::BackendRequirements req{.page_size = config.page_size,
                                     .head_dim_qk = c.head_dim,
                                     .head_dim_v = c.head_dim,
                                     .q_dtype = ops_->dtype(),
                                     .kv_dtype = config.kv_dtype,
                                     .sliding_window = false,
                                     .logit_cap = false};
  req.mixed_batches = config.mixed_batches;
  req.device = platform_->name();
  const attention::BackendContext ctx{
      .platform = platform_, .kv_pool = pool_.get(), .req_to_token = &table};
  backend_ = backends::make_backend(registry_, config.backend, req, ctx);
  layer_ = attention::AttentionLayer{
      .layer_id = LayerId{0},
      .num_q_heads = c.num_q_heads,
      .num_kv_heads = c.num_kv_heads,
      .head_dim_qk = c.head_dim,
      .head_dim_v = c.head_dim,
      .scaling = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim))),
      .logit_cap = 0.f,
      .sliding_window = -1,
  };
  ModelOps& o = *ops_;
  const EagleWeights& w = head.weights();
  fc_ = o.upload(head.fc_packed());
  qkv_ = o.upload(head.qkv_packed());
  o_ = o.upload(w.o_proj);
  post_norm_ = o.upload(w.post_norm);
  gate_up_ = o.upload(head.gate_up_packed());
  down_ = o.upload(w.down_proj);
  lm_head_ = o.upload(head.lm_head());
  ones_host_.assign(static_cast<size_t>(c.hidden_size), 1.f);
  ones_ = o.upload(ones_host_);
  hidden_norm_ = w.hidden_norm.empty() ? ones_ : o.upload(w.hidden_norm);
  const auto& inv = head.rope().inv_freq();
  inv_freq_ = o.upload_f32(std::vector<float>(inv.begin(), inv.end()));
}

EagleRunner::~EagleRunner() {
  try {
    platform_->synchronize_stream();
  } catch (...) {  // a destructor must not throw
  }
}

void EagleRunner::reserve(int64_t tokens, int64_t rows) {
  if (tokens <= cap_tokens_ && rows <= cap_rows_) return;
  const EagleConfig& c = head_->config();
  const int64_t t = std::max({tokens, cap_tokens_ * 2, int64_t{16}});
  const int64_t r = std::max({rows, cap_rows_ * 2, int64_t{16}});
  platform_->synchronize_stream();
  const size_t es = dtype_size(ops_->dtype());
  auto make = [&](int64_t elems, size_t size) {
    return platform::make_buffer(platform_->allocator(),
                                 static_cast<size_t>(std::max<int64_t>(elems, 1)) * size);
  };
  const int64_t h = c.hidden_size, d = c.head_dim, hq = c.num_q_heads, hkv = c.num_kv_heads;
  in_ = make(t * std::max(head_->fc_in_dim(), h), es);
  x_ = make(t * h, es);
  h_ = make(t * h, es);
  emb_ = make(t * h, es);
  cat_ = make(t * 2 * h, es);
  qkv_buf_ = make(t * (hq + 2 * hkv) * d, es);
  q_ = make(t * hq * d, es);
  k_ = make(t * hkv * d, es);
  v_ = make(t * hkv * d, es);
  o_buf_ = make(t * hq * d, es);
  mlp_ = make(t * 2 * c.intermediate_size, es);
  act_ = make(t * c.intermediate_size, es);
  residual_ = make(t * h, sizeof(float));
  pos_ = make(t, sizeof(int32_t));
  sel_ = make(r * h, es);
  logits_ = make(r * c.draft_vocab_size, sizeof(float));
  cap_tokens_ = t;
  cap_rows_ = r;
}

void EagleRunner::upload(void* dst, std::span<const float> host) {
  const DType dt = ops_->dtype();
  std::vector<uint8_t>& buf = pending_.emplace_back(host.size() * dtype_size(dt));
  if (dt == DType::kF32) {
    std::memcpy(buf.data(), host.data(), buf.size());
  } else {
    for (size_t i = 0; i < host.size(); ++i) write_from_f32(buf.data(), dt, i, host[i]);
  }
  platform_->copy_to_device_async(dst, buf.data(), buf.size());
}

EagleOutput EagleRunner::run(const EagleInput& in) {
  const EagleConfig& c = head_->config();
  const attention::ForwardBatch& f = in.forward;
  const int64_t t = f.num_tokens();
  const int64_t h = c.hidden_size;
  const bool e3 = c.layout == EagleLayout::kEagle3;
  const int64_t fdim = in.from_target ? head_->feature_dim() : h;
  PAGODA_REQUIRE(static_cast<int64_t>(in.input_ids.size()) == t &&
                     static_cast<int64_t>(f.positions.size()) == t,
                 kInvalidArgument, "eagle input has {} ids / {} positions for {} tokens",
                 in.input_ids.size(), f.positions.size(), t);
  PAGODA_REQUIRE(static_cast<int64_t>(in.features.size()) == t * fdim, kInvalidArgument,
                 "eagle input features have {} values, expected {} tokens × {}",
                 in.features.size(), t, fdim);
  for (int32_t id : in.input_ids)
    PAGODA_REQUIRE(id >= 0 && id < c.vocab_size, kOutOfRange, "eagle input id {} outside [0, {})",
                   id, c.vocab_size);
  for (int32_t r : in.logit_rows)
    PAGODA_REQUIRE(r >= 0 && r < t, kInvalidArgument, "eagle logit row {} outside [0, {})", r, t);
  EagleOutput out;
  if (t == 0) return out;
  const int64_t rows = static_cast<int64_t>(in.logit_rows.size());
  reserve(t, std::max<int64_t>(rows, 1));
  ModelOps& o = *ops_;
  const DType dt = o.dtype();
  const Device dev = o.device();
  const size_t es = dtype_size(dt);
  const float eps = c.rms_norm_eps;
  float* residual = static_cast<float*>(residual_.get());
  const std::vector<float>& table = head_->embed();
  // Embeddings (host gather) of the query tokens.
  std::vector<float> emb(static_cast<size_t>(t * h));
  for (int64_t r = 0; r < t; ++r)
    std::copy_n(table.begin() + int64_t{in.input_ids[static_cast<size_t>(r)]} * h, h,
                emb.begin() + r * h);
  const void* attn_in = nullptr;
  int64_t attn_k = 0;
  if (!e3) {
    // [e ; f (; 1)]: f = the target's final norm of its last layer's output, or the head's own r.
    const int64_t k = head_->fc_in_dim();
    std::vector<float> feat(in.features.begin(), in.features.end());
    if (in.from_target) {
      const LlamaModel& tg = head_->target();
      rms_norm(feat.data(), tg.final_norm_weights().data(), feat.data(), t, h,
               tg.config().rms_norm_eps);
    }
    std::vector<float> x(static_cast<size_t>(t * k), 1.f);
    for (int64_t r = 0; r < t; ++r) {
      std::copy_n(emb.begin() + r * h, h, x.begin() + r * k);
      std::copy_n(feat.begin() + r * h, h, x.begin() + r * k + h);
    }
    upload(in_.get(), x);
    o.linear(in_.get(), fc_, x_.get(), t, h, k);
    o.add_rms_norm(x_.get(), residual, ones_, h_.get(), t, h, eps, /*first=*/true);  // r = x0
    attn_in = x_.get();
    attn_k = h;
  } else {
    if (in.from_target) {
      upload(in_.get(), in.features);
      o.linear(in_.get(), fc_, x_.get(), t, h, 3 * h);
    } else {
      upload(x_.get(), in.features);
    }
    // r = x0; h = hidden_norm(x0); attention input [input_layernorm(e) ; h].
    o.add_rms_norm(x_.get(), residual, hidden_norm_, h_.get(), t, h, eps, /*first=*/true);
    rms_norm(emb.data(), head_->weights().input_norm.data(), emb.data(), t, h, eps);
    upload(emb_.get(), emb);
    const int64_t row = h * static_cast<int64_t>(es);
    o.copy_2d(cat_.get(), 2 * row, emb_.get(), row, row, t);
    o.copy_2d(static_cast<char*>(cat_.get()) + row, 2 * row, h_.get(), row, row, t);
    attn_in = cat_.get();
    attn_k = 2 * h;
  }
  const int hq = c.num_q_heads, hkv = c.num_kv_heads, d = c.head_dim;
  o.linear(attn_in, qkv_, qkv_buf_.get(), t, int64_t{hq + 2 * hkv} * d, attn_k);
  platform_->copy_to_device_async(pos_.get(), f.positions.data(),
                                  static_cast<size_t>(t) * sizeof(int32_t));
  o.qkv_rope(qkv_buf_.get(), nullptr, static_cast<const int32_t*>(pos_.get()), inv_freq_, q_.get(),
             k_.get(), v_.get(), t, hq, hkv, d);
  backend_->init_forward_metadata(f);
  backend_->forward(TensorView(q_.get(), dt, {t, hq, d}, dev),
                    TensorView(k_.get(), dt, {t, hkv, d}, dev),
                    TensorView(v_.get(), dt, {t, hkv, d}, dev), layer_, f,
                    TensorView(o_buf_.get(), dt, {t, hq, d}, dev), attention::SaveKv::kYes);
  o.linear(o_buf_.get(), o_, x_.get(), t, h, int64_t{hq} * d);
  o.add_rms_norm(x_.get(), residual, post_norm_, h_.get(), t, h, eps, false);
  const int64_t inter = c.intermediate_size;
  o.linear(h_.get(), gate_up_, mlp_.get(), t, 2 * inter, h);
  o.silu_mul(mlp_.get(), act_.get(), t, inter);
  o.linear(act_.get(), down_, x_.get(), t, h, inter);
  o.add_rms_norm(x_.get(), residual, ones_, h_.get(), t, h, eps, false);  // r = output
  out.hidden.resize(static_cast<size_t>(t * h));
  platform_->copy_to_host_async(out.hidden.data(), residual, out.hidden.size() * sizeof(float));
  platform_->synchronize_stream();
  pending_.clear();
  ++forwards_;
  if (rows == 0) return out;
  std::vector<float> z(static_cast<size_t>(rows * h));
  for (int64_t i = 0; i < rows; ++i)
    std::copy_n(out.hidden.begin() + int64_t{in.logit_rows[static_cast<size_t>(i)]} * h, h,
                z.begin() + i * h);
  if (e3) rms_norm(z.data(), head_->weights().norm.data(), z.data(), rows, h, eps);
  upload(sel_.get(), z);
  o.linear(sel_.get(), lm_head_, logits_.get(), rows, c.draft_vocab_size, h, /*f32_out=*/true);
  out.logits.resize(static_cast<size_t>(rows * c.draft_vocab_size));
  platform_->copy_to_host_async(out.logits.data(), logits_.get(),
                                out.logits.size() * sizeof(float));
  platform_->synchronize_stream();
  pending_.clear();
  return out;
}

void EagleRunner::move_kv(std::span<const SlotIndex> src, std::span<const SlotIndex> dst) {
  pool_->move_kv(src, dst);
}

}  // namespace pagoda::model
