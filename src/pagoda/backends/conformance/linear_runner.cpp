// One linear-* case: a StatePool of two layers (layer 1 under test) whose slots start from random
// states, the backend's linear kind run call by call (init_forward_metadata, then forward over
// strided xBC / dt / y views with NaN-poisoned y), every output row and final state checked
// against linear_oracle over each whole logical sequence, and every slot and layer the case does
// not name checked unchanged. A device backend (capabilities().device "cuda") runs on a device
// StatePool of the harness's platform, with its weights, xBC / dt and y copied to and from that
// device around each call; states are read and written through StatePool::read_state /
// write_state either way.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pagoda/backends/conformance/conformance.h"
#include "pagoda/backends/conformance/linear_oracle.h"
#include "pagoda/backends/conformance/tensors.h"
#include "pagoda/core/error.h"

namespace pagoda::backends::conformance {

using attention::LinearAttentionBackend;
using attention::LinearSeq;
using attention::LinearShape;

namespace {

constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();
constexpr int32_t kLayer = 1;  ///< the state layer under test; layer 0 is a bystander
constexpr int64_t kPad = 3;    ///< extra floats per xBC | dt row and per y row (strided views)

/// |got - want| <= kTol · max(1, |want|): the f32 backends' rounding over these lengths.
constexpr double kTol = 2e-4;

std::vector<float> uniform(std::mt19937_64& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<double> widen(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

/// `host` in a new buffer of `platform`'s memory.
platform::DeviceBuffer device_copy(platform::Platform& platform, const std::vector<float>& host) {
  platform::DeviceBuffer b =
      platform::make_buffer(platform.allocator(), std::max<size_t>(host.size(), 1) * sizeof(float));
  platform.allocator().copy_to_device(b.get(), host.data(), host.size() * sizeof(float));
  return b;
}

/// The spec's linear kind, or nullptr and the reason it has none or cannot serve `req` (whose
/// device is the backend's own: the case runs where the backend does).
std::unique_ptr<LinearAttentionBackend> make_linear(const attention::BackendRegistry& registry,
                                                    const std::string& spec,
                                                    attention::LinearRequirements req,
                                                    platform::Platform* device_platform,
                                                    std::string& why) {
  if (spec.rfind("mutant", 0) == 0) {
    std::unique_ptr<LinearAttentionBackend> b = make_linear_mutant(spec);
    if (b == nullptr) why = fmt::format("{} faults the attention kind", spec);
    return b;
  }
  if (spec.find('+') != std::string::npos) {
    why = "a prefill+decode composition serves the attention kind only";
  } else if (!registry.contains_linear(spec)) {
    why = fmt::format("no linear-attention backend '{}' (registered: {})", spec,
                      fmt::join(registry.linear_names(), ", "));
  } else {
    const attention::LinearCapabilities& caps = registry.linear_capabilities(spec);
    req.device = caps.device;
    why = unsupported_reason(caps, req).value_or("");
    PAGODA_REQUIRE(!why.empty() || caps.device == "cpu" ||
                       (device_platform != nullptr && device_platform->name() == caps.device),
                   kFailedPrecondition,
                   "linear-attention backend '{}' runs on {} but the harness has {} platform",
                   spec, caps.device,
                   device_platform != nullptr ? "a " + device_platform->name() : std::string("no"));
    if (caps.device == "cpu") device_platform = nullptr;
  }
  return why.empty() ? registry.create_linear(spec, req, {.platform = device_platform}) : nullptr;
}

/// A logical sequence: its inputs, its slot's initial state and the oracle's answer.
struct Sequence {
  std::vector<float> xbc, dt;  ///< [T, conv_dim], [T, H]
  std::vector<float> conv0, ssm0;
  std::vector<double> want;  ///< y [T, d_inner]
  LinearOracleState final_state;
};

/// One call's piece: tokens [from, from + n) of sequence `seq` in `slot` (a tree verify: nodes).
struct Piece {
  int seq = 0, from = 0, n = 0;
  int32_t slot = 0;
  std::vector<int32_t> node_slots, node_parents;
};

class LinearCaseRun {
 public:
  /// `device`: the platform of a device backend (its pool, weights and views live there), or
  /// null for a host backend.
  LinearCaseRun(const Case& c, uint64_t seed, LinearAttentionBackend& backend,
                platform::Platform* device)
      : s_(c.linear.shape),
        rng_(seed),
        backend_(backend),
        device_(device),
        pool_(device != nullptr ? std::make_unique<kv::StatePool>(2, 64, s_.state_shape(), *device)
                                : std::make_unique<kv::StatePool>(2, 64, s_.state_shape())) {
    const auto cd = size_t(s_.conv_dim()), heads = size_t(s_.num_heads);
    conv_ = uniform(rng_, cd * size_t(s_.conv_kernel), -0.6f, 0.6f);
    if (rng_() % 2) conv_bias_ = uniform(rng_, cd, -0.2f, 0.2f);
    dt_bias_ = uniform(rng_, heads, -1.5f, 0.5f);
    a_log_ = uniform(rng_, heads, -1.f, 1.5f);
    d_ = uniform(rng_, heads, -1.f, 1.f);
    oracle_w_ = {widen(conv_), widen(conv_bias_), widen(dt_bias_), widen(a_log_), widen(d_)};
    if (device_ != nullptr)
      for (const std::vector<float>* w : {&conv_, &conv_bias_, &dt_bias_, &a_log_, &d_})
        device_weights_.push_back(device_copy(*device_, *w));
  }

  /// A new logical sequence of `tokens` random inputs from a random state (the oracle's answer
  /// computed over all of it).
  int add_sequence(int tokens) {
    const auto cd = size_t(s_.conv_dim()), heads = size_t(s_.num_heads);
    Sequence q{uniform(rng_, size_t(tokens) * cd, -1.f, 1.f),
               uniform(rng_, size_t(tokens) * heads, -2.f, 1.f),
               uniform(rng_, size_t(s_.state_shape().conv_floats()), -1.f, 1.f),
               uniform(rng_, size_t(s_.state_shape().ssm_floats()), -1.f, 1.f),
               {},
               {}};
    q.final_state = {widen(q.conv0), widen(q.ssm0)};
    q.want = linear_oracle(s_, oracle_w_, q.final_state, widen(q.xbc), widen(q.dt));
    seqs_.push_back(std::move(q));
    return static_cast<int>(seqs_.size()) - 1;
  }
  const Sequence& sequence(int i) const { return seqs_[size_t(i)]; }

  /// A held slot holding `seq`'s initial state in the layer under test.
  int32_t slot_for(int seq) {
    const int32_t slot = pool_->alloc();
    const Sequence& q = seqs_[size_t(seq)];
    std::vector<float> state = q.conv0;
    state.insert(state.end(), q.ssm0.begin(), q.ssm0.end());
    pool_->write_state(kLayer, slot, state);
    return slot;
  }
  kv::StatePool& pool() { return *pool_; }

  /// Fills what the case will not name with random bytes and records them: layer 0 of every
  /// held slot and both layers of two more held slots. Call after the last alloc.
  void add_bystanders() {
    const std::vector<int32_t> extra = {pool_->alloc(), pool_->alloc()};
    for (int32_t slot = 0; slot < pool_->num_slots(); ++slot) {
      if (pool_->refcount(slot) == 0) continue;
      const bool both = std::count(extra.begin(), extra.end(), slot) > 0;
      for (int32_t layer = 0; layer <= (both ? 1 : 0); ++layer) {
        const kv::StateShape& sh = pool_->shape();
        pool_->write_state(layer, slot,
                           uniform(rng_, size_t(sh.conv_floats() + sh.ssm_floats()), -1, 1));
        kept_.push_back({slot, layer, state_of(layer, slot)});
      }
    }
  }

  /// The pool copied every layer of `src` into `dst` (copy_slot): dst's recorded bystander
  /// layers now hold src's.
  void note_copy(int32_t src, int32_t dst) {
    for (Kept& k : kept_)
      for (const Kept& from : kept_)
        if (k.slot == dst && from.slot == src && from.layer == k.layer) k.bytes = from.bytes;
  }

  /// Runs `pieces` as one call; checks each piece's y rows against its sequence's oracle rows
  /// (a tree verify: against `tree_want`, one row per node). Returns the first failure.
  std::string call(const std::vector<Piece>& pieces,
                   const std::vector<std::vector<double>>* tree_want = nullptr) {
    const int64_t cd = s_.conv_dim(), heads = s_.num_heads, di = s_.d_inner();
    const int64_t in_w = cd + heads + kPad, y_w = di + kPad;
    std::vector<LinearSeq> batch;
    std::vector<float> in;
    for (const Piece& p : pieces) {
      batch.push_back({.slot = p.slot,
                       .num_tokens = p.n,
                       .node_slots = p.node_slots,
                       .node_parents = p.node_parents});
      const Sequence& q = seqs_[size_t(p.seq)];
      for (int t = p.from; t < p.from + p.n; ++t) {
        in.insert(in.end(), q.xbc.begin() + t * cd, q.xbc.begin() + (t + 1) * cd);
        in.insert(in.end(), q.dt.begin() + t * heads, q.dt.begin() + (t + 1) * heads);
        in.insert(in.end(), size_t(kPad), kPoison);
      }
    }
    const int64_t rows = static_cast<int64_t>(in.size()) / in_w;
    std::vector<float> y(size_t(rows * y_w), kPoison);
    backend_.init_forward_metadata(*pool_, batch);
    // The weights, xBC | dt rows and poisoned y where the backend runs.
    auto weight = [&](size_t i, const std::vector<float>& host) -> const float* {
      if (host.empty()) return nullptr;
      return device_ != nullptr ? static_cast<const float*>(device_weights_[i].get())
                                : host.data();
    };
    platform::DeviceBuffer in_dev, y_dev;
    float* in_ptr = in.data();
    float* y_ptr = y.data();
    const Device where = device_ != nullptr ? device_->device() : Device::cpu();
    if (device_ != nullptr) {
      in_dev = device_copy(*device_, in);
      y_dev = device_copy(*device_, y);
      in_ptr = static_cast<float*>(in_dev.get());
      y_ptr = static_cast<float*>(y_dev.get());
    }
    const attention::LinearLayer layer{.state_layer = kLayer,
                                       .shape = s_,
                                       .weights = {.conv = weight(0, conv_),
                                                   .conv_bias = weight(1, conv_bias_),
                                                   .dt_bias = weight(2, dt_bias_),
                                                   .a_log = weight(3, a_log_),
                                                   .d = weight(4, d_)}};
    backend_.forward(layer, TensorView(in_ptr, DType::kF32, {rows, cd}, {in_w, 1}, where),
                     TensorView(in_ptr + cd, DType::kF32, {rows, heads}, {in_w, 1}, where),
                     TensorView(y_ptr, DType::kF32, {rows, di}, {y_w, 1}, where));
    if (device_ != nullptr) {
      device_->synchronize_stream();
      device_->allocator().copy_to_host(y.data(), y_ptr, y.size() * sizeof(float));
    }
    int64_t row = 0;
    for (const Piece& p : pieces) {
      for (int t = 0; t < p.n; ++t, ++row) {
        const double* want = tree_want != nullptr && !p.node_slots.empty()
                                 ? (*tree_want)[size_t(t)].data()
                                 : seqs_[size_t(p.seq)].want.data() + (p.from + t) * di;
        for (int64_t i = 0; i < di; ++i) {
          const float got = y[size_t(row * y_w + i)];
          if (!near(got, want[i]))
            return fmt::format("y[sequence {} token {}, {}] = {} expected {}{}", p.seq, p.from + t,
                               i, got, want[i], std::isnan(got) ? " (not written)" : "");
        }
        for (int64_t i = di; i < y_w; ++i)
          if (!std::isnan(y[size_t(row * y_w + i)]))
            return fmt::format("y row {} written past d_inner (column {})", row, i);
      }
    }
    return "";
  }

  /// Layer `layer`'s state of `slot`, conv then SSM.
  std::vector<float> state_of(int32_t layer, int32_t slot) const {
    return pool_->read_state(layer, slot);
  }

  /// The first difference between `slot`'s state in the layer under test and `want`.
  std::string check_state(int32_t slot, const LinearOracleState& want, const std::string& what) {
    std::vector<double> w = want.conv;
    w.insert(w.end(), want.ssm.begin(), want.ssm.end());
    const std::vector<float> got = state_of(kLayer, slot);
    for (size_t i = 0; i < got.size(); ++i)
      if (!near(got[i], w[i]))
        return fmt::format("{} state float {} (slot {}) = {} expected {}", what, i, slot, got[i],
                           w[i]);
    return "";
  }

  /// Every recorded bystander keeps its bytes and every free slot is zero.
  std::string check_untouched() const {
    for (const Kept& k : kept_)
      if (state_of(k.layer, k.slot) != k.bytes)
        return fmt::format("slot {} layer {} (not named by the case) changed", k.slot, k.layer);
    for (int32_t slot = 0; slot < pool_->num_slots(); ++slot)
      for (int32_t layer = 0; layer < 2 && pool_->refcount(slot) == 0; ++layer)
        for (float v : state_of(layer, slot))
          if (v != 0.f) return fmt::format("free slot {} layer {} written", slot, layer);
    return "";
  }

  std::mt19937_64& rng() { return rng_; }
  const LinearShape& shape() const { return s_; }
  const LinearOracleWeights& oracle_weights() const { return oracle_w_; }

 private:
  static bool near(float got, double want) {
    return std::isfinite(got) && std::fabs(got - want) <= kTol * std::max(1.0, std::fabs(want));
  }
  struct Kept {
    int32_t slot, layer;
    std::vector<float> bytes;
  };

  LinearShape s_;
  std::mt19937_64 rng_;
  LinearAttentionBackend& backend_;
  platform::Platform* device_;  ///< a device backend's platform, else null
  std::unique_ptr<kv::StatePool> pool_;
  std::vector<float> conv_, conv_bias_, dt_bias_, a_log_, d_;
  std::vector<platform::DeviceBuffer> device_weights_;  ///< conv_ .. d_ on device_
  LinearOracleWeights oracle_w_;
  std::vector<Sequence> seqs_;
  std::vector<Kept> kept_;
};

/// Each sequence cut into pieces and run over several calls (kSplit), or one token per call
/// (kDecode), or in one call (kPrefill); then every final state.
std::string run_pieces(LinearCaseRun& run, const std::vector<int>& lengths, LinearOp op) {
  std::vector<int> seq;
  std::vector<int32_t> slot;
  for (int len : lengths) {
    seq.push_back(run.add_sequence(len));
    slot.push_back(run.slot_for(seq.back()));
  }
  run.add_bystanders();
  std::vector<int> done(lengths.size(), 0);
  while (done != lengths) {
    std::vector<Piece> pieces;
    for (size_t r = 0; r < lengths.size(); ++r) {
      const int left = lengths[r] - done[r];
      if (left == 0 || (op == LinearOp::kSplit && run.rng()() % 4 == 0)) continue;
      const int n = op == LinearOp::kPrefill  ? left
                    : op == LinearOp::kDecode ? 1
                                              : 1 + static_cast<int>(run.rng()() % uint64_t(left));
      pieces.push_back({.seq = seq[r], .from = done[r], .n = n, .slot = slot[r]});
      done[r] += n;
    }
    if (pieces.empty()) continue;
    if (std::string e = run.call(pieces); !e.empty()) return e;
  }
  for (size_t r = 0; r < lengths.size(); ++r)
    if (std::string e = run.check_state(slot[r], run.sequence(seq[r]).final_state,
                                        fmt::format("sequence {}'s final", r));
        !e.empty())
      return e;
  return "";
}

/// Each sequence's prefix in slot A, copy_slot(A, B), then the rest in both A and B (one call).
std::string run_restore(LinearCaseRun& run, const std::vector<int>& lengths) {
  std::vector<int> seq, cut;
  std::vector<int32_t> a, b;
  for (int len : lengths) {
    seq.push_back(run.add_sequence(len));
    a.push_back(run.slot_for(seq.back()));
    b.push_back(run.pool().alloc());
    cut.push_back(len < 2 ? len : 1 + static_cast<int>(run.rng()() % uint64_t(len - 1)));
  }
  run.add_bystanders();
  std::vector<Piece> first, rest;
  for (size_t r = 0; r < lengths.size(); ++r) {
    first.push_back({.seq = seq[r], .from = 0, .n = cut[r], .slot = a[r]});
    if (cut[r] == lengths[r]) continue;
    for (int32_t slot : {a[r], b[r]})
      rest.push_back({.seq = seq[r], .from = cut[r], .n = lengths[r] - cut[r], .slot = slot});
  }
  if (std::string e = run.call(first); !e.empty()) return e;
  for (size_t r = 0; r < lengths.size(); ++r) {
    run.pool().copy_slot(a[r], b[r]);
    run.note_copy(a[r], b[r]);
  }
  if (!rest.empty())
    if (std::string e = run.call(rest); !e.empty()) return e;
  for (size_t r = 0; r < lengths.size(); ++r)
    for (int32_t slot : {a[r], b[r]})
      if (std::string e = run.check_state(slot, run.sequence(seq[r]).final_state,
                                          slot == a[r] ? "the original's" : "the restored copy's");
          !e.empty())
        return e;
  return "";
}

/// A draft tree of lengths[0] nodes (random earlier parents) over a sequence's state, beside a
/// decode (lengths[1] tokens) and a prefill (lengths[2]) in the same call; each node's row and
/// state against the oracle along its path; the tree's own slot only read.
std::string run_verify(LinearCaseRun& run, const std::vector<int>& lengths) {
  const int nodes = lengths[0];
  const int tree = run.add_sequence(nodes);  // the nodes' inputs (the oracle's answer unused)
  Piece verify{.seq = tree, .from = 0, .n = nodes, .slot = run.slot_for(tree)};
  for (int t = 0; t < nodes; ++t) {
    verify.node_parents.push_back(t == 0 ? -1 : static_cast<int32_t>(run.rng()() % uint64_t(t)));
    verify.node_slots.push_back(run.pool().alloc());
  }
  std::vector<Piece> pieces{verify};
  for (size_t r = 1; r < lengths.size(); ++r) {
    const int q = run.add_sequence(lengths[r]);
    pieces.push_back({.seq = q, .from = 0, .n = lengths[r], .slot = run.slot_for(q)});
  }
  run.add_bystanders();
  // The oracle along each node's path from the sequence's state.
  const Sequence& q = run.sequence(tree);
  const auto cd = size_t(run.shape().conv_dim()), heads = size_t(run.shape().num_heads);
  std::vector<std::vector<double>> want(static_cast<size_t>(nodes));
  std::vector<LinearOracleState> node_state(static_cast<size_t>(nodes));
  for (int t = 0; t < nodes; ++t) {
    std::vector<int> path;
    for (int v = t; v >= 0; v = verify.node_parents[size_t(v)]) path.insert(path.begin(), v);
    std::vector<double> xbc, dt;
    for (int v : path) {
      xbc.insert(xbc.end(), q.xbc.begin() + v * cd, q.xbc.begin() + (v + 1) * cd);
      dt.insert(dt.end(), q.dt.begin() + v * heads, q.dt.begin() + (v + 1) * heads);
    }
    node_state[size_t(t)] = {widen(q.conv0), widen(q.ssm0)};
    const std::vector<double> y =
        linear_oracle(run.shape(), run.oracle_weights(), node_state[size_t(t)], xbc, dt);
    want[size_t(t)].assign(y.end() - run.shape().d_inner(), y.end());
  }
  const std::vector<float> root_before = run.state_of(kLayer, verify.slot);
  if (std::string e = run.call(pieces, &want); !e.empty()) return e;
  for (int t = 0; t < nodes; ++t)
    if (std::string e =
            run.check_state(verify.node_slots[size_t(t)], node_state[size_t(t)],
                            fmt::format("node {} (parent {})", t, verify.node_parents[size_t(t)]));
        !e.empty())
      return e;
  if (run.state_of(kLayer, verify.slot) != root_before) return "the tree verify wrote its own slot";
  for (size_t r = 1; r < pieces.size(); ++r)
    if (std::string e = run.check_state(pieces[r].slot, run.sequence(pieces[r].seq).final_state,
                                        fmt::format("sequence {}'s final", r));
        !e.empty())
      return e;
  return "";
}

}  // namespace

CaseResult run_linear_case(const attention::BackendRegistry& registry,
                           const BackendUnderTest& backend, const Case& c, uint64_t seed,
                           platform::Platform* device_platform) {
  std::string why;
  std::unique_ptr<LinearAttentionBackend> b =
      make_linear(registry, backend.spec, c.linear_requirements(), device_platform, why);
  if (b == nullptr) return {Verdict::kUnsupported, why};
  LinearCaseRun run(c, seed, *b, b->capabilities().device == "cpu" ? nullptr : device_platform);
  std::string error;
  try {
    switch (c.linear.op) {
      case LinearOp::kPrefill:
      case LinearOp::kDecode:
      case LinearOp::kSplit:
        error = run_pieces(run, c.linear.lengths, c.linear.op);
        break;
      case LinearOp::kRestore:
        error = run_restore(run, c.linear.lengths);
        break;
      case LinearOp::kVerify:
        error = run_verify(run, c.linear.lengths);
        break;
      case LinearOp::kNone:
        throw_error(ErrorCode::kInvalidArgument, "conformance: {} is not a linear case",
                    c.describe());
    }
  } catch (const Error& e) {
    // Declared-unsupported cases never get here; an undeclared refusal is a failure.
    return {Verdict::kFail, fmt::format("threw {}{}", e.what(),
                                        e.code() == ErrorCode::kUnsupported
                                            ? " (capabilities() declare this case supported)"
                                            : "")};
  }
  if (error.empty()) error = run.check_untouched();
  if (!error.empty()) return {Verdict::kFail, error};
  return {Verdict::kPass, ""};
}

}  // namespace pagoda::backends::conformance
