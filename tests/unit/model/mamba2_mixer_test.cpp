// The Mamba2 mixer (model/mamba2_mixer.h) against an oracle written from the math in f64: a
// plain per-token recurrence (in_proj, causal conv with its history, SiLU, softplus time step,
// h_t = exp(Δ·A)·h_{t-1} + Δ·x ⊗ B, y = h·C + D·x, gate then grouped RMSNorm, out_proj), not the
// chunked form. On random shapes (seed printed), three requests of random lengths run as one
// prefill, as single-token decode steps, as ragged calls split at random points (chunk
// boundaries anywhere relative to the SSD chunk size), and as a prefix whose state is snapshot
// into another slot (StatePool::copy_slot) and continued there; every output (NaN-poisoned
// before each call) and every final state is compared with the oracle, and slots and layers
// the calls do not name keep their bytes. Bad batches are refused with nothing changed. Every
// test runs once per linear-attention backend of the build (reference, and cpu when built).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "pagoda/backends/builtin.h"
#include "pagoda/core/error.h"
#include "pagoda/kv/state_pool.h"
#include "pagoda/model/mamba2_mixer.h"
#include "pagoda/platform/platform.h"
#include "random_floats.h"
#include "test_seed.h"

namespace pagoda::model {
namespace {

using pagoda::testing::uniform_floats;

/// The mixer on one linear-attention backend; forward() plans the batch and runs one layer, as
/// the decoder does per step and layer.
class MixerOn {
 public:
  MixerOn(const Mamba2Shape& shape, ModelOps& ops, const std::string& backend) : mixer_(shape, ops) {
    attention::BackendRegistry registry;
    backends::register_builtin_backends(registry);
    backend_ = registry.create_linear(backend, {}, {});
  }
  void forward(const Mamba2Weights& w, kv::StatePool& pool, int32_t layer,
               std::span<const Mamba2Seq> seqs, const float* u, float* out) {
    backend_->init_forward_metadata(pool, seqs);
    mixer_.forward(*backend_, w, layer, u, out);
  }

