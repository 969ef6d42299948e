#pragma once
// An independent, obviously-correct Llama forward pass for tests: plain loops in double, one
// sequence, one token at a time over contiguous per-layer K/V vectors. No paging, no batching,
// no prefix cache, no BLAS, no backend. It shares only ModelConfig + ModelWeights with pagoda.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "pagoda/model/config.h"
#include "pagoda/model/weights.h"

namespace pagoda::testing {

class NaiveLlama {
 public:
  NaiveLlama(const model::ModelConfig& c, const model::ModelWeights& w) : c_(c), w_(w) {
    const int half = c.head_dim / 2;
    for (int i = 0; i < half; ++i) {
      const float expo = static_cast<float>(2 * i) / static_cast<float>(c.head_dim);
      double f = 1.0 / std::pow(c.rope.theta, static_cast<double>(expo));
      if (c.rope.scaling == model::RopeScalingKind::kLinear) f /= c.rope.factor;
      if (c.rope.scaling == model::RopeScalingKind::kLlama3) {
        const double lo = c.rope.original_max_position / c.rope.low_freq_factor;
        const double hi = c.rope.original_max_position / c.rope.high_freq_factor;
        const double wl = 2 * std::numbers::pi / f;
        if (wl > lo) {
          f /= c.rope.factor;
        } else if (wl >= hi) {
          const double s = (c.rope.original_max_position / wl - c.rope.low_freq_factor) /
                           (c.rope.high_freq_factor - c.rope.low_freq_factor);
          f = (1 - s) * f / c.rope.factor + s * f;
        }
      }
      inv_freq_.push_back(static_cast<float>(f));
    }
    k_.resize(c.num_layers);
    v_.resize(c.num_layers);
  }

  /// Feeds one token at the next position; returns its next-token logits.
  /// The residual stream after layer l for the last fed token (EAGLE features).
  const std::vector<double>& layer_output(int l) const { return layer_out_[static_cast<size_t>(l)]; }

