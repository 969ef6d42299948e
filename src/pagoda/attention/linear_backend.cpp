#include "pagoda/attention/linear_backend.h"

#include <algorithm>

#include <fmt/format.h>

#include "pagoda/attention/registry.h"
#include "pagoda/core/error.h"

namespace pagoda::attention {

const LinearCapabilities& host_linear_capabilities() {
  static const LinearCapabilities caps{
      .dtypes = {DType::kF32}, .tree_verify = true, .cuda_graph = false, .device = "cpu"};
  return caps;
}

kv::StateShape LinearShape::state_shape() const {
  return kv::StateShape{.conv_dim = conv_dim(),
                        .conv_width = conv_kernel - 1,
                        .num_heads = num_heads,
                        .head_dim = head_dim,
                        .state_size = state_size};
}

void LinearShape::validate() const {
  auto need = [](bool ok, const char* what) {
    PAGODA_REQUIRE(ok, kInvalidArgument, "Mamba2 layer: {}", what);
  };
  need(num_heads >= 1 && head_dim >= 1 && state_size >= 1,
       "mamba_n_heads, mamba_d_head and mamba_d_state must be >= 1");
  need(num_groups >= 1 && num_heads % num_groups == 0,
       "mamba_n_groups must be >= 1 and divide mamba_n_heads");
  need(conv_kernel >= 1, "mamba_d_conv must be >= 1");
  need(chunk_size >= 1, "mamba_chunk_size must be >= 1");
  need(dt_min >= 0.f && dt_max >= dt_min, "time_step_limit must satisfy 0 <= min <= max");
}

void LinearAttentionBackend::init_forward_metadata(kv::StatePool& pool,
                                                   std::span<const LinearSeq> seqs) {
  std::vector<int32_t> slots, node_slots, node_parents;
  int64_t tokens = 0;
  for (const LinearSeq& q : seqs) {
    PAGODA_REQUIRE(q.num_tokens >= 1, kInvalidArgument,
                   "linear-attention backend '{}': sequence of {} tokens (>= 1)", name(),
                   q.num_tokens);
    pool.require_held(q.slot, "linear-attention batch");
    slots.push_back(q.slot);
    tokens += q.num_tokens;
    if (q.node_slots.empty() && q.node_parents.empty()) continue;
    PAGODA_REQUIRE(capabilities().tree_verify, kUnsupported,
                   "linear-attention backend '{}' has no tree verify (speculative decoding); use "
                   "'reference' or 'cpu'",
                   name());
    PAGODA_REQUIRE(
        std::ssize(q.node_slots) == q.num_tokens && std::ssize(q.node_parents) == q.num_tokens,
        kInvalidArgument,
        "linear-attention backend '{}': a tree verify of {} tokens needs as many node slots and "
        "parents (got {} and {})",
        name(), q.num_tokens, q.node_slots.size(), q.node_parents.size());
    for (int32_t t = 0; t < q.num_tokens; ++t) {
      const int32_t parent = q.node_parents[static_cast<size_t>(t)];
      PAGODA_REQUIRE(t == 0 ? parent == -1 : parent >= 0 && parent < t, kInvalidArgument,
                     "linear-attention backend '{}': node {}'s parent {} is not an earlier node "
                     "(the root's is -1)",
                     name(), t, parent);
      pool.require_held(q.node_slots[static_cast<size_t>(t)], "linear-attention tree node");
    }
    slots.insert(slots.end(), q.node_slots.begin(), q.node_slots.end());
    node_slots.insert(node_slots.end(), q.node_slots.begin(), q.node_slots.end());
    node_parents.insert(node_parents.end(), q.node_parents.begin(), q.node_parents.end());
  }
  std::sort(slots.begin(), slots.end());
  PAGODA_REQUIRE(std::adjacent_find(slots.begin(), slots.end()) == slots.end(), kInvalidArgument,
                 "linear-attention backend '{}': two sequences of one batch share a state slot",
                 name());
  // Commit: the copies, with each tree's spans pointing into them.
  pool_ = &pool;
  node_slots_ = std::move(node_slots);
  node_parents_ = std::move(node_parents);
  seqs_.assign(seqs.begin(), seqs.end());
  size_t at = 0;
  for (LinearSeq& q : seqs_) {
    if (q.node_slots.empty()) continue;
    const auto n = static_cast<size_t>(q.num_tokens);
    q.node_slots = std::span<const int32_t>(node_slots_).subspan(at, n);
    q.node_parents = std::span<const int32_t>(node_parents_).subspan(at, n);
    at += n;
  }
  num_tokens_ = tokens;
  planned();
}

void LinearAttentionBackend::forward(const LinearLayer& layer, const TensorView& xbc,
                                     const TensorView& dt, const TensorView& y) {
  PAGODA_REQUIRE(pool_ != nullptr, kFailedPrecondition,
                 "linear-attention backend '{}': forward before init_forward_metadata", name());
  const LinearShape& s = layer.shape;
  s.validate();
  PAGODA_REQUIRE(pool_->shape() == s.state_shape(), kInvalidArgument,
                 "linear-attention backend '{}': the state pool's shape does not match the layer's",
                 name());
  PAGODA_REQUIRE(layer.state_layer >= 0 && layer.state_layer < pool_->num_layers(), kOutOfRange,
                 "linear-attention backend '{}': state layer {} outside [0, {})", name(),
                 layer.state_layer, pool_->num_layers());
  const LinearWeights& w = layer.weights;
  PAGODA_REQUIRE(w.conv && w.dt_bias && w.a_log && w.d, kInvalidArgument,
                 "linear-attention backend '{}': a weight other than the conv bias is missing",
                 name());
  const LinearCapabilities& caps = capabilities();
  const std::string_view pool_device = pool_->device().is_cpu() ? "cpu" : "cuda";
  PAGODA_REQUIRE(caps.device == pool_device, kUnsupported,
                 "linear-attention backend '{}' runs on {} but the state pool lives on {}",
                 name(), caps.device, pool_device);
  auto check = [&](const TensorView& v, const char* what, int64_t cols) {
    PAGODA_REQUIRE(v.rank() == 2 && v.size(0) == num_tokens_ && v.size(1) == cols &&
                       (cols == 1 || v.stride(1) == 1) && v.stride(0) >= cols,
                   kInvalidArgument,
                   "linear-attention backend '{}': {} is {}, not [{}, {}] with contiguous rows",
                   name(), what, v.describe(), num_tokens_, cols);
    const std::string_view device = v.device().is_cpu() ? "cpu" : "cuda";
    const bool dtype_ok = caps.dtypes.empty() || std::find(caps.dtypes.begin(), caps.dtypes.end(),
                                                           v.dtype()) != caps.dtypes.end();
    PAGODA_REQUIRE(
        dtype_ok && caps.device == device, kUnsupported,
        "linear-attention backend '{}' cannot take {} {}: {}", name(), what, v.describe(),
        unsupported_reason(caps, {.dtype = v.dtype(), .device = std::string(device)}).value_or(""));
  };
  check(xbc, "xBC", s.conv_dim());
  check(dt, "dt", s.num_heads);
  check(y, "y", s.d_inner());
  if (num_tokens_ == 0) return;
  run(layer, xbc, dt, y);
}

}  // namespace pagoda::attention
