#include "pagoda/backends/cpu/cpu_linear_backend.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "pagoda/kernels/cpu/ssd_rows.h"

namespace pagoda::backends {

using attention::LinearLayer;
using attention::LinearSeq;
using attention::LinearShape;

namespace {

/// v, or 0 below 1e-30: the scan's decay weights never feed denormals (each costs a microcode
/// assist in sgemm's FMAs) and what they drop is below f32's resolution of O(1) sums.
float flushed(float v) {
  return v < 1e-30f ? 0.f : v;
}

/// The OpenMP threads of the scan: all of them when OpenBLAS runs each sgemm on its caller's
/// thread; a threaded OpenBLAS (pthreads) called from several threads at once oversubscribes the
/// cores (20x slower measured), so then one thread runs everything and OpenBLAS threads each
/// sgemm.
int scan_threads() {
  return openblas_get_num_threads() == 1 ? omp_get_max_threads() : 1;
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
    float* conv_state = pool.conv_state(l, q.slot);
    conv_inputs(layer, conv_state, xbc.data_as<const float>() + r0 * xbc.stride(0),
                xbc.stride(0), q.num_tokens);
    float* h = pool.ssm_state(l, q.slot);
    const float* dt_raw = dt.data_as<const float>() + r0 * dt.stride(0);
    float* y_rows = y.data_as<float>() + r0 * y.stride(0);
    if (q.num_tokens < kChunkedFromTokens) {
      conv_rows(layer, 0, q.num_tokens);
      steps(layer, h, dt_raw, dt.stride(0), q.num_tokens, y_rows, y.stride(0));
    } else {
      scan(layer, h, dt_raw, dt.stride(0), q.num_tokens, y_rows, y.stride(0));
    }
    conv_keep_inputs(layer, conv_state, xbc.data_as<const float>() + r0 * xbc.stride(0),
                     xbc.stride(0), q.num_tokens);
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
    const float* in = xbc.data_as<const float>() + r * xbc.stride(0);
    conv_inputs(layer, pool.conv_state(l, node), in, xbc.stride(0), 1);
    conv_rows(layer, 0, 1);
    conv_keep_inputs(layer, pool.conv_state(l, node), in, xbc.stride(0), 1);
    time_steps(layer, dt.data_as<const float>() + r * dt.stride(0), dt.stride(0), 1);
    step(layer, pool.ssm_state(l, node), xbc_.data(), delta_.data(), decay_.data(),
         y.data_as<float>() + r * y.stride(0));
  }
}

void CpuLinearBackend::conv_inputs(const LinearLayer& layer, const float* conv_state,
                                   const float* rows, int64_t stride, int64_t t) {
  const attention::LinearWeights& w = layer.weights;
  const int64_t cd = layer.shape.conv_dim(), k = layer.shape.conv_kernel, past = k - 1;
  // The weights tap-major [k, cd] (they are channel-major [cd, k]): each tap a contiguous row.
  taps_.resize(static_cast<size_t>(k * cd));
  for (int64_t c = 0; c < cd; ++c)
    for (int64_t j = 0; j < k; ++j) taps_[j * cd + c] = w.conv[c * k + j];
  // Output row i's tap j reads the input at time i - past + j: the state's rows before the call.
  inputs_.resize(static_cast<size_t>(t * k));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t time = i - past + j;
      inputs_[i * k + j] = time < 0 ? conv_state + (past + time) * cd : rows + time * stride;
    }
}

void CpuLinearBackend::conv_rows(const LinearLayer& layer, int64_t i0, int64_t i1) {
  const int64_t cd = layer.shape.conv_dim();
  xbc_.resize(static_cast<size_t>(std::max<int64_t>(i1 - i0, 0) * cd));
  for (int64_t i = i0; i < i1; ++i) conv_row(layer, i, xbc_.data() + (i - i0) * cd);
}

void CpuLinearBackend::conv_row(const LinearLayer& layer, int64_t i, float* out) const {
  const int64_t k = layer.shape.conv_kernel;
  kernels::cpu::conv_silu_row(inputs_.data() + i * k, taps_.data(), layer.weights.conv_bias,
                              static_cast<int>(k), layer.shape.conv_dim(), out);
}