 private:
  Mamba2Mixer mixer_;
  std::unique_ptr<attention::LinearAttentionBackend> backend_;
};

/// The host linear-attention backends of this build (device ones: tests/cuda).
std::vector<std::string> linear_backends() {
  attention::BackendRegistry registry;
  backends::register_builtin_backends(registry);
  std::vector<std::string> out;
  for (const std::string& name : registry.linear_names())
    if (registry.linear_capabilities(name).device == "cpu") out.push_back(name);
  return out;
}

struct MambaTestWeights {
  std::vector<float> in_proj, in_bias, conv, conv_bias, dt_bias, a_log, d, norm, out_proj, out_bias;
  Mamba2Weights view(bool biases) const {
    return Mamba2Weights{.in_proj = in_proj.data(),
                         .in_bias = biases ? in_bias.data() : nullptr,
                         .conv = conv.data(),
                         .conv_bias = biases ? conv_bias.data() : nullptr,
                         .dt_bias = dt_bias.data(),
                         .a_log = a_log.data(),
                         .d = d.data(),
                         .norm = norm.data(),
                         .out_proj = out_proj.data(),
                         .out_bias = biases ? out_bias.data() : nullptr};
  }
};

/// The oracle's state of one request: the last K-1 conv inputs (oldest first) and h.
struct OracleState {
  std::vector<double> hist;  // [K-1, conv_dim]
  std::vector<double> h;     // [heads, head_dim, state]
};

double oracle_silu(double v) {
  return v / (1.0 + std::exp(-v));
}

/// One token through the layer in f64; returns out [hidden].
std::vector<double> oracle_token(const Mamba2Shape& s, const MambaTestWeights& w, bool biases,
                                 OracleState& st, const float* u) {
  const int hid = s.hidden_size, di = s.d_inner(), cd = s.conv_dim(), k = s.conv_kernel;
  const int n = s.state_size, pd = s.head_dim, g_n = s.num_groups * n;
  std::vector<double> proj(static_cast<size_t>(s.in_proj_dim()));
  for (int r = 0; r < s.in_proj_dim(); ++r) {
    double acc = biases ? w.in_bias[r] : 0.0;
    for (int i = 0; i < hid; ++i) acc += double{w.in_proj[size_t(r) * hid + i]} * u[i];
    proj[r] = acc;
  }
  const double* z = proj.data();
  const double* xbc_in = proj.data() + di;
  const double* dt = proj.data() + di + cd;
  std::vector<double> xbc(static_cast<size_t>(cd));
  for (int c = 0; c < cd; ++c) {
    double acc = biases ? w.conv_bias[c] : 0.0;
    for (int j = 0; j + 1 < k; ++j)
      acc += double{w.conv[size_t(c) * k + j]} * st.hist[size_t(j) * cd + c];
    acc += double{w.conv[size_t(c) * k + k - 1]} * xbc_in[c];
    xbc[c] = oracle_silu(acc);
  }
  if (k > 1) {
    st.hist.erase(st.hist.begin(), st.hist.begin() + cd);
    st.hist.insert(st.hist.end(), xbc_in, xbc_in + cd);
  }
  std::vector<double> y(static_cast<size_t>(di));
  for (int hd = 0; hd < s.num_heads; ++hd) {
    const int g = hd / (s.num_heads / s.num_groups);
    const double v = dt[hd] + w.dt_bias[hd];
    const double delta = std::clamp(std::log1p(std::exp(v)), double{s.dt_min}, double{s.dt_max});
    const double decay = std::exp(delta * -std::exp(double{w.a_log[hd]}));
    for (int p = 0; p < pd; ++p) {
      const double x = xbc[size_t(hd) * pd + p];
      double acc = 0;
      for (int i = 0; i < n; ++i) {
        double& h = st.h[(size_t(hd) * pd + p) * n + i];
        h = decay * h + delta * x * xbc[size_t(di) + g * n + i];
        acc += h * xbc[size_t(di) + g_n + g * n + i];
      }
      y[size_t(hd) * pd + p] = acc + w.d[hd] * x;
    }
  }
  for (int i = 0; i < di; ++i) y[i] *= oracle_silu(z[i]);
  const int group = di / s.norm_groups;
  for (int g0 = 0; g0 < di; g0 += group) {
    double ss = 0;
    for (int i = g0; i < g0 + group; ++i) ss += y[i] * y[i];
    const double inv = 1.0 / std::sqrt(ss / group + s.norm_eps);
    for (int i = g0; i < g0 + group; ++i) y[i] *= inv * w.norm[i];
  }
  std::vector<double> out(static_cast<size_t>(hid));
  for (int r = 0; r < hid; ++r) {
    double acc = biases ? w.out_bias[r] : 0.0;
    for (int i = 0; i < di; ++i) acc += double{w.out_proj[size_t(r) * di + i]} * y[i];
    out[r] = acc;
  }
  return out;
}

struct MambaCase {
  Mamba2Shape shape;
  MambaTestWeights w;
  bool biases = true;
};

/// Random weights (and biases on or off) for `shape`.
MambaCase with_weights(const Mamba2Shape& shape, std::mt19937_64& rng) {
  MambaCase c;
  c.shape = shape;
  const Mamba2Shape& s = c.shape;
  c.biases = rng() % 2 == 0;
  const auto hid = size_t(s.hidden_size), di = size_t(s.d_inner()), cd = size_t(s.conv_dim());
  const auto heads = size_t(s.num_heads), in_dim = size_t(s.in_proj_dim());
  const float in_scale = 1.5f / std::sqrt(float(hid)), out_scale = 1.f / std::sqrt(float(di));
  c.w.in_proj = uniform_floats(rng, in_dim * hid, -in_scale, in_scale);
  c.w.in_bias = uniform_floats(rng, in_dim, -0.2f, 0.2f);
  c.w.conv = uniform_floats(rng, cd * size_t(s.conv_kernel), -0.6f, 0.6f);
  c.w.conv_bias = uniform_floats(rng, cd, -0.2f, 0.2f);
  c.w.dt_bias = uniform_floats(rng, heads, -1.5f, 0.5f);
  c.w.a_log = uniform_floats(rng, heads, -1.f, 1.5f);
  c.w.d = uniform_floats(rng, heads, -1.f, 1.f);
  c.w.norm = uniform_floats(rng, di, 0.5f, 1.5f);
  c.w.out_proj = uniform_floats(rng, hid * di, -out_scale, out_scale);
  c.w.out_bias = uniform_floats(rng, hid, -0.2f, 0.2f);
  return c;
}

/// A small random shape (groups 1 or 2, d_conv 1..4, chunk 1..8, norm groups 1 or 2, with or
/// without a time-step limit) with random weights.
MambaCase random_case(std::mt19937_64& rng) {
  auto pick = [&](int lo, int hi) { return lo + static_cast<int>(rng() % uint64_t(hi - lo + 1)); };
  Mamba2Shape s;
  s.num_groups = pick(1, 2);
  s.num_heads = s.num_groups * pick(1, 3);
  s.head_dim = pick(2, 6);
  s.state_size = pick(2, 8);
  s.hidden_size = pick(4, 20);
  s.conv_kernel = pick(1, 4);
  s.chunk_size = pick(1, 8);
  s.norm_groups = (rng() % 2 && s.d_inner() % 2 == 0) ? 2 : 1;
  s.norm_eps = 1e-5f;
  if (rng() % 2) {  // a time-step limit like Bamba's time_step_limit
    s.dt_min = 0.01f;
    s.dt_max = 0.8f;
  }
  return with_weights(s, rng);
}

/// A layer's state of one slot, conv then SSM.
std::vector<float> slot_state(const kv::StatePool& pool, int32_t layer, int32_t slot) {
  const kv::StateShape& sh = pool.shape();
  std::vector<float> v(pool.conv_state(layer, slot),
                       pool.conv_state(layer, slot) + sh.conv_floats());
  v.insert(v.end(), pool.ssm_state(layer, slot), pool.ssm_state(layer, slot) + sh.ssm_floats());
  return v;
}

std::vector<double> oracle_state(const OracleState& st) {
  std::vector<double> v = st.hist;
  v.insert(v.end(), st.h.begin(), st.h.end());
  return v;
}

/// One call: each entry (request r, tokens [from, from + n)) in order.
struct Piece {
  int r = 0, from = 0, n = 0;
};

class MixerHarness {
 public:
  MixerHarness(const MambaCase& c, const std::vector<std::vector<float>>& inputs,
               const std::vector<std::vector<std::vector<double>>>& want, kv::StatePool& pool,
               MixerOn& mixer)
      : c_(c), inputs_(inputs), want_(want), pool_(pool), mixer_(mixer) {}

