#include "pagoda/model/mamba2_mixer.h"

#include <algorithm>
#include <cmath>

#include "pagoda/core/error.h"

namespace pagoda::model {

namespace {

float mamba_silu(float v) {
  return v / (1.f + std::exp(-v));
}

/// softplus (torch's, linear above 20), clamped to the time-step limits.
float mamba_time_step(float raw, float bias, const Mamba2Shape& s) {
  const float v = raw + bias;
  const float sp = v > 20.f ? v : std::log1p(std::exp(v));
  return std::clamp(sp, s.dt_min, s.dt_max);
}

void mamba_add_bias(float* rows, const float* bias, int64_t m, int64_t n) {
  if (bias == nullptr) return;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < n; ++i) rows[r * n + i] += bias[i];
}

}  // namespace

kv::StateShape Mamba2Shape::state_shape() const {
  return kv::StateShape{.conv_dim = conv_dim(),
                        .conv_width = conv_kernel - 1,
                        .num_heads = num_heads,
                        .head_dim = head_dim,
                        .state_size = state_size};
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
  need(num_heads >= 1 && head_dim >= 1 && state_size >= 1,
       "mamba_n_heads, mamba_d_head and mamba_d_state must be >= 1");
  need(num_groups >= 1 && num_heads % num_groups == 0,
       "mamba_n_groups must be >= 1 and divide mamba_n_heads");
  need(conv_kernel >= 1, "mamba_d_conv must be >= 1");
  need(chunk_size >= 1, "mamba_chunk_size must be >= 1");
  need(norm_groups >= 1 && d_inner() % norm_groups == 0,
       "the gated norm's group count must divide d_inner");
  need(norm_eps > 0.f, "rms_norm_eps must be > 0");
  need(dt_min >= 0.f && dt_max >= dt_min, "time_step_limit must satisfy 0 <= min <= max");
}

Mamba2Mixer::Mamba2Mixer(const Mamba2Shape& shape, ModelOps& ops) : shape_(shape), ops_(&ops) {
  shape.validate();
  PAGODA_REQUIRE(ops.device().is_cpu() && ops.dtype() == DType::kF32, kUnsupported,
                 "the Mamba2 mixer runs on the CPU in f32 only: the {} platform has no causal "
                 "conv or SSD scan kernels yet",
                 ops.platform().name());
}

void Mamba2Mixer::forward(const Mamba2Weights& w, kv::StatePool& pool, int32_t layer,
                          std::span<const Mamba2Seq> seqs, const float* u, float* out) {
  const Mamba2Shape& s = shape_;
  PAGODA_REQUIRE(pool.shape() == s.state_shape(), kInvalidArgument,
                 "Mamba2 mixer: the state pool's shape does not match the mixer's");
  PAGODA_REQUIRE(layer >= 0 && layer < pool.num_layers(), kOutOfRange,
                 "Mamba2 mixer: state layer {} outside [0, {})", layer, pool.num_layers());
  PAGODA_REQUIRE(w.in_proj && w.conv && w.dt_bias && w.a_log && w.d && w.norm && w.out_proj,
                 kInvalidArgument, "Mamba2 mixer: a weight other than a bias is missing");
  std::vector<int32_t> slots;
  int64_t rows = 0;
  for (const Mamba2Seq& q : seqs) {
    PAGODA_REQUIRE(q.num_tokens >= 1, kInvalidArgument,
                   "Mamba2 mixer: sequence of {} tokens (>= 1)", q.num_tokens);
    pool.require_held(q.slot, "Mamba2 mixer");
    slots.push_back(q.slot);
    rows += q.num_tokens;
    if (q.node_slots.empty() && q.node_parents.empty()) continue;
    PAGODA_REQUIRE(std::ssize(q.node_slots) == q.num_tokens &&
                       std::ssize(q.node_parents) == q.num_tokens,
                   kInvalidArgument,
                   "Mamba2 mixer: a tree verify of {} tokens needs as many node slots and parents "
                   "(got {} and {})",
                   q.num_tokens, q.node_slots.size(), q.node_parents.size());
    for (int32_t t = 0; t < q.num_tokens; ++t) {
      const int32_t parent = q.node_parents[static_cast<size_t>(t)];
      PAGODA_REQUIRE(t == 0 ? parent == -1 : parent >= 0 && parent < t, kInvalidArgument,
                     "Mamba2 mixer: node {}'s parent {} is not an earlier node (the root's is -1)",
                     t, parent);
      pool.require_held(q.node_slots[static_cast<size_t>(t)], "Mamba2 mixer (tree node)");
      slots.push_back(q.node_slots[static_cast<size_t>(t)]);
    }
  }
  std::sort(slots.begin(), slots.end());
  PAGODA_REQUIRE(std::adjacent_find(slots.begin(), slots.end()) == slots.end(), kInvalidArgument,
                 "Mamba2 mixer: two sequences of one batch share a state slot");
  if (rows == 0) return;

  const int64_t in_dim = s.in_proj_dim(), di = s.d_inner();
  proj_.resize(static_cast<size_t>(rows * in_dim));
  ops_->linear(u, w.in_proj, proj_.data(), rows, in_dim, s.hidden_size, /*f32_out=*/true);
  mamba_add_bias(proj_.data(), w.in_bias, rows, in_dim);
  y_.resize(static_cast<size_t>(rows * di));

  int64_t r0 = 0;
  for (const Mamba2Seq& q : seqs) {
    const float* row = proj_.data() + r0 * in_dim;
    if (!q.node_slots.empty()) {
      tree_steps(w, pool, layer, q, row, y_.data() + r0 * di);
      r0 += q.num_tokens;
      continue;
    }
    conv(w, pool.conv_state(layer, q.slot), row + di, q.num_tokens);
    float* h = pool.ssm_state(layer, q.slot);
    const float* dt_raw = row + di + s.conv_dim();
    if (q.num_tokens == 1)
      step(w, h, xbc_.data(), dt_raw, y_.data() + r0 * di);
    else
      scan(w, h, dt_raw, q.num_tokens, y_.data() + r0 * di);
    r0 += q.num_tokens;
  }
  gated_norm(w, y_.data(), rows);
  ops_->linear(y_.data(), w.out_proj, out, rows, s.hidden_size, di, /*f32_out=*/true);
  mamba_add_bias(out, w.out_bias, rows, s.hidden_size);
}

