#include "pagoda/backends/cpu/cpu_linear_backend.h"

#include <algorithm>
#include <cmath>
#include <memory>

namespace pagoda::backends {

using attention::LinearLayer;
using attention::LinearSeq;
using attention::LinearShape;

namespace {

float ssd_silu(float v) {
  return v / (1.f + std::exp(-v));
}

/// softplus (torch's, linear above 20), clamped to the time-step limits.
float ssd_time_step(float raw, float bias, const LinearShape& s) {
  const float v = raw + bias;
  const float sp = v > 20.f ? v : std::log1p(std::exp(v));
  return std::clamp(sp, s.dt_min, s.dt_max);
}

}  // namespace

void CpuLinearBackend::run(const LinearLayer& layer, const TensorView& xbc, const TensorView& dt,
                           const TensorView& y) {
  kv::StatePool& pool = this->pool();
  const int32_t l = layer.state_layer;
  int64_t r0 = 0;
  for (const LinearSeq& q : seqs()) {
    if (!q.node_slots.empty()) {
      tree_steps(layer, q, r0, xbc, dt, y);
      r0 += q.num_tokens;
      continue;
    }
    conv(layer, pool.conv_state(l, q.slot), xbc.data_as<const float>() + r0 * xbc.stride(0),
         xbc.stride(0), q.num_tokens);
    float* h = pool.ssm_state(l, q.slot);
    const float* dt_raw = dt.data_as<const float>() + r0 * dt.stride(0);
    float* y_rows = y.data_as<float>() + r0 * y.stride(0);
    if (q.num_tokens == 1)
      step(layer, h, xbc_.data(), dt_raw, y_rows);
    else
      scan(layer, h, dt_raw, dt.stride(0), q.num_tokens, y_rows, y.stride(0));
    r0 += q.num_tokens;
  }
}

void CpuLinearBackend::tree_steps(const LinearLayer& layer, const LinearSeq& q, int64_t row,
                                  const TensorView& xbc, const TensorView& dt,
                                  const TensorView& y) {
  kv::StatePool& pool = this->pool();
  const int32_t l = layer.state_layer;
  const int64_t conv_n = pool.shape().conv_floats(), ssm_n = pool.shape().ssm_floats();
  for (int32_t t = 0; t < q.num_tokens; ++t) {
    const int32_t parent = q.node_parents[static_cast<size_t>(t)];
    const int32_t from = parent < 0 ? q.slot : q.node_slots[static_cast<size_t>(parent)];
    const int32_t node = q.node_slots[static_cast<size_t>(t)];
    const float* c0 = pool.conv_state(l, from);
    const float* h0 = pool.ssm_state(l, from);
    std::copy(c0, c0 + conv_n, pool.conv_state(l, node));
    std::copy(h0, h0 + ssm_n, pool.ssm_state(l, node));
    const int64_t r = row + t;
    conv(layer, pool.conv_state(l, node), xbc.data_as<const float>() + r * xbc.stride(0),
         xbc.stride(0), 1);
    step(layer, pool.ssm_state(l, node), xbc_.data(), dt.data_as<const float>() + r * dt.stride(0),
         y.data_as<float>() + r * y.stride(0));
  }
}

void CpuLinearBackend::conv(const LinearLayer& layer, float* conv_state, const float* rows,
                            int64_t stride, int64_t t) {
  const attention::LinearWeights& w = layer.weights;
  const int64_t cd = layer.shape.conv_dim(), k = layer.shape.conv_kernel, past = k - 1;
  window_.resize(static_cast<size_t>((past + t) * cd));
  std::copy(conv_state, conv_state + past * cd, window_.begin());
  for (int64_t i = 0; i < t; ++i)
    std::copy(rows + i * stride, rows + i * stride + cd, window_.begin() + (past + i) * cd);
  xbc_.resize(static_cast<size_t>(t * cd));
  for (int64_t i = 0; i < t; ++i) {
    float* o = xbc_.data() + i * cd;
    for (int64_t c = 0; c < cd; ++c) o[c] = w.conv_bias ? w.conv_bias[c] : 0.f;
    for (int64_t j = 0; j < k; ++j) {
      const float* in = window_.data() + (i + j) * cd;  // input at time i - (k - 1) + j
      for (int64_t c = 0; c < cd; ++c) o[c] += w.conv[c * k + j] * in[c];
    }
    for (int64_t c = 0; c < cd; ++c) o[c] = ssd_silu(o[c]);
  }
  std::copy(window_.end() - past * cd, window_.end(), conv_state);
}

void CpuLinearBackend::step(const LinearLayer& layer, float* h, const float* xbc,
                            const float* dt_raw, float* y) const {
  const LinearShape& s = layer.shape;
  const attention::LinearWeights& w = layer.weights;
  const int64_t p_dim = s.head_dim, n = s.state_size, di = s.d_inner();
  const int64_t per_group = s.num_heads / s.num_groups;
  for (int64_t hd = 0; hd < s.num_heads; ++hd) {
    const int64_t g = hd / per_group;
    const float delta = ssd_time_step(dt_raw[hd], w.dt_bias[hd], s);
    const float decay = std::exp(-delta * std::exp(w.a_log[hd]));
    const float* x = xbc + hd * p_dim;
    const float* b = xbc + di + g * n;
    const float* c = xbc + di + s.num_groups * n + g * n;
    for (int64_t p = 0; p < p_dim; ++p) {
      float* hr = h + (hd * p_dim + p) * n;
      const float dx = delta * x[p];
      float acc = 0.f;
      for (int64_t i = 0; i < n; ++i) {
        hr[i] = decay * hr[i] + dx * b[i];
        acc += hr[i] * c[i];
      }
      y[hd * p_dim + p] = acc + w.d[hd] * x[p];
    }
  }
}

void CpuLinearBackend::scan(const LinearLayer& layer, float* h, const float* dt_raw,
                            int64_t dt_stride, int64_t t, float* y, int64_t y_stride) {
  const LinearShape& s = layer.shape;
  const attention::LinearWeights& w = layer.weights;
  const int64_t p_dim = s.head_dim, n = s.state_size, di = s.d_inner(), cd = s.conv_dim();
  const int64_t heads = s.num_heads, per_group = heads / s.num_groups;
  const int64_t q = s.chunk_size;
  delta_.resize(static_cast<size_t>(t * heads));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t hd = 0; hd < heads; ++hd)
      delta_[i * heads + hd] = ssd_time_step(dt_raw[i * dt_stride + hd], w.dt_bias[hd], s);
  cum_.resize(static_cast<size_t>(std::min(q, t)));
  gram_.resize(static_cast<size_t>(std::min(q, t) * std::min(q, t)));