  /// Runs `pieces` as one batch on state layer 1 with each request r in slots[r]; checks every
  /// output row against the oracle.
  void call(const std::vector<Piece>& pieces, const std::vector<int32_t>& slots) {
    const int hid = c_.shape.hidden_size;
    std::vector<Mamba2Seq> seqs;
    std::vector<float> u;
    for (const Piece& p : pieces) {
      seqs.push_back({.slot = slots[size_t(p.r)], .num_tokens = p.n});
      const float* src = inputs_[size_t(p.r)].data() + size_t(p.from) * hid;
      u.insert(u.end(), src, src + size_t(p.n) * hid);
    }
    std::vector<float> out(u.size(), std::numeric_limits<float>::quiet_NaN());
    mixer_.forward(c_.w.view(c_.biases), pool_, 1, seqs, u.data(), out.data());
    size_t row = 0;
    for (const Piece& p : pieces)
      for (int t = p.from; t < p.from + p.n; ++t, ++row)
        for (int i = 0; i < hid; ++i) {
          const double ref = want_[size_t(p.r)][size_t(t)][size_t(i)];
          const float got = out[row * size_t(hid) + size_t(i)];
          ASSERT_TRUE(std::isfinite(got)) << "request " << p.r << " token " << t << " dim " << i;
          ASSERT_NEAR(got, ref, 2e-4 * std::max(1.0, std::fabs(ref)))
              << "request " << p.r << " token " << t << " dim " << i << " (call of " << p.n << ")";
        }
  }