void Mamba2Mixer::tree_steps(const Mamba2Weights& w, kv::StatePool& pool, int32_t layer,
                             const Mamba2Seq& q, const float* row, float* y) {
  const int64_t in_dim = shape_.in_proj_dim(), di = shape_.d_inner();
  const int64_t conv_n = pool.shape().conv_floats(), ssm_n = pool.shape().ssm_floats();
  for (int32_t t = 0; t < q.num_tokens; ++t) {
    const int32_t parent = q.node_parents[static_cast<size_t>(t)];
    const int32_t from = parent < 0 ? q.slot : q.node_slots[static_cast<size_t>(parent)];
    const int32_t node = q.node_slots[static_cast<size_t>(t)];
    const float* c0 = pool.conv_state(layer, from);
    const float* h0 = pool.ssm_state(layer, from);
    std::copy(c0, c0 + conv_n, pool.conv_state(layer, node));
    std::copy(h0, h0 + ssm_n, pool.ssm_state(layer, node));
    const float* r = row + t * in_dim;
    conv(w, pool.conv_state(layer, node), r + di, 1);
    step(w, pool.ssm_state(layer, node), xbc_.data(), r + di + shape_.conv_dim(), y + t * di);
  }
}

void Mamba2Mixer::conv(const Mamba2Weights& w, float* conv_state, const float* rows, int64_t t) {
  const int64_t cd = shape_.conv_dim(), k = shape_.conv_kernel, past = k - 1;
  const int64_t in_dim = shape_.in_proj_dim();
  window_.resize(static_cast<size_t>((past + t) * cd));
  std::copy(conv_state, conv_state + past * cd, window_.begin());
  for (int64_t i = 0; i < t; ++i)
    std::copy(rows + i * in_dim, rows + i * in_dim + cd, window_.begin() + (past + i) * cd);
  xbc_.resize(static_cast<size_t>(t * cd));
  for (int64_t i = 0; i < t; ++i) {
    float* o = xbc_.data() + i * cd;
    for (int64_t c = 0; c < cd; ++c) o[c] = w.conv_bias ? w.conv_bias[c] : 0.f;
    for (int64_t j = 0; j < k; ++j) {
      const float* in = window_.data() + (i + j) * cd;  // input at time i - (k - 1) + j
      for (int64_t c = 0; c < cd; ++c) o[c] += w.conv[c * k + j] * in[c];
    }
    for (int64_t c = 0; c < cd; ++c) o[c] = mamba_silu(o[c]);
  }
  std::copy(window_.end() - past * cd, window_.end(), conv_state);
}

void Mamba2Mixer::step(const Mamba2Weights& w, float* h, const float* xbc, const float* dt_raw,
                       float* y) {
  const Mamba2Shape& s = shape_;
  const int64_t p_dim = s.head_dim, n = s.state_size, di = s.d_inner();
  const int64_t per_group = s.num_heads / s.num_groups;
  for (int64_t hd = 0; hd < s.num_heads; ++hd) {
    const int64_t g = hd / per_group;
    const float delta = mamba_time_step(dt_raw[hd], w.dt_bias[hd], s);
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

void Mamba2Mixer::scan(const Mamba2Weights& w, float* h, const float* dt_raw, int64_t t, float* y) {
  const Mamba2Shape& s = shape_;
  const int64_t p_dim = s.head_dim, n = s.state_size, di = s.d_inner(), cd = s.conv_dim();
  const int64_t in_dim = s.in_proj_dim(), heads = s.num_heads, per_group = heads / s.num_groups;
  const int64_t q = s.chunk_size;
  delta_.resize(static_cast<size_t>(t * heads));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t hd = 0; hd < heads; ++hd)
      delta_[i * heads + hd] = mamba_time_step(dt_raw[i * in_dim + hd], w.dt_bias[hd], s);
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
          float* yi = y + (c0 + i) * di + hd * p_dim;
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
