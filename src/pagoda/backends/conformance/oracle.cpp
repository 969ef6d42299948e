// The independent fp64 oracle (contract in oracle.h).
#include "pagoda/backends/conformance/oracle.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "pagoda/core/error.h"

namespace pagoda::backends::conformance {

namespace {

/// What a pool of kv_dtype returns for the value x stored with `scale`.
double dequantised(DType kv_dtype, float x, float scale) {
  return double(round_to(kv_dtype, x / scale)) * double(scale);
}

/// One row's dequantised keys [kv, Hkv, Dqk] and values [kv, Hkv, Dv].
struct DenseKv {
  std::vector<double> k, v;
};

DenseKv gather(const std::vector<float>& k_store, const std::vector<float>& v_store, int k_row,
               int v_row, const DenseRow& r, const attention::AttentionLayer& layer,
               DType kv_dtype, bool mla) {
  const int hkv = layer.num_kv_heads, dqk = layer.head_dim_qk, dv = layer.head_dim_v;
  DenseKv kv;
  kv.k.reserve(r.toks.size() * static_cast<size_t>(hkv * dqk));
  kv.v.reserve(r.toks.size() * static_cast<size_t>(hkv * dv));
  for (int tok : r.toks) {
    const float* krow = k_store.data() + static_cast<size_t>(tok) * k_row;
    for (int e = 0; e < hkv * dqk; ++e) kv.k.push_back(dequantised(kv_dtype, krow[e], layer.k_scale));
    for (int h = 0; h < hkv; ++h) {
      for (int d = 0; d < dv; ++d) {
        kv.v.push_back(mla ? dequantised(kv_dtype, krow[d], layer.k_scale)
                           : dequantised(kv_dtype, v_store[static_cast<size_t>(tok) * v_row +
                                                           static_cast<size_t>(h * dv + d)],
                                         layer.v_scale));
      }
    }
  }
  return kv;
}

}  // namespace

double lse_sum_noise(int64_t n) {
  constexpr double kUnit = 5.960464477539063e-08;  // 2^-24, f32 unit roundoff
  constexpr double kLog2e = 1.4426950408889634;
  return 4.0 * std::sqrt(double(n)) * kUnit * kLog2e;
}

Expected dense_oracle(const std::vector<float>& k_store, const std::vector<float>& v_store,
                      int k_row, int v_row, const std::vector<DenseRow>& rows, const HostTensor& q,
                      const attention::AttentionLayer& layer, DType kv_dtype, bool mla,
                      int head_dim_v, double q_rounding) {
  const int hq = layer.num_q_heads, hkv = layer.num_kv_heads;
  const int dqk = layer.head_dim_qk, dv = layer.head_dim_v;
  PAGODA_REQUIRE(hkv > 0 && hq % hkv == 0 && dv == head_dim_v && q.shape.size() == 3 &&
                     q.shape[1] == hq && q.shape[2] == dqk,
                 kInvalidArgument, "oracle: heads {}/{} dims {}/{} do not match q", hq, hkv, dqk, dv);
  PAGODA_REQUIRE(k_row == hkv * dqk && (mla || v_row == hkv * dv), kInvalidArgument,
                 "oracle: token rows {}/{} do not match the layer", k_row, v_row);
  const int64_t n = q.shape[0];
  const int group = hq / hkv;
  const double inf = std::numeric_limits<double>::infinity();
  Expected e{HostTensor({n, hq, dv}, DType::kF32), HostTensor({n, hq}, DType::kF32), {}};
  e.lse_tol.assign(static_cast<size_t>(n * hq), 0.0);
  std::vector<double> s, o(static_cast<size_t>(dv)), qh(static_cast<size_t>(dqk));
  std::vector<uint8_t> vis;
  int64_t t = 0;  // query token index into q
  for (const DenseRow& r : rows) {
    const int64_t kv = static_cast<int64_t>(r.toks.size());
    PAGODA_REQUIRE(r.bits.empty() || static_cast<int64_t>(r.bits.size()) == r.qo_len * kv,
                   kInvalidArgument, "oracle: mask has {} bits for {} x {}", r.bits.size(), r.qo_len, kv);
    PAGODA_REQUIRE(r.pos.empty() || static_cast<int64_t>(r.pos.size()) == kv, kInvalidArgument,
                   "oracle: {} key positions for {} keys", r.pos.size(), kv);
    const DenseKv dense = gather(k_store, v_store, k_row, v_row, r, layer, kv_dtype, mla);
    s.resize(static_cast<size_t>(kv));
    vis.resize(static_cast<size_t>(kv));
    for (int i = 0; i < r.qo_len; ++i, ++t) {
      PAGODA_REQUIRE(t < n, kInvalidArgument, "oracle: rows hold more queries than q's {}", n);
      const int64_t self = kv - r.qo_len + i;  // the query's own index among the keys
      auto pos = [&](int64_t j) { return r.pos.empty() ? j : int64_t{r.pos[static_cast<size_t>(j)]}; };
      for (int64_t j = 0; j < kv; ++j) {
        bool v = r.bits.empty() ? (layer.mask == attention::MaskKind::kNonCausal || j <= self)
                                : r.bits[static_cast<size_t>(i * kv + j)] != 0;
        if (layer.sliding_window >= 0 && pos(j) < pos(self) - layer.sliding_window) v = false;
        vis[static_cast<size_t>(j)] = v;
      }
      for (int h = 0; h < hq; ++h) {
        const int kvh = h / group;
        double m = layer.sinks.empty() ? -inf : double(layer.sinks[static_cast<size_t>(h)]);
        double mag_max = 0;  // max over visible keys of scale · Σ_d |q_d k_d|
        bool any = false;
        for (int d = 0; d < dqk; ++d) qh[static_cast<size_t>(d)] = q.get((t * hq + h) * dqk + d);
        for (int64_t j = 0; j < kv; ++j) {
          if (!vis[static_cast<size_t>(j)]) continue;
          const double* k = dense.k.data() + (j * hkv + kvh) * dqk;
          double dot = 0, mag = 0;
          for (int d = 0; d < dqk; ++d) {
            dot += qh[static_cast<size_t>(d)] * k[d];
            mag += std::fabs(qh[static_cast<size_t>(d)] * k[d]);
          }
          mag_max = std::max(mag_max, std::fabs(double(layer.scaling)) * mag);
          double x = double(layer.scaling) * dot;
          if (layer.logit_cap > 0.f) x = double(layer.logit_cap) * std::tanh(x / layer.logit_cap);
          s[static_cast<size_t>(j)] = x;
          m = std::max(m, x);
          any = true;
        }
        const int64_t idx = t * hq + h;
        if (!any) {
          for (int d = 0; d < dv; ++d) e.out.set(idx * dv + d, 0.f);
          e.lse.set(idx, -std::numeric_limits<float>::infinity());
          e.lse_tol[static_cast<size_t>(idx)] = 0;
          continue;
        }
        double z = layer.sinks.empty() ? 0.0 : std::exp(double(layer.sinks[static_cast<size_t>(h)]) - m);
        double w_min = inf;
        int64_t n_vis = 0;
        std::fill(o.begin(), o.end(), 0.0);
        for (int64_t j = 0; j < kv; ++j) {
          if (!vis[static_cast<size_t>(j)]) continue;
          const double w = std::exp(s[static_cast<size_t>(j)] - m);
          const double* v = dense.v.data() + (j * hkv + kvh) * dv;
          for (int d = 0; d < dv; ++d) o[static_cast<size_t>(d)] += w * v[d];
          z += w;
          w_min = std::min(w_min, w);
          ++n_vis;
        }
        for (int d = 0; d < dv; ++d) e.out.set(idx * dv + d, static_cast<float>(o[static_cast<size_t>(d)] / z));
        const double lse = (m + std::log(z)) / std::log(2.0);
        e.lse.set(idx, static_cast<float>(lse));
        const double p_min = w_min / z;
        const double drop_one = p_min < 1.0 ? -std::log2(1.0 - p_min) : inf;
        const double scale = 1.0 + std::fabs(lse);
        const double noise = kLseNoise * scale + lse_sum_noise(n_vis);
        // A query rounded by up to q_rounding (relative) moves each score by at most
        // q_rounding · scale · Σ|q_d k_d| (tanh's cap is 1-Lipschitz), so ln Z by the largest.
        e.lse_tol[static_cast<size_t>(idx)] = std::max(
            std::clamp(0.5 * drop_one, noise, 1e-3 * scale), q_rounding * mag_max / std::log(2.0));
      }
    }
  }
  PAGODA_REQUIRE(t == n, kInvalidArgument, "oracle: rows hold {} queries, q has {}", t, n);
  return e;
}

}  // namespace pagoda::backends::conformance