 private:
  const MambaCase& c_;
  const std::vector<std::vector<float>>& inputs_;
  const std::vector<std::vector<std::vector<double>>>& want_;
  kv::StatePool& pool_;
  MixerOn& mixer_;
};

/// Runs requests of lengths `len` through `c`'s layer four ways (one prefill; decode steps;
/// ragged calls cut at random points; a prefix snapshot into another slot and continued there),
/// each against the oracle, and checks the final states and the bytes of what no call names.
void check_case(const MambaCase& c, const std::vector<int>& len, std::mt19937_64& rng,
                ModelOps& ops, const std::string& backend) {
  const int num_requests = static_cast<int>(len.size());
  const Mamba2Shape& s = c.shape;
  // Inputs and the oracle's outputs and final states per request.
  std::vector<std::vector<float>> inputs(num_requests);
  std::vector<std::vector<std::vector<double>>> want(num_requests);
  std::vector<std::vector<double>> final_state(num_requests);
  for (int r = 0; r < num_requests; ++r) {
    inputs[r] = uniform_floats(rng, size_t(len[r]) * size_t(s.hidden_size), -1.f, 1.f);
    OracleState st{std::vector<double>(size_t(s.conv_kernel - 1) * size_t(s.conv_dim()), 0.0),
                   std::vector<double>(size_t(s.state_shape().ssm_floats()), 0.0)};
    for (int t = 0; t < len[r]; ++t)
      want[r].push_back(
          oracle_token(s, c.w, c.biases, st, inputs[r].data() + size_t(t) * size_t(s.hidden_size)));
    final_state[r] = oracle_state(st);
  }

  kv::StatePool pool(2, 4 * num_requests + 3, s.state_shape());
  MixerOn mixer(s, ops, backend);
  MixerHarness run(c, inputs, want, pool, mixer);
  auto take = [&] {
    std::vector<int32_t> v;
    for (int r = 0; r < num_requests; ++r) v.push_back(pool.alloc());
    return v;
  };
  const std::vector<int32_t> prefill = take(), decode = take(), split = take(), restore = take();
  // Bystanders: random contents that no call may touch, in layer 0 of every held slot and in
  // both layers of two slots no call names.
  const int32_t by0 = pool.alloc(), by1 = pool.alloc();
  struct Kept {
    int32_t slot, layer;
    std::vector<float> bytes;
  };
  std::vector<Kept> untouched;
  for (int32_t slot = 0; slot < pool.num_slots(); ++slot)
    for (int32_t layer = 0; layer < 2 && pool.refcount(slot) > 0; ++layer) {
      if (layer == 1 && slot != by0 && slot != by1) continue;
      const kv::StateShape sh = s.state_shape();
      const std::vector<float> r1 = uniform_floats(rng, size_t(sh.conv_floats()), -1, 1);
      std::copy(r1.begin(), r1.end(), pool.conv_state(layer, slot));
      const std::vector<float> r2 = uniform_floats(rng, size_t(sh.ssm_floats()), -1, 1);
      std::copy(r2.begin(), r2.end(), pool.ssm_state(layer, slot));
      untouched.push_back({slot, layer, slot_state(pool, layer, slot)});
    }

  // 1. One prefill call for all three requests.
  std::vector<Piece> all;
  for (int r = 0; r < num_requests; ++r) all.push_back({r, 0, len[r]});
  run.call(all, prefill);
  // 2. Decode: one token of every unfinished request per call.
  for (int t = 0; t < *std::max_element(len.begin(), len.end()); ++t) {
    std::vector<Piece> step;
    for (int r = 0; r < num_requests; ++r)
      if (t < len[r]) step.push_back({r, t, 1});
    run.call(step, decode);
  }
  // 3. Ragged calls cut at random points; a request sits out some calls.
  std::vector<int> done(num_requests, 0);
  while (done != len) {
    std::vector<Piece> pieces;
    for (int r = 0; r < num_requests; ++r) {
      if (done[r] == len[r] || rng() % 4 == 0) continue;
      const int n = 1 + static_cast<int>(rng() % uint64_t(len[r] - done[r]));
      pieces.push_back({r, done[r], n});
      done[r] += n;
    }
    if (!pieces.empty()) run.call(pieces, split);
  }
  // 4. A prefix in a scratch slot, snapshot into another slot, the scratch slot freed (zeroed),
  //    the rest continued from the snapshot.
  std::vector<int32_t> resumed = restore;
  for (int r = 0; r < num_requests; ++r) {
    const int cut = static_cast<int>(rng() % uint64_t(len[r] + 1));
    if (cut > 0) run.call({{r, 0, cut}}, restore);
    resumed[size_t(r)] = pool.alloc();
    pool.copy_slot(restore[size_t(r)], resumed[size_t(r)]);
    pool.free(restore[size_t(r)]);
    if (cut < len[r]) run.call({{r, cut, len[r] - cut}}, resumed);
  }
  if (::testing::Test::HasFatalFailure()) return;

  for (const std::vector<int32_t>* slots :
       std::array<const std::vector<int32_t>*, 4>{&prefill, &decode, &split, &resumed})
    for (int r = 0; r < num_requests; ++r) {
      const std::vector<float> got = slot_state(pool, 1, (*slots)[size_t(r)]);
      ASSERT_EQ(got.size(), final_state[r].size());
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], final_state[r][i], 2e-4 * std::max(1.0, std::fabs(final_state[r][i])))
            << "final state of request " << r << " float " << i;
    }
  // The restore slots were freed (zeroed) and reused for snapshots: the rest kept their bytes.
  for (const Kept& kept : untouched) {
    if (std::count(restore.begin(), restore.end(), kept.slot) ||
        std::count(resumed.begin(), resumed.end(), kept.slot))
      continue;
    EXPECT_EQ(slot_state(pool, kept.layer, kept.slot), kept.bytes)
        << "slot " << kept.slot << " layer " << kept.layer;
  }
  pool.check_integrity();
}