void CpuLinearBackend::conv_keep_inputs(const LinearLayer& layer, float* conv_state,
                                        const float* rows, int64_t stride, int64_t t) {
  const int64_t cd = layer.shape.conv_dim(), past = layer.shape.conv_kernel - 1;
  // The last `past` inputs; older state rows that stay move up (src ahead of dst).
  const int64_t kept = std::max<int64_t>(past - t, 0);
  std::copy(conv_state + (past - kept) * cd, conv_state + past * cd, conv_state);
  for (int64_t r = kept; r < past; ++r) {
    const float* in = rows + (t - past + r) * stride;
    std::copy(in, in + cd, conv_state + r * cd);
  }
}

void CpuLinearBackend::time_steps(const LinearLayer& layer, const float* dt_raw,
                                  int64_t dt_stride, int64_t t) {
  const LinearShape& s = layer.shape;
  const int64_t heads = s.num_heads;
  a_.resize(static_cast<size_t>(heads));
  for (int64_t hd = 0; hd < heads; ++hd) a_[hd] = -std::exp(layer.weights.a_log[hd]);
  delta_.resize(static_cast<size_t>(t * heads));
  decay_.resize(static_cast<size_t>(t * heads));
  // On the scan's threads (one row for a decode or a tree node).
#pragma omp parallel for schedule(static) num_threads(scan_threads()) if (t > 1)
  for (int64_t i = 0; i < t; ++i)
    kernels::cpu::ssd_time_steps(dt_raw + i * dt_stride, layer.weights.dt_bias, a_.data(), heads,
                                 s.dt_min, s.dt_max, delta_.data() + i * heads,
                                 decay_.data() + i * heads);
}

void CpuLinearBackend::step(const LinearLayer& layer, float* h, const float* xbc,
                            const float* delta, const float* decay, float* y) const {
  const LinearShape& s = layer.shape;
  const attention::LinearWeights& w = layer.weights;
  const int64_t p_dim = s.head_dim, n = s.state_size, di = s.d_inner();
  const int64_t per_group = s.num_heads / s.num_groups;
  for (int64_t hd = 0; hd < s.num_heads; ++hd) {
    const int64_t g = hd / per_group;
    const float dt = delta[hd], keep = decay[hd];
    const float* x = xbc + hd * p_dim;
    const float* b = xbc + di + g * n;
    const float* c = xbc + di + s.num_groups * n + g * n;
    for (int64_t p = 0; p < p_dim; ++p) {
      float* hr = h + (hd * p_dim + p) * n;
      const float dx = dt * x[p];
      float acc = 0.f;
      for (int64_t i = 0; i < n; ++i) {
        hr[i] = keep * hr[i] + dx * b[i];
        acc += hr[i] * c[i];
      }
      y[hd * p_dim + p] = acc + w.d[hd] * x[p];
    }
  }
}

void CpuLinearBackend::steps(const LinearLayer& layer, float* h, const float* dt_raw,
                             int64_t dt_stride, int64_t t, float* y, int64_t y_stride) {
  const int64_t cd = layer.shape.conv_dim(), heads = layer.shape.num_heads;
  time_steps(layer, dt_raw, dt_stride, t);
  for (int64_t i = 0; i < t; ++i)
    step(layer, h, xbc_.data() + i * cd, delta_.data() + i * heads, decay_.data() + i * heads,
         y + i * y_stride);
}

