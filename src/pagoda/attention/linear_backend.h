#pragma once
/// LinearAttentionBackend: the recurrent part of a linear-attention (Mamba2 / SSD) layer behind
/// one interface, SGLang's MambaAttnBackend (sglang_memory_tiers.md §3b; docs/design/
/// state_pool.md "Linear-attention backends"). The layer's in/out projections and its gated
/// RMSNorm stay in the model (model/mamba2_mixer.h); a backend receives each token's projected
/// xBC (before the convolution) and raw dt and computes, per sequence of T new tokens,
///
///   xBC_t = SiLU(conv_bias + Σ_{k<K} conv[:, k] ⊙ in_{t-K+1+k})   causal depthwise conv, K =
///           conv_kernel; in_τ for τ before the call's first token is read from the slot's conv
///           state (the last K-1 inputs, oldest first; zero when fresh)
///   x | B | C = xBC_t            x [H, P], B and C [G, N]; head h reads group h / (H / G)
///   Δ_t = clamp(softplus(dt_t + dt_bias), dt_min, dt_max),  A = -exp(A_log)       per head
///   h_t = exp(Δ_t·A)·h_{t-1} + Δ_t·x_t ⊗ B_t        [P, N] per head; h_0 is the slot's SSM state
///   y_t = h_t·C_t + D ⊙ x_t                         [H·P], row t of y
///
/// (softplus as torch's: v itself above 20) and leaves the state after the call's last token in
/// the slot: the last K-1 inputs (pre-conv) and h_T. How it gets there is the backend's (a
/// per-token recurrence, a chunked SSD scan): any split of a sequence into calls computes the same
/// function, within the backend's precision.
///
/// A tree verify (speculative decoding; LinearSeq::node_slots) runs its tokens as draft-tree
/// nodes: node t's state is its parent's (the sequence's own slot for the root) advanced by token
/// t, written to node_slots[t]; the sequence's slot is only read.
///
/// Life cycle per engine step: init_forward_metadata(pool, seqs) once (validates the batch and
/// plans it), then forward(layer, xbc, dt, y) for each linear layer. The plan (pool, sequences,
/// node slots: copied) stays valid until the next init_forward_metadata.
///
/// Threading: one thread at a time per instance. Errors: bad input throws pagoda::Error before
/// anything changes (kInvalidArgument, kOutOfRange, kFailedPrecondition as documented below); a
/// feature the backend does not declare in capabilities() throws kUnsupported naming it. A
/// backend never produces wrong numbers silently.

#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pagoda/core/dtype.h"
#include "pagoda/core/tensor_view.h"
#include "pagoda/kv/state_pool.h"

namespace pagoda::platform {
class Platform;
}

namespace pagoda::attention {

/// What a linear-attention backend supports, as data (the registry and the conformance matrix
/// read it).
struct LinearCapabilities {
  std::vector<DType> dtypes;   ///< xBC / dt / y dtypes; empty = any
  bool tree_verify = false;    ///< LinearSeq::node_slots (speculative verify)
  bool cuda_graph = false;     ///< capturable forward (address-stable plan)
  std::string device = "cpu";  ///< "cpu" or "cuda": where xBC, dt, y, the weights and states live
};

/// Host f32 with tree verify, no CUDA graphs: the reference and cpu linear backends'.
const LinearCapabilities& host_linear_capabilities();

/// The sizes of one Mamba2 layer's recurrence (Bamba's mamba_* fields).
struct LinearShape {
  int32_t num_heads = 0;     ///< H
  int32_t head_dim = 0;      ///< P; d_inner = H·P
  int32_t state_size = 0;    ///< N (d_state)
  int32_t num_groups = 1;    ///< G (divides H)
  int32_t conv_kernel = 4;   ///< K (>= 1)
  int32_t chunk_size = 256;  ///< the SSD chunk of a chunked scan (a hint; the math ignores it)
  float dt_min = 0.f;        ///< time_step_limit: Δ is clamped to [dt_min, dt_max]
  float dt_max = std::numeric_limits<float>::infinity();