/// A fresh random seed (printed, and in every failure's trace) and the CPU f32 ops; the
/// parameter is the linear-attention backend.
class Mamba2MixerRandom : public ::testing::TestWithParam<std::string> {
 protected:
  const testing::TestSeed seed_;
  std::mt19937_64 rng_{seed_};
  std::unique_ptr<platform::Platform> platform_ = platform::make_cpu_platform();
  std::unique_ptr<ModelOps> ops_ = make_cpu_ops(*platform_, DType::kF32);
};

TEST_P(Mamba2MixerRandom, PrefillDecodeSplitsAndRestoreMatchRecurrence) {
  for (int iter = 0; iter < 8; ++iter) {
    const MambaCase c = random_case(rng_);
    const Mamba2Shape& s = c.shape;
    SCOPED_TRACE(::testing::Message()
                 << "iter " << iter << ": heads " << s.num_heads << " groups " << s.num_groups
                 << " head_dim " << s.head_dim << " state " << s.state_size << " d_conv "
                 << s.conv_kernel << " chunk " << s.chunk_size << " norm groups " << s.norm_groups
                 << " biases " << c.biases << " dt_max " << s.dt_max);
    std::vector<int> len(3);
    for (int& n : len) n = 1 + static_cast<int>(rng_() % 30);
    check_case(c, len, rng_, *ops_, GetParam());
    if (HasFatalFailure()) return;
  }
}

// A Bamba-like layer at a realistic ratio of sizes (d_state 64, 16 heads of 16, d_conv 4, SSD
// chunks of 64) over a 300-token request (chunk boundaries inside the prompt, a last partial
// chunk) beside a 130-token and a 1-token one.
TEST_P(Mamba2MixerRandom, BambaLikeShapeLongRequest) {
  const Mamba2Shape shape{.hidden_size = 128,
                          .num_heads = 16,
                          .head_dim = 16,
                          .state_size = 64,
                          .num_groups = 1,
                          .conv_kernel = 4,
                          .chunk_size = 64};
  check_case(with_weights(shape, rng_), {300, 130, 1}, rng_, *ops_, GetParam());
}