void CpuLinearBackend::scan(const LinearLayer& layer, float* h, const float* dt_raw,
                            int64_t dt_stride, int64_t t, float* y, int64_t y_stride) {
  const LinearShape& s = layer.shape;
  const attention::LinearWeights& w = layer.weights;
  const int64_t p_dim = s.head_dim, n = s.state_size, di = s.d_inner(), cd = s.conv_dim();
  const int64_t heads = s.num_heads, groups = s.num_groups, per_group = heads / groups;
  const int64_t q = std::min({int64_t{s.chunk_size}, kMaxChunk, t});
  const int64_t tri = std::min(q, kTriangleBlock);
  const int64_t row_blocks = (q + tri - 1) / tri;
  const int threads = scan_threads();
  // Each group's heads in blocks of `per_block`, at least one block per thread where the heads
  // allow and at most kBlockColumns columns (P each): a block's outputs from the entering state
  // and its state update are one sgemm each, and its states and rows stay in the core's cache.
  const int64_t blocks_per_group =
      std::clamp<int64_t>((threads + groups - 1) / groups, 1, per_group);
  const int64_t per_block =
      std::min((per_group + blocks_per_group - 1) / blocks_per_group,
               std::max<int64_t>(kBlockColumns / p_dim, 1));
  const int64_t group_blocks = (per_group + per_block - 1) / per_block;
  const int64_t blocks = groups * group_blocks;
  const int64_t block_cols = per_block * p_dim;
  xbc_.resize(static_cast<size_t>(q * cd));
  gram_.resize(static_cast<size_t>(groups * q * q));
  // Per thread: per head of a block the decay from the chunk's start to each row and from each
  // row to its end [2, per_block, q], the masked-score weights [q], the masked scores [q, q], the
  // weighted x of the block [q, per_block · P].
  const int64_t per_thread = 2 * per_block * q + q + q * q + q * block_cols;
  work_.resize(static_cast<size_t>(threads * per_thread));

  time_steps(layer, dt_raw, dt_stride, t);
  for (int64_t c0 = 0; c0 < t; c0 += q) {
    const int64_t len = std::min(q, t - c0);
    const int ln = static_cast<int>(len);
    // The chunk's conv rows (kept in cache for the chunk's products), replacing the last chunk's;
    // on `threads` too: an OpenMP team between threaded OpenBLAS calls (its threads spin after
    // each region while OpenBLAS's run) made the scan 2.2x slower, measured.
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < len; ++i) conv_row(layer, c0 + i, xbc_.data() + i * cd);
    const float* xbc = xbc_.data();  // row i of the chunk: xbc + i * cd
    const float* delta = delta_.data() + c0 * heads;  // Δ of row i, head hd: delta[i * heads + hd]
    const float* decay = decay_.data() + c0 * heads;  // exp(Δ·A), the same layout
    // gram_g = C_g · B_gᵀ [len, len] (the group's "attention scores"), block row by block row up
    // to the diagonal block: the masked blocks above it are never computed.
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t item = 0; item < groups * row_blocks; ++item) {
      const int64_t g = item / row_blocks, i0 = item % row_blocks * tri;
      if (i0 >= len) continue;
      const int64_t rows = std::min(tri, len - i0);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                  static_cast<int>(i0 + rows), static_cast<int>(n), 1.f,
                  xbc + i0 * cd + di + groups * n + g * n, static_cast<int>(cd), xbc + di + g * n,
                  static_cast<int>(cd), 0.f, gram_.data() + g * q * q + i0 * q,
                  static_cast<int>(q));
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      float* const from_start = work_.data() + omp_get_thread_num() * per_thread;
      float* const to_end = from_start + per_block * q;
      float* const r = to_end + per_block * q;
      float* const m = r + q;
      float* const xw = m + q * q;
      const int64_t g = blk / group_blocks, first = blk % group_blocks * per_block;
      const int64_t h0 = g * per_group + first, nh = std::min(per_block, per_group - first);
      const int nc = static_cast<int>(nh * p_dim);
      const float* b = xbc + di + g * n;
      const float* c = xbc + di + groups * n + g * n;
      const float* x = xbc + h0 * p_dim;  // the block's x of row i: x + i * cd
      float* hb = h + h0 * p_dim * n;     // the block's states [nh · P, N]
      float* yb = y + c0 * y_stride + h0 * p_dim;
      // The decay from the chunk's start through row i, exp(cum_i), and from row j to the
      // chunk's end, exp(cum_L - cum_j): products of the rows' factors (no exponential per
      // entry), 0 below 1e-30 (sgemm never sees denormals, which made it 4.5x slower).
      for (int64_t k = 0; k < nh; ++k) {
        float* fs = from_start + k * q;
        float* te = to_end + k * q;
        float run = 1.f;
        for (int64_t i = 0; i < len; ++i) fs[i] = run = flushed(run * decay[i * heads + h0 + k]);
        run = 1.f;
        for (int64_t j = len - 1; j >= 0; --j) {
          te[j] = run;
          run = flushed(run * decay[j * heads + h0 + k]);
        }
      }
      // From the state entering the chunk and the skip: y_i = exp(cum_i)·(h·C_i) + D·x_i, one
      // sgemm for the block, then each head's rows scaled and the skip added.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ln, nc, static_cast<int>(n), 1.f, c,
                  static_cast<int>(cd), hb, static_cast<int>(n), 0.f, yb,
                  static_cast<int>(y_stride));
      for (int64_t i = 0; i < len; ++i)
        for (int64_t k = 0; k < nh; ++k) {
          const float e = from_start[k * q + i], dk = w.d[h0 + k];
          float* yr = yb + i * y_stride + k * p_dim;
          const float* xr = x + i * cd + k * p_dim;
#pragma omp simd
          for (int64_t p = 0; p < p_dim; ++p) yr[p] = yr[p] * e + dk * xr[p];
        }
      // The state leaving the chunk: exp(cum_L)·h + Σ_j exp(cum_L - cum_j)·Δ_j·x_j ⊗ B_j,
      // the first term per head, the sum one sgemm for the block.
      for (int64_t k = 0; k < nh; ++k) {
        const float keep = from_start[k * q + len - 1];
        float* hk = hb + k * p_dim * n;
#pragma omp simd
        for (int64_t e = 0; e < p_dim * n; ++e) hk[e] *= keep;
      }
      for (int64_t j = 0; j < len; ++j)
        for (int64_t k = 0; k < nh; ++k) {
          const float coef = to_end[k * q + j] * delta[j * heads + h0 + k];
          const float* xj = x + j * cd + k * p_dim;
          float* xwj = xw + j * nc + k * p_dim;
#pragma omp simd
          for (int64_t p = 0; p < p_dim; ++p) xwj[p] = coef * xj[p];
        }
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nc, static_cast<int>(n), ln, 1.f, xw,
                  nc, b, static_cast<int>(cd), 1.f, hb, static_cast<int>(n));
      // Inside the chunk, per head: m[i, j] = gram[i, j]·exp(cum_i - cum_j)·Δ_j for j <= i,
      // else 0, and y += m·x over the block rows up to the diagonal block (the masked blocks
      // above it skipped). The weights r[j] = exp(cum_i - cum_j)·Δ_j advance by
      // row i's factor per row, 0 below 1e-30.
      const float* gr = gram_.data() + g * q * q;
      for (int64_t k = 0; k < nh; ++k) {
        const int64_t hd = h0 + k;
        for (int64_t i = 0; i < len; ++i) {
          const float f = decay[i * heads + hd];
          const int64_t end = std::min(len, (i / tri + 1) * tri);  // the block row's columns
          float* mi = m + i * q;
          const float* gi = gr + i * q;
#pragma omp simd
          for (int64_t j = 0; j < i; ++j) r[j] = flushed(r[j] * f);
          r[i] = delta[i * heads + hd];
#pragma omp simd
          for (int64_t j = 0; j <= i; ++j) mi[j] = gi[j] * r[j];
          std::fill(mi + i + 1, mi + end, 0.f);
        }
        float* yk = yb + k * p_dim;
        const float* xk = x + k * p_dim;
        for (int64_t i0 = 0; i0 < len; i0 += tri) {
          const int64_t rows = std::min(tri, len - i0);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows),
                      static_cast<int>(p_dim), static_cast<int>(i0 + rows), 1.f, m + i0 * q,
                      static_cast<int>(q), xk, static_cast<int>(cd), 1.f, yk + i0 * y_stride,
                      static_cast<int>(y_stride));
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
