#include "pagoda/model/mamba2_mixer.h"

#include <algorithm>

#include "pagoda/core/error.h"

namespace pagoda::model {

attention::LinearShape Mamba2Shape::linear() const {
  return attention::LinearShape{.num_heads = num_heads,
                                .head_dim = head_dim,
                                .state_size = state_size,
                                .num_groups = num_groups,
                                .conv_kernel = conv_kernel,
                                .chunk_size = chunk_size,
                                .dt_min = dt_min,
                                .dt_max = dt_max};
}

Mamba2Shape mamba2_shape(const ModelConfig& c) {
  const MambaConfig& m = c.mamba;
  return Mamba2Shape{.hidden_size = c.hidden_size,
                     .num_heads = m.num_heads,
                     .head_dim = m.head_dim,
                     .state_size = m.state_size,
                     .num_groups = m.num_groups,
                     .conv_kernel = m.conv_kernel,
                     .chunk_size = m.chunk_size,
                     // mamba_ssm's RMSNormGated (group_size = d_inner / ngroups), which
                     // transformers' BambaRMSNormGated follows since 5.x (Bamba-9B: 1 group).
                     .norm_groups = m.num_groups,
                     .norm_eps = c.rms_norm_eps,
                     .dt_min = static_cast<float>(m.dt_min),
                     .dt_max = static_cast<float>(m.dt_max)};
}

void Mamba2Shape::validate() const {
  auto need = [](bool ok, const char* what) {
    PAGODA_REQUIRE(ok, kInvalidArgument, "Mamba2 mixer: {}", what);
  };
  need(hidden_size >= 1, "hidden_size must be >= 1");
  linear().validate();
  need(norm_groups >= 1 && d_inner() % norm_groups == 0,
       "the gated norm's group count must divide d_inner");
  need(norm_eps > 0.f, "rms_norm_eps must be > 0");
}

Mamba2Mixer::Mamba2Mixer(const Mamba2Shape& shape, ModelOps& ops) : shape_(shape), ops_(&ops) {
  shape.validate();
  PAGODA_REQUIRE(ops.supports_mamba_ops(), kUnsupported,
                 "the Mamba2 mixer needs the model ops' add_bias and gated_rms_norm, which the {} "
                 "ops do not implement",
                 ops.platform().name());
}

void Mamba2Mixer::reserve(int64_t rows) {
  if (rows <= rows_) return;
  platform::Platform& p = ops_->platform();
  p.synchronize_stream();  // queued work may still use the old scratch
  const int64_t r = std::max(rows, 2 * rows_);
  const auto f32 = static_cast<int64_t>(sizeof(float));
  const auto es = static_cast<int64_t>(dtype_size(ops_->dtype()));
  proj_ = platform::make_buffer(p.allocator(), static_cast<size_t>(r * shape_.in_proj_dim() * f32));
  y_ = platform::make_buffer(p.allocator(), static_cast<size_t>(r * shape_.d_inner() * f32));
  normed_ = platform::make_buffer(p.allocator(), static_cast<size_t>(r * shape_.d_inner() * es));
  rows_ = r;
}

void Mamba2Mixer::forward(attention::LinearAttentionBackend& backend, const Mamba2Weights& w,
                          int32_t layer, const void* u, void* out) {
  const Mamba2Shape& s = shape_;
  PAGODA_REQUIRE(w.in_proj && w.norm && w.out_proj, kInvalidArgument,
                 "Mamba2 mixer: a weight other than a bias is missing");
  const int64_t rows = backend.num_tokens();
  if (rows == 0) return;
  reserve(rows);
  ModelOps& ops = *ops_;
  const Device dev = ops.device();
  const int64_t in_dim = s.in_proj_dim(), di = s.d_inner(), cd = s.conv_dim();
  auto* proj = static_cast<float*>(proj_.get());
  auto* y = static_cast<float*>(y_.get());
  ops.linear(u, w.in_proj, proj, rows, in_dim, s.hidden_size, /*f32_out=*/true);
  if (w.in_bias != nullptr) ops.add_bias(proj, DType::kF32, w.in_bias, rows, in_dim);
  // xBC and dt are column blocks of the projection rows [z | xBC | dt].
  const TensorView xbc(proj + di, DType::kF32, {rows, cd}, {in_dim, 1}, dev);
  const TensorView dt(proj + di + cd, DType::kF32, {rows, int64_t{s.num_heads}}, {in_dim, 1},
                      dev);
  backend.forward({.state_layer = layer, .shape = s.linear(), .weights = w.linear()}, xbc, dt,
                  TensorView(y, DType::kF32, {rows, di}, dev));
  // The gate: the first d_inner projections of each row.
  ops.gated_rms_norm(y, proj, in_dim, w.norm, normed_.get(), rows, di, s.norm_groups, s.norm_eps);
  ops.linear(normed_.get(), w.out_proj, out, rows, s.hidden_size, di);
  if (w.out_bias != nullptr) ops.add_bias(out, ops.dtype(), w.out_bias, rows, s.hidden_size);
}

}  // namespace pagoda::model