// A tree verify (Mamba2Seq::node_slots, speculative decoding): a request's prefix is run into
// its slot, then a random draft tree (each node's parent an earlier node) of fresh inputs, beside
// a plain decode of a second request in the same call. Every node's output row and state must
// equal the oracle run along the node's path from the prefix state; the request's own slot must
// keep the prefix state (only read).
TEST_P(Mamba2MixerRandom, TreeVerifyNodesFollowTheirParents) {
  for (int iter = 0; iter < 6; ++iter) {
    const MambaCase c = random_case(rng_);
    const Mamba2Shape& s = c.shape;
    SCOPED_TRACE(::testing::Message() << "iter " << iter << ": d_conv " << s.conv_kernel
                                      << " chunk " << s.chunk_size);
    const auto hid = size_t(s.hidden_size);
    const int prefix = 1 + static_cast<int>(rng_() % 12), nodes = 2 + static_cast<int>(rng_() % 7);
    kv::StatePool pool(2, nodes + 3, s.state_shape());
    MixerOn mixer(s, *ops_, GetParam());
    const int32_t slot = pool.alloc(), other = pool.alloc();
    const OracleState zero{std::vector<double>(size_t(s.conv_kernel - 1) * size_t(s.conv_dim()), 0),
                           std::vector<double>(size_t(s.state_shape().ssm_floats()), 0.0)};
    OracleState st = zero;
    const std::vector<float> pre = uniform_floats(rng_, size_t(prefix) * hid, -1.f, 1.f);
    for (int t = 0; t < prefix; ++t) oracle_token(s, c.w, c.biases, st, pre.data() + size_t(t) * hid);
    std::vector<float> sink(pre.size());
    const Mamba2Seq run_prefix{.slot = slot, .num_tokens = prefix};
    mixer.forward(c.w.view(c.biases), pool, 1, std::span(&run_prefix, 1), pre.data(), sink.data());
    const std::vector<float> prefix_state = slot_state(pool, 1, slot);

    std::vector<int32_t> parents{-1}, node_slots;
    for (int t = 1; t < nodes; ++t) parents.push_back(static_cast<int32_t>(rng_() % uint64_t(t)));
    for (int t = 0; t < nodes; ++t) node_slots.push_back(pool.alloc());
    const std::vector<float> u = uniform_floats(rng_, size_t(nodes + 1) * hid, -1.f, 1.f);
    std::vector<OracleState> node_state(static_cast<size_t>(nodes));
    std::vector<std::vector<double>> want(static_cast<size_t>(nodes));
    for (int t = 0; t < nodes; ++t) {
      node_state[size_t(t)] = parents[size_t(t)] < 0 ? st : node_state[size_t(parents[size_t(t)])];
      want[size_t(t)] =
          oracle_token(s, c.w, c.biases, node_state[size_t(t)], u.data() + size_t(t) * hid);
    }
    OracleState other_st = zero;
    const std::vector<double> other_want =
        oracle_token(s, c.w, c.biases, other_st, u.data() + size_t(nodes) * hid);

    const std::vector<Mamba2Seq> seqs{
        {.slot = slot, .num_tokens = nodes, .node_slots = node_slots, .node_parents = parents},
        {.slot = other, .num_tokens = 1}};
    std::vector<float> out(u.size(), std::numeric_limits<float>::quiet_NaN());
    mixer.forward(c.w.view(c.biases), pool, 1, seqs, u.data(), out.data());
    for (int t = 0; t <= nodes; ++t) {
      const std::vector<double>& ref = t < nodes ? want[size_t(t)] : other_want;
      for (size_t i = 0; i < hid; ++i)
        ASSERT_NEAR(out[size_t(t) * hid + i], ref[i], 2e-4 * std::max(1.0, std::fabs(ref[i])))
            << "row " << t << " (parent " << (t < nodes ? parents[size_t(t)] : -2) << ") dim " << i;
    }
    for (int t = 0; t < nodes; ++t) {
      const std::vector<float> got = slot_state(pool, 1, node_slots[size_t(t)]);
      const std::vector<double> ref = oracle_state(node_state[size_t(t)]);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], ref[i], 2e-4 * std::max(1.0, std::fabs(ref[i])))
            << "state of node " << t << " float " << i;
    }
    EXPECT_EQ(slot_state(pool, 1, slot), prefix_state) << "the verify changed the request's slot";
    // A parent that is not an earlier node, and node slots that miss a token, change nothing.
    std::vector<int32_t> bad = parents;
    bad.back() = nodes - 1;
    for (const Mamba2Seq& q : {Mamba2Seq{.slot = slot, .num_tokens = nodes, .node_slots = node_slots,
                                         .node_parents = bad},
                               Mamba2Seq{.slot = slot, .num_tokens = nodes,
                                         .node_slots = std::span(node_slots).first(size_t(nodes - 1)),
                                         .node_parents = parents}}) {
      const std::vector<float> before = slot_state(pool, 1, node_slots[0]);
      EXPECT_THROW(mixer.forward(c.w.view(c.biases), pool, 1, std::span(&q, 1), u.data(),
                                 out.data()),
                   Error);
      EXPECT_EQ(slot_state(pool, 1, node_slots[0]), before);
    }
    pool.check_integrity();
  }
}

