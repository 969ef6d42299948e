#include "pagoda/backends/cpu/cpu_linear_backend.h"

#include <cblas.h>
#include <omp.h>

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

/// exp(v), 0 below 1e-30 (exp(-69)): the scan's decay weights never feed denormals (each costs
/// a microcode assist in sgemm's FMAs) and what they drop is below f32's resolution of O(1) sums.
float flushed_exp(float v) {
  return v < -69.f ? 0.f : std::exp(v);
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
    if (q.num_tokens < kChunkedFromTokens)
      steps(layer, h, dt_raw, dt.stride(0), q.num_tokens, y_rows, y.stride(0));
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

void CpuLinearBackend::steps(const LinearLayer& layer, float* h, const float* dt_raw,
                             int64_t dt_stride, int64_t t, float* y, int64_t y_stride) const {
  const int64_t cd = layer.shape.conv_dim();
  for (int64_t i = 0; i < t; ++i)
    step(layer, h, xbc_.data() + i * cd, dt_raw + i * dt_stride, y + i * y_stride);
}

void CpuLinearBackend::scan(const LinearLayer& layer, float* h, const float* dt_raw,
                            int64_t dt_stride, int64_t t, float* y, int64_t y_stride) {
  const LinearShape& s = layer.shape;
  const attention::LinearWeights& w = layer.weights;
  const int64_t p_dim = s.head_dim, n = s.state_size, di = s.d_inner(), cd = s.conv_dim();
  const int64_t heads = s.num_heads, groups = s.num_groups, per_group = heads / groups;
  const int64_t q = std::min({int64_t{s.chunk_size}, kMaxChunk, t});
  delta_.resize(static_cast<size_t>(t * heads));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t hd = 0; hd < heads; ++hd)
      delta_[i * heads + hd] = ssd_time_step(dt_raw[i * dt_stride + hd], w.dt_bias[hd], s);
  gram_.resize(static_cast<size_t>(groups * q * q));
  // Per thread: cumulative Δ·A [q], decay weights [q], C scaled [q, N], the masked scores
  // [q, q], Δ-weighted x [q, P].
  const int64_t per_thread = 2 * q + q * n + q * q + q * p_dim;
  work_.resize(static_cast<size_t>(omp_get_max_threads() * per_thread));

  // Heads run on the OpenMP threads when OpenBLAS runs each sgemm on its caller's thread; a
  // threaded OpenBLAS (pthreads) called from several threads at once oversubscribes the cores
  // (20x slower measured), so then the heads run in turn and OpenBLAS threads each sgemm.
  const bool heads_in_parallel = openblas_get_num_threads() == 1;
  for (int64_t c0 = 0; c0 < t; c0 += q) {
    const int64_t len = std::min(q, t - c0);
    const int ln = static_cast<int>(len);
    const float* xbc = xbc_.data() + c0 * cd;  // row i of the chunk: xbc + i * cd
    // gram_g = C_g · B_gᵀ [len, len] (the group's "attention scores"; the upper half unused).
    for (int64_t g = 0; g < groups; ++g)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ln, ln, static_cast<int>(n), 1.f,
                  xbc + di + groups * n + g * n, static_cast<int>(cd), xbc + di + g * n,
                  static_cast<int>(cd), 0.f, gram_.data() + g * q * q, ln);
#pragma omp parallel for schedule(static) if (heads_in_parallel)
    for (int64_t hd = 0; hd < heads; ++hd) {
      float* cum = work_.data() + omp_get_thread_num() * per_thread;
      float* r = cum + q;
      float* cs = r + q;
      float* m = cs + q * n;
      float* xw = m + q * q;
      const int64_t g = hd / per_group;
      const float a = -std::exp(w.a_log[hd]);
      const float* dl = delta_.data() + c0 * heads + hd;  // Δ of row i: dl[i * heads]
      const float* b = xbc + di + g * n;
      const float* c = xbc + di + groups * n + g * n;
      const float* x = xbc + hd * p_dim;
      float* hh = h + hd * p_dim * n;
      float* yh = y + c0 * y_stride + hd * p_dim;
      float run = 0.f;
      for (int64_t i = 0; i < len; ++i) cum[i] = run += dl[i * heads] * a;
      const float last = cum[len - 1];
      // From the state entering the chunk: y_i = exp(cum_i)·(h·C_i).
      for (int64_t i = 0; i < len; ++i) {
        const float e = flushed_exp(cum[i]);
        for (int64_t k = 0; k < n; ++k) cs[i * n + k] = e * c[i * cd + k];
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ln, static_cast<int>(p_dim),
                  static_cast<int>(n), 1.f, cs, static_cast<int>(n), hh, static_cast<int>(n), 0.f,
                  yh, static_cast<int>(y_stride));
      // The state leaving the chunk: exp(cum_L)·h + Σ_j exp(cum_L - cum_j)·Δ_j·x_j ⊗ B_j.
      for (int64_t j = 0; j < len; ++j) {
        const float coef = flushed_exp(last - cum[j]) * dl[j * heads];
        for (int64_t p = 0; p < p_dim; ++p) xw[j * p_dim + p] = coef * x[j * cd + p];
      }
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(p_dim),
                  static_cast<int>(n), ln, 1.f, xw, static_cast<int>(p_dim), b,
                  static_cast<int>(cd), flushed_exp(last), hh, static_cast<int>(n));
      // Inside the chunk: m[i, j] = gram[i, j]·exp(cum_i - cum_j)·Δ_j for j <= i, else 0. The
      // decay weights r[j] = exp(cum_i - cum_j)·Δ_j advance by one factor exp(Δ_i·A) per row
      // (a product, not an exponential per entry); below 1e-30 they are 0 (no denormals).
      const float* gr = gram_.data() + g * q * q;
      for (int64_t i = 0; i < len; ++i) {
        const float decay = std::exp(dl[i * heads] * a);
        float* mi = m + i * len;
        const float* gi = gr + i * len;
#pragma omp simd
        for (int64_t j = 0; j < i; ++j) {
          const float v = r[j] * decay;
          r[j] = v < 1e-30f ? 0.f : v;
        }
        r[i] = dl[i * heads];
#pragma omp simd
        for (int64_t j = 0; j <= i; ++j) mi[j] = gi[j] * r[j];
        std::fill(mi + i + 1, mi + len, 0.f);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ln, static_cast<int>(p_dim), ln,
                  1.f, m, ln, x, static_cast<int>(cd), 1.f, yh, static_cast<int>(y_stride));
      for (int64_t i = 0; i < len; ++i)
        for (int64_t p = 0; p < p_dim; ++p) yh[i * y_stride + p] += w.d[hd] * x[i * cd + p];
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