  int32_t d_inner() const { return num_heads * head_dim; }
  /// Channels of the convolution: x, B and C.
  int32_t conv_dim() const { return d_inner() + 2 * num_groups * state_size; }
  /// The state one layer keeps per slot.
  kv::StateShape state_shape() const;
  /// Throws Error(kInvalidArgument) naming the first bad field.
  void validate() const;
};

/// One layer's small weights (f32, on the backend's device). Only conv_bias may be null.
struct LinearWeights {
  const float* conv = nullptr;       ///< [conv_dim, K] (HF conv1d.weight [conv_dim, 1, K])
  const float* conv_bias = nullptr;  ///< [conv_dim]
  const float* dt_bias = nullptr;    ///< [H]
  const float* a_log = nullptr;      ///< [H]
  const float* d = nullptr;          ///< [H]
};

/// One linear layer of a forward: its layer in the state pool, sizes and weights.
struct LinearLayer {
  int32_t state_layer = 0;
  LinearShape shape;
  LinearWeights weights;
};

/// One sequence of a batch: its state slot and how many of the batch's rows are its new tokens
/// (consecutive rows, sequences in order).
struct LinearSeq {
  int32_t slot = 0;
  int32_t num_tokens = 0;
  /// A tree verify when not empty: num_tokens slots, one per token (a draft-tree node), and each
  /// node's parent among them (-1 for the first, the root, whose parent state is `slot`'s;
  /// otherwise an earlier node). Node t's state is its parent's advanced by token t and goes to
  /// node_slots[t]; `slot` is only read, so a rejected draft costs nothing and the caller keeps
  /// the state of the last accepted node.
  std::span<const int32_t> node_slots;
  std::span<const int32_t> node_parents;
};

/// Everything a linear-attention backend holds for its lifetime.
struct LinearBackendContext {
  platform::Platform* platform = nullptr;
};

class LinearAttentionBackend {
 public:
  virtual ~LinearAttentionBackend() = default;
  virtual std::string name() const = 0;
  virtual const LinearCapabilities& capabilities() const = 0;

  /// Plans one step over `pool` (which must outlive the plan): copies `seqs`. Throws Error
  /// (nothing changed, the previous plan kept): kFailedPrecondition / kOutOfRange for a slot
  /// that is not held / outside the pool (node slots included), kInvalidArgument for a slot
  /// named twice, a count < 1, node slots or parents whose sizes differ from the count, or a
  /// parent that is not an earlier node (the root's is -1); kUnsupported for a tree verify
  /// without capabilities().tree_verify.
  void init_forward_metadata(kv::StatePool& pool, std::span<const LinearSeq> seqs);
  /// Rows of the planned step (Σ num_tokens; 0 before any plan).
  int64_t num_tokens() const { return num_tokens_; }

  /// Runs layer `layer` of the planned step: xbc [T, conv_dim] and dt [T, H] (rows may be
  /// strided, elements contiguous) are read, y [T, d_inner] (rows may be strided) is written,
  /// and layer.state_layer's state of every planned slot is advanced (node slots written for a
  /// tree verify). Slots and layers not named are not touched. Throws Error before anything
  /// changes: kFailedPrecondition without a plan; kInvalidArgument for a bad shape, a pool whose
  /// state shape is not layer.shape.state_shape(), a null weight other than conv_bias, or views
  /// of the wrong sizes; kOutOfRange for a state layer outside the pool; kUnsupported for a
  /// dtype or device the backend does not declare (the views' and the pool's: a host backend
  /// needs a host StatePool, a device backend a pool on its device).
  void forward(const LinearLayer& layer, const TensorView& xbc, const TensorView& dt,
               const TensorView& y);

 protected:
  /// The planned pool and sequences (node spans point into this object's copies).
  kv::StatePool& pool() const { return *pool_; }
  std::span<const LinearSeq> seqs() const { return seqs_; }
  /// Called at the end of every init_forward_metadata that succeeds, with the new plan in
  /// pool() / seqs() (a device backend uploads it here, once per step). Default: nothing.
  virtual void planned() {}
  /// forward() after validation (T >= 1).
  virtual void run(const LinearLayer& layer, const TensorView& xbc, const TensorView& dt,
                   const TensorView& y) = 0;

 private:
  kv::StatePool* pool_ = nullptr;
  std::vector<LinearSeq> seqs_;
  std::vector<int32_t> node_slots_, node_parents_;
  int64_t num_tokens_ = 0;
};

}  // namespace pagoda::attention