using Mamba2MixerInput = ::testing::TestWithParam<std::string>;

TEST_P(Mamba2MixerInput, RefusesBadBatchesUnchanged) {
  std::mt19937_64 rng(7);
  auto platform = platform::make_cpu_platform();
  std::unique_ptr<ModelOps> ops = make_cpu_ops(*platform, DType::kF32);
  MambaCase c = random_case(rng);
  const Mamba2Shape& s = c.shape;
  MixerOn mixer(s, *ops, GetParam());
  kv::StatePool pool(1, 3, s.state_shape());
  const int32_t a = pool.alloc(), b = pool.alloc();
  std::fill(pool.ssm_state(0, a), pool.ssm_state(0, a) + s.state_shape().ssm_floats(), 0.5f);
  const std::vector<float> before = slot_state(pool, 0, a);
  const std::vector<float> u = uniform_floats(rng, 4 * size_t(s.hidden_size), -1, 1);
  std::vector<float> out(u.size(), -3.f);
  const Mamba2Weights w = c.w.view(c.biases);
  auto refused = [&](ErrorCode code, std::vector<Mamba2Seq> seqs, int32_t layer, kv::StatePool& p) {
    try {
      mixer.forward(w, p, layer, seqs, u.data(), out.data());
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
    }
    EXPECT_EQ(slot_state(pool, 0, a), before);
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == -3.f; }));
  };
  refused(ErrorCode::kFailedPrecondition, {{a, 2}, {2, 2}}, 0, pool);  // slot 2 not held
  refused(ErrorCode::kInvalidArgument, {{a, 2}, {a, 2}}, 0, pool);     // one slot twice
  refused(ErrorCode::kInvalidArgument, {{a, 4}, {b, 0}}, 0, pool);     // empty sequence
  refused(ErrorCode::kOutOfRange, {{a, 4}}, 1, pool);                  // no layer 1
  kv::StateShape other = s.state_shape();
  other.state_size += 1;
  kv::StatePool wrong(1, 1, other);
  (void)wrong.alloc();
  refused(ErrorCode::kInvalidArgument, {{0, 4}}, 0, wrong);
  Mamba2Shape bad = s;
  bad.num_groups = s.num_heads + 1;
  EXPECT_THROW(Mamba2Mixer(bad, *ops), Error);
}

INSTANTIATE_TEST_SUITE_P(LinearBackends, Mamba2MixerRandom, ::testing::ValuesIn(linear_backends()),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(LinearBackends, Mamba2MixerInput, ::testing::ValuesIn(linear_backends()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace pagoda::model
