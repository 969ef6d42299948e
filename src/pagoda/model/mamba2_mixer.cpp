#include "pagoda/model/mamba2_mixer.h"

#include <algorithm>
#include <cmath>

#include "pagoda/core/error.h"

namespace pagoda::model {

namespace {

float mamba_silu(float v) {
  return v / (1.f + std::exp(-v));
}

void mamba_add_bias(float* rows, const float* bias, int64_t m, int64_t n) {
  if (bias == nullptr) return;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < n; ++i) rows[r * n + i] += bias[i];
}

}  // namespace

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
                     .norm_groups = 1,
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
  PAGODA_REQUIRE(ops.device().is_cpu() && ops.dtype() == DType::kF32, kUnsupported,
                 "the Mamba2 mixer runs on the CPU in f32 only: its projections and gated norm "
                 "take host f32 ops, and the {} platform has no linear-attention backend yet",
                 ops.platform().name());
}

void Mamba2Mixer::forward(attention::LinearAttentionBackend& backend, const Mamba2Weights& w,
                          int32_t layer, const float* u, float* out) {
  const Mamba2Shape& s = shape_;
  PAGODA_REQUIRE(w.in_proj && w.norm && w.out_proj, kInvalidArgument,
                 "Mamba2 mixer: a weight other than a bias is missing");
  const int64_t rows = backend.num_tokens();
  if (rows == 0) return;
  const int64_t in_dim = s.in_proj_dim(), di = s.d_inner(), cd = s.conv_dim();
  proj_.resize(static_cast<size_t>(rows * in_dim));
  ops_->linear(u, w.in_proj, proj_.data(), rows, in_dim, s.hidden_size, /*f32_out=*/true);
  mamba_add_bias(proj_.data(), w.in_bias, rows, in_dim);
  y_.resize(static_cast<size_t>(rows * di));
  // xBC and dt are column blocks of the projection rows [z | xBC | dt].
  const TensorView xbc(proj_.data() + di, DType::kF32, {rows, cd}, {in_dim, 1});
  const TensorView dt(proj_.data() + di + cd, DType::kF32, {rows, int64_t{s.num_heads}},
                      {in_dim, 1});
  backend.forward({.state_layer = layer, .shape = s.linear(), .weights = w.linear()}, xbc, dt,
                  TensorView(y_.data(), DType::kF32, {rows, di}));
  gated_norm(w, y_.data(), rows);
  ops_->linear(y_.data(), w.out_proj, out, rows, s.hidden_size, di, /*f32_out=*/true);
  mamba_add_bias(out, w.out_bias, rows, s.hidden_size);
}

void Mamba2Mixer::gated_norm(const Mamba2Weights& w, float* y, int64_t rows) const {
  const int64_t di = shape_.d_inner(), in_dim = shape_.in_proj_dim();
  const int64_t group = di / shape_.norm_groups;
  for (int64_t r = 0; r < rows; ++r) {
    float* v = y + r * di;
    const float* z = proj_.data() + r * in_dim;  // the gate: the first d_inner projections
    for (int64_t i = 0; i < di; ++i) v[i] *= mamba_silu(z[i]);
    for (int64_t g0 = 0; g0 < di; g0 += group) {
      float ss = 0.f;
      for (int64_t i = g0; i < g0 + group; ++i) ss += v[i] * v[i];
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(group) + shape_.norm_eps);
      for (int64_t i = g0; i < g0 + group; ++i) v[i] *= inv * w.norm[i];
    }
  }
}

}  // namespace pagoda::model
