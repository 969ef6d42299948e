#include "pagoda/backends/reference/reference_linear_backend.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

namespace pagoda::backends {

using attention::LinearLayer;
using attention::LinearSeq;

namespace {

/// A sequence's state in fp64: `past` holds the last K conv inputs, oldest first (one more than
/// the pool keeps: the row before them is zero after a load; only the conv_shift fault reads
/// it), `h` the SSM state [H, P, N].
struct State {
  std::vector<double> past;
  std::vector<double> h;
};

State load(const kv::StatePool& pool, int32_t layer, int32_t slot, int32_t conv_dim, bool stale) {
  const kv::StateShape& sh = pool.shape();
  State s{std::vector<double>(static_cast<size_t>(sh.conv_floats() + conv_dim), 0.0),
          std::vector<double>(static_cast<size_t>(sh.ssm_floats()), 0.0)};
  if (stale) return s;
  const float* conv = pool.conv_state(layer, slot);
  std::copy(conv, conv + sh.conv_floats(), s.past.begin() + conv_dim);
  const float* h = pool.ssm_state(layer, slot);
  std::copy(h, h + sh.ssm_floats(), s.h.begin());
  return s;
}

void store(const State& s, kv::StatePool& pool, int32_t layer, int32_t slot, int32_t conv_dim) {
  float* conv = pool.conv_state(layer, slot);
  for (size_t i = static_cast<size_t>(conv_dim); i < s.past.size(); ++i)
    conv[i - static_cast<size_t>(conv_dim)] = static_cast<float>(s.past[i]);
  float* h = pool.ssm_state(layer, slot);
  for (size_t i = 0; i < s.h.size(); ++i) h[i] = static_cast<float>(s.h[i]);
}

double softplus(double v) {
  return v > 20.0 ? v : std::log1p(std::exp(v));
}

double silu(double v) {
  return v / (1.0 + std::exp(-v));
}

/// One token through the recurrence: conv over the window, SiLU, then one SSM step per head.
/// Advances `s`; writes y [d_inner].
void advance(State& s, const LinearLayer& layer, const float* in, const float* dt_raw, float* y,
             bool conv_shift) {
  const attention::LinearShape& shape = layer.shape;
  const attention::LinearWeights& w = layer.weights;
  const int64_t cd = shape.conv_dim(), k = shape.conv_kernel, di = shape.d_inner();
  const int64_t n = shape.state_size, pd = shape.head_dim;
  // The window: rows [first, first + K) of past (K rows) followed by this token's input.
  const int64_t first = conv_shift ? 0 : 1;
  std::vector<double> act(static_cast<size_t>(cd));
  for (int64_t c = 0; c < cd; ++c) {
    double acc = w.conv_bias != nullptr ? double{w.conv_bias[c]} : 0.0;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t row = first + j;
      const double v = row < k ? s.past[static_cast<size_t>(row * cd + c)] : double{in[c]};
      acc += double{w.conv[c * k + j]} * v;
    }
    act[static_cast<size_t>(c)] = silu(acc);
  }
  s.past.erase(s.past.begin(), s.past.begin() + cd);
  s.past.insert(s.past.end(), in, in + cd);

  const int64_t heads_per_group = shape.num_heads / shape.num_groups;
  for (int64_t hd = 0; hd < shape.num_heads; ++hd) {
    const int64_t g = hd / heads_per_group;
    const double delta = std::clamp(softplus(double{dt_raw[hd]} + double{w.dt_bias[hd]}),
                                    double{shape.dt_min}, double{shape.dt_max});
    const double decay = std::exp(delta * -std::exp(double{w.a_log[hd]}));
    const double* b = act.data() + di + g * n;
    const double* c = act.data() + di + shape.num_groups * n + g * n;
    for (int64_t p = 0; p < pd; ++p) {
      const double x = act[static_cast<size_t>(hd * pd + p)];
      double* h = s.h.data() + (hd * pd + p) * n;
      double out = double{w.d[hd]} * x;
      for (int64_t i = 0; i < n; ++i) {
        h[i] = decay * h[i] + delta * x * b[i];
        out += h[i] * c[i];
      }
      y[hd * pd + p] = static_cast<float>(out);
    }
  }
}

}  // namespace

ReferenceLinearBackend::ReferenceLinearBackend(LinearFaults faults, std::string name)
    : faults_(faults), name_(std::move(name)) {}

void ReferenceLinearBackend::run(const LinearLayer& layer, const TensorView& xbc,
                                 const TensorView& dt, const TensorView& y) {
  kv::StatePool& pool = this->pool();
  const int32_t l = layer.state_layer, cd = layer.shape.conv_dim();
  auto token = [&](State& s, int64_t row) {
    advance(s, layer, xbc.data_as<const float>() + row * xbc.stride(0),
            dt.data_as<const float>() + row * dt.stride(0), y.data_as<float>() + row * y.stride(0),
            faults_.conv_shift);
  };
  int64_t row = 0;
  for (const LinearSeq& q : seqs()) {
    if (q.node_slots.empty()) {
      State s = load(pool, l, q.slot, cd, faults_.stale_state);
      for (int32_t t = 0; t < q.num_tokens; ++t) token(s, row + t);
      store(s, pool, l, q.slot, cd);
    } else {
      // Each node from its parent's fp64 state (the root from the sequence's slot).
      std::vector<State> nodes;
      for (int32_t t = 0; t < q.num_tokens; ++t) {
        const int32_t parent = q.node_parents[static_cast<size_t>(t)];
        nodes.push_back(parent < 0 ? load(pool, l, q.slot, cd, faults_.stale_state)
                                   : nodes[static_cast<size_t>(parent)]);
        token(nodes.back(), row + t);
        store(nodes.back(), pool, l, q.node_slots[static_cast<size_t>(t)], cd);
      }
    }
    row += q.num_tokens;
  }
}

void register_reference_linear_backend(attention::BackendRegistry& registry) {
  registry.add_linear(
      "reference", "fp64 per-token Mamba2 recurrence (conv, then one SSM step per token)",
      attention::host_linear_capabilities(), [](const attention::LinearBackendContext&) {
        return std::make_unique<ReferenceLinearBackend>();
      });
}

}  // namespace pagoda::backends
