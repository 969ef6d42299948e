#include "pagoda/backends/conformance/linear_oracle.h"

#include <algorithm>
#include <cmath>

namespace pagoda::backends::conformance {

std::vector<double> linear_oracle(const attention::LinearShape& shape, const LinearOracleWeights& w,
                                  LinearOracleState& state, const std::vector<double>& xbc,
                                  const std::vector<double>& dt) {
  const size_t cd = static_cast<size_t>(shape.conv_dim()), k = size_t(shape.conv_kernel);
  const size_t heads = size_t(shape.num_heads), pd = size_t(shape.head_dim);
  const size_t n = size_t(shape.state_size), groups = size_t(shape.num_groups);
  const size_t di = heads * pd, tokens = dt.size() / heads;
  // The whole input of the convolution: the state's K-1 rows, then the T new rows.
  std::vector<double> in = state.conv;
  in.insert(in.end(), xbc.begin(), xbc.end());
  std::vector<double> act(tokens * cd);
  for (size_t t = 0; t < tokens; ++t)
    for (size_t c = 0; c < cd; ++c) {
      double v = w.conv_bias.empty() ? 0.0 : w.conv_bias[c];
      for (size_t j = 0; j < k; ++j) v += w.conv[c * k + j] * in[(t + j) * cd + c];
      act[t * cd + c] = v / (1.0 + std::exp(-v));
    }
  auto x_at = [&](size_t t, size_t h, size_t p) { return act[t * cd + h * pd + p]; };
  auto b_at = [&](size_t t, size_t g, size_t i) { return act[t * cd + di + g * n + i]; };
  auto c_at = [&](size_t t, size_t g, size_t i) { return act[t * cd + di + (groups + g) * n + i]; };

  std::vector<double> y(tokens * di);
  std::vector<double> last(heads * pd * n);
  for (size_t h = 0; h < heads; ++h) {
    const size_t g = h / (heads / groups);
    const double a = -std::exp(w.a_log[h]);
    std::vector<double> delta(tokens), cum(tokens);
    double run = 0.0;
    for (size_t t = 0; t < tokens; ++t) {
      const double v = dt[t * heads + h] + w.dt_bias[h];
      const double softplus = v > 20.0 ? v : std::log(1.0 + std::exp(v));
      delta[t] = std::min(std::max(softplus, double{shape.dt_min}), double{shape.dt_max});
      run += delta[t] * a;
      cum[t] = run;
    }
    for (size_t t = 0; t < tokens; ++t)
      for (size_t p = 0; p < pd; ++p) {
        // h_t[p, :] in closed form, then its product with C_t.
        double out = w.d[h] * x_at(t, h, p);
        for (size_t i = 0; i < n; ++i) {
          double hv = std::exp(cum[t]) * state.ssm[(h * pd + p) * n + i];
          for (size_t s = 0; s <= t; ++s)
            hv += std::exp(cum[t] - cum[s]) * delta[s] * x_at(s, h, p) * b_at(s, g, i);
          out += hv * c_at(t, g, i);
          if (t + 1 == tokens) last[(h * pd + p) * n + i] = hv;
        }
        y[t * di + h * pd + p] = out;
      }
  }
  if (tokens > 0) state.ssm = last;
  state.conv.assign(in.end() - static_cast<std::ptrdiff_t>((k - 1) * cd), in.end());
  return y;
}

}  // namespace pagoda::backends::conformance