  for (int64_t c0 = 0; c0 < t; c0 += q) {
    const int64_t len = std::min(q, t - c0);
    const float* xbc = xbc_.data() + c0 * cd;  // row i of the chunk: xbc + i * cd
    for (int64_t g = 0; g < s.num_groups; ++g) {
      // gram[i, j] = C_i · B_j for j <= i (the group's "attention scores" inside the chunk).
      for (int64_t i = 0; i < len; ++i) {
        const float* c = xbc + i * cd + di + s.num_groups * n + g * n;
        for (int64_t j = 0; j <= i; ++j) {
          const float* b = xbc + j * cd + di + g * n;
          float acc = 0.f;
          for (int64_t k = 0; k < n; ++k) acc += c[k] * b[k];
          gram_[i * len + j] = acc;
        }
      }
      for (int64_t hd = g * per_group; hd < (g + 1) * per_group; ++hd) {
        const float a = -std::exp(w.a_log[hd]);
        float run = 0.f;
        for (int64_t i = 0; i < len; ++i) cum_[i] = run += delta_[(c0 + i) * heads + hd] * a;
        float* hh = h + hd * p_dim * n;
        for (int64_t i = 0; i < len; ++i) {
          const float* c = xbc + i * cd + di + s.num_groups * n + g * n;
          const float* xi = xbc + i * cd + hd * p_dim;
          float* yi = y + (c0 + i) * y_stride + hd * p_dim;
          const float from_state = std::exp(cum_[i]);
          for (int64_t p = 0; p < p_dim; ++p) {
            float acc = 0.f;
            for (int64_t k = 0; k < n; ++k) acc += hh[p * n + k] * c[k];
            yi[p] = from_state * acc + w.d[hd] * xi[p];
          }
          for (int64_t j = 0; j <= i; ++j) {
            const float coef =
                std::exp(cum_[i] - cum_[j]) * gram_[i * len + j] * delta_[(c0 + j) * heads + hd];
            const float* xj = xbc + j * cd + hd * p_dim;
            for (int64_t p = 0; p < p_dim; ++p) yi[p] += coef * xj[p];
          }
        }
        // The state leaving the chunk.
        const float last = cum_[len - 1];
        const float carry = std::exp(last);
        for (int64_t e = 0; e < p_dim * n; ++e) hh[e] *= carry;
        for (int64_t j = 0; j < len; ++j) {
          const float coef = std::exp(last - cum_[j]) * delta_[(c0 + j) * heads + hd];
          const float* xj = xbc + j * cd + hd * p_dim;
          const float* b = xbc + j * cd + di + g * n;
          for (int64_t p = 0; p < p_dim; ++p) {
            const float cx = coef * xj[p];
            for (int64_t k = 0; k < n; ++k) hh[p * n + k] += cx * b[k];
          }
        }
      }
    }
  }
}

void register_cpu_linear_backend(attention::BackendRegistry& registry) {
  registry.add_linear(
      "cpu", "f32 Mamba2: chunked SSD scan for prefill, one-step decode",
      attention::host_linear_capabilities(),
      [](const attention::LinearBackendContext&) { return std::make_unique<CpuLinearBackend>(); });
}

}  // namespace pagoda::backends