  std::vector<double> feed(int32_t token) {
    const int H = c_.hidden_size, D = c_.head_dim, hq = c_.num_q_heads, hkv = c_.num_kv_heads;
    const int pos = pos_++;
    std::vector<double> x(H);
    for (int i = 0; i < H; ++i) x[i] = w_.embed[static_cast<size_t>(token) * H + i];
    for (int l = 0; l < c_.num_layers; ++l) {
      const auto& lw = w_.layers[l];
      auto h = norm(x, lw.input_norm);
      auto q = matvec(lw.q_proj, h, hq * D);
      auto k = matvec(lw.k_proj, h, hkv * D);
      auto v = matvec(lw.v_proj, h, hkv * D);
      if (c_.qkv_bias) {  // Qwen2: q = h·Wqᵀ + b_q (and k, v)
        for (int i = 0; i < hq * D; ++i) q[i] += lw.q_bias[i];
        for (int i = 0; i < hkv * D; ++i) k[i] += lw.k_bias[i];
        for (int i = 0; i < hkv * D; ++i) v[i] += lw.v_bias[i];
      }
      rope(q, hq, pos);
      rope(k, hkv, pos);
      k_[l].push_back(k);
      v_[l].push_back(v);
      std::vector<double> o(hq * D, 0.0);
      const int window = c_.window_of(l);
      for (int head = 0; head < hq; ++head) {
        const int kh = head / (hq / hkv);
        std::vector<double> s;
        std::vector<int> idx;
        for (int j = 0; j <= pos; ++j) {
          if (window >= 0 && j < pos - window) continue;
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += q[head * D + d] * k_[l][j][kh * D + d];
          double sc = dot / std::sqrt(static_cast<double>(D));
          if (c_.attn_logit_softcap > 0) sc = c_.attn_logit_softcap * std::tanh(sc / c_.attn_logit_softcap);
          s.push_back(sc);
          idx.push_back(j);
        }
        const double m = *std::max_element(s.begin(), s.end());
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - m));
        for (size_t t = 0; t < s.size(); ++t)
          for (int d = 0; d < D; ++d) o[head * D + d] += s[t] / z * v_[l][idx[t]][kh * D + d];
      }
      auto ao = matvec(lw.o_proj, o, H);
      for (int i = 0; i < H; ++i) x[i] += ao[i];
      h = norm(x, lw.post_norm);
      auto g = matvec(lw.gate_proj, h, c_.intermediate_size);
      auto u = matvec(lw.up_proj, h, c_.intermediate_size);
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      auto dn = matvec(lw.down_proj, g, H);
      for (int i = 0; i < H; ++i) x[i] += dn[i];
      layer_out_.resize(static_cast<size_t>(c_.num_layers));
      layer_out_[static_cast<size_t>(l)] = x;
    }
    auto f = norm(x, w_.final_norm);
    auto logits = matvec(w_.lm_head_matrix(), f, c_.vocab_size);
    if (c_.final_logit_softcap > 0)
      for (double& e : logits) e = c_.final_logit_softcap * std::tanh(e / c_.final_logit_softcap);
    return logits;
  }

  /// Greedy generation from scratch: the output tokens plus, per output token, the gap between
  /// the best and second-best logit (to tell a real mismatch from an f32-vs-f64 near tie).
  struct Greedy {
    std::vector<int32_t> tokens;
    std::vector<double> margins;
  };
  static Greedy generate(const model::ModelConfig& c, const model::ModelWeights& w,
                         const std::vector<int32_t>& prompt, int max_new, bool stop_at_eos) {
    NaiveLlama m(c, w);
    std::vector<double> logits;
    for (int32_t t : prompt) logits = m.feed(t);
    Greedy g;
    for (int i = 0; i < max_new; ++i) {
      int best = 0, second = -1;
      for (int v = 1; v < static_cast<int>(logits.size()); ++v) {
        if (logits[v] > logits[best]) {
          second = best;
          best = v;
        } else if (second < 0 || logits[v] > logits[second]) {
          second = v;
        }
      }
      g.tokens.push_back(best);
      g.margins.push_back(logits[best] - logits[second]);
      if (stop_at_eos && best == c.eos_token_id) break;
      if (i + 1 < max_new) logits = m.feed(best);
    }
    return g;
  }

 private:
  std::vector<std::vector<double>> layer_out_;
  std::vector<double> norm(const std::vector<double>& x, const std::vector<float>& w) const {
    double ss = 0;
    for (double e : x) ss += e * e;
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + c_.rms_norm_eps);
    std::vector<double> o(x.size());
    for (size_t i = 0; i < x.size(); ++i) o[i] = x[i] * inv * w[i];
    return o;
  }
  static std::vector<double> matvec(const std::vector<float>& w, const std::vector<double>& x,
                                    int out) {
    std::vector<double> y(out, 0.0);
    const size_t in = x.size();
    for (int r = 0; r < out; ++r) {
      double acc = 0;
      for (size_t i = 0; i < in; ++i) acc += static_cast<double>(w[r * in + i]) * x[i];
      y[r] = acc;
    }
    return y;
  }
  void rope(std::vector<double>& x, int heads, int pos) const {
    const int D = c_.head_dim, half = D / 2;
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < half; ++i) {
        const double ang = static_cast<double>(static_cast<float>(pos) * inv_freq_[i]);
        const double a = x[h * D + i], b = x[h * D + i + half];
        x[h * D + i] = a * std::cos(ang) - b * std::sin(ang);
        x[h * D + i + half] = b * std::cos(ang) + a * std::sin(ang);
      }
  }

  const model::ModelConfig& c_;
  const model::ModelWeights& w_;
  std::vector<float> inv_freq_;
  int pos_ = 0;
  std::vector<std::vector<std::vector<double>>> k_, v_;
};

}  // namespace pagoda::testing
