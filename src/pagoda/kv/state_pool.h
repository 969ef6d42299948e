#pragma once
/// StatePool: the recurrent-state pool of a model's linear-attention (Mamba2) layers, SGLang's
/// MambaPool (sglang_memory_tiers.md §3b; docs/design/state_pool.md). A linear layer carries no
/// per-token KV: each sequence has one fixed-size state per linear layer, kept in a slot of this
/// pool. One slot holds, for every linear layer l in [0, num_layers):
///
///   conv state  [conv_width, conv_dim]  the last conv_width = d_conv - 1 inputs of the causal
///                                       depthwise convolution, oldest first (time-major: one
///                                       row per past token, conv_dim channels contiguous)
///   SSM state   [num_heads, head_dim, state_size]  the selective-scan state h
///
/// all f32 (SGLang's default --mamba-ssm-dtype float32). A zero state is the state before the
/// first token (the convolution's zero padding and h_0 = 0), so a fresh slot needs no setup.
///
/// Slots are numbered 0..num_slots-1. A slot is free (refcount 0, all zero) or held (refcount
/// >= 1). alloc() hands out a zeroed slot with refcount 1 (a request's own state, or a radix
/// node's snapshot); retain() adds a holder; free() drops one, and the slot that reaches 0 is
/// zeroed and returned to the free list. copy_slot(src, dst) snapshots one held slot into
/// another (a radix node keeping the state after its last token; a prefix hit restoring that
/// state into the request's slot: SGLang's copy-on-write).
///
/// Errors. Bad input throws pagoda::Error before anything changes: kOutOfRange for a slot
/// outside the pool or a layer outside [0, num_layers), kFailedPrecondition for a slot that is
/// not held (a double free, a copy from a free slot), kInvalidArgument for a bad shape or a copy
/// of a slot onto itself, kResourceExhausted from alloc() when every slot is held (try_alloc
/// returns an empty optional instead: "does not fit now").
///
/// Integrity. check_integrity() aborts (PAGODA_CHECK) when the free list and the reference
/// counts disagree or a free slot is not zero. leaked(holders) compares the counts against the
/// references its caller knows of (the engine's requests and the radix tree's nodes) and lists
/// the slots held more often than known: 0 leaked states is a test invariant.
///
/// Memory. Storage is slot-major, [slot, layer, conv | SSM]: one slot's states over every layer
/// are contiguous (slot_stride_floats() floats), so zeroing and copying a slot is one operation.
/// A host pool (the first constructor, or a CPU platform) keeps it in host memory. A device pool
/// (a constructor given a device Platform, e.g. CUDA) keeps the same layout in that device's
/// memory (allocated through the platform's allocator, zeroed at construction): the slot
/// bookkeeping (free list, reference counts) stays on the host, free() zeroes a released slot
/// and copy_slot copies one through Platform::fill_bytes_async / copy_async, enqueued on the
/// platform's stream (so they are ordered with the kernels that read and write the states on
/// that stream, and return without waiting), and conv_state / ssm_state return device pointers
/// (for kernels; never dereference them on the host). read_state / write_state copy one layer
/// of one slot to or from the host synchronously on either kind (tests, the conformance
/// harness); check_integrity reads the free slots back synchronously on a device pool.
///
/// Thread rules: not thread-safe; one scheduler thread owns it (the model's forward reads and
/// writes slot contents through conv_state / ssm_state on that thread; a device pool's
/// operations go to the platform's one stream from that thread).

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "pagoda/core/device.h"
#include "pagoda/platform/platform.h"

namespace pagoda::kv {

/// The per-layer state sizes of one linear layer (a Mamba2 mixer's, model/mamba2_mixer.h).
struct StateShape {
  int32_t conv_dim = 0;    ///< channels of the causal convolution: d_inner + 2·n_groups·d_state
  int32_t conv_width = 0;  ///< past inputs kept: d_conv - 1 (>= 0)
  int32_t num_heads = 0;
  int32_t head_dim = 0;
  int32_t state_size = 0;  ///< d_state

  int64_t conv_floats() const { return int64_t{conv_width} * conv_dim; }
  int64_t ssm_floats() const { return int64_t{num_heads} * head_dim * state_size; }
  /// Bytes of one slot's state in one layer (f32 conv then SSM state).
  int64_t bytes() const { return (conv_floats() + ssm_floats()) * int64_t{sizeof(float)}; }
  bool operator==(const StateShape&) const = default;
};

class StatePool {
 public:
  /// Throws Error(kInvalidArgument) unless num_layers >= 1, num_slots >= 1, conv_width >= 0 and
  /// the other sizes >= 1.
  StatePool(int32_t num_layers, int32_t num_slots, StateShape shape);
  /// A pool in `platform`'s memory (a device pool unless `platform` is the CPU; see "Memory"),
  /// zeroed before this returns. `platform` must outlive the pool. Same errors as above, and
  /// kResourceExhausted when the allocation fails.
  StatePool(int32_t num_layers, int32_t num_slots, StateShape shape, platform::Platform& platform);
  StatePool(const StatePool&) = delete;
  StatePool& operator=(const StatePool&) = delete;

  int32_t num_layers() const { return num_layers_; }
  int32_t num_slots() const { return static_cast<int32_t>(refcount_.size()); }
  const StateShape& shape() const { return shape_; }
  /// Where the states live (Device::cpu() for a host pool).
  Device device() const;
  /// Floats from one slot's state block of a layer to the next slot's (num_layers blocks of
  /// conv_floats + ssm_floats): kernels address slot s of layer l at conv_state(l, 0) + s * this.
  int64_t slot_stride_floats() const { return int64_t{num_layers_} * block_floats_; }
  /// Bytes one slot takes over all layers (admission: states per byte budget).
  int64_t bytes_per_slot() const;
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_held() const { return num_slots() - num_free(); }

  /// A zeroed slot with refcount 1, or an empty optional (nothing changed) when none is free.
  std::optional<int32_t> try_alloc();
  /// try_alloc, but Error(kResourceExhausted) naming the pool size when none is free.
  int32_t alloc();
  /// Adds a holder to held slot `slot`.
  void retain(int32_t slot);
  /// Drops one holder of held slot `slot`; at refcount 0 the slot is zeroed and freed.
  void free(int32_t slot);
  /// Copies every layer's conv and SSM state of held slot `src` into held slot `dst` (src !=
  /// dst); `src` is unchanged.
  void copy_slot(int32_t src, int32_t dst);

  /// Holders of `slot` (0 when free). Throws kOutOfRange outside the pool.
  int32_t refcount(int32_t slot) const;
  /// Throws (as the mutators) unless `slot` is in the pool and held.
  void require_held(int32_t slot, const char* what) const;

  /// Layer `layer`'s conv state of `slot` ([conv_width, conv_dim]) and SSM state
  /// ([num_heads, head_dim, state_size]): host pointers for a host pool, device pointers for a
  /// device pool. Any slot in range (held or not: the caller's slot rules apply); throws
  /// kOutOfRange for a layer or slot outside the pool.
  float* conv_state(int32_t layer, int32_t slot);
  const float* conv_state(int32_t layer, int32_t slot) const;
  float* ssm_state(int32_t layer, int32_t slot);
  const float* ssm_state(int32_t layer, int32_t slot) const;

  /// Layer `layer`'s state of `slot` copied to the host: conv_floats then ssm_floats floats.
  /// Synchronous (a device pool waits for its stream first). Throws as conv_state.
  std::vector<float> read_state(int32_t layer, int32_t slot) const;
  /// Overwrites layer `layer`'s state of `slot` with `state` (conv_floats then ssm_floats
  /// floats; kInvalidArgument for another size). Synchronous. Throws as conv_state.
  void write_state(int32_t layer, int32_t slot, std::span<const float> state);

  /// The slots whose refcount exceeds the number of times `holders` names them (leaked
  /// references), ascending. Throws kFailedPrecondition when a slot is named more often than it
  /// is held (a holder of a freed state) and kOutOfRange for a slot outside the pool.
  std::vector<int32_t> leaked(std::span<const int32_t> holders) const;
  /// Aborts (PAGODA_CHECK) unless the free list holds exactly the slots with refcount 0, each
  /// once, and every free slot is all zero. O(pool size).
  void check_integrity() const;

 private:
  void require_slot(int32_t slot) const;
  /// Offset of (layer, slot)'s state block: conv floats, then SSM floats.
  size_t block(int32_t layer, int32_t slot) const;
  /// The constructors' body: a host pool when `device` is null.
  StatePool(int32_t num_layers, int32_t num_slots, StateShape shape, platform::Platform* device);
  void zero(int32_t slot);
  /// Every float of `slot` (all layers) is 0; reads a device pool back synchronously.
  bool slot_is_zero(int32_t slot) const;
  bool on_device() const { return platform_ != nullptr; }

  int32_t num_layers_;
  StateShape shape_;
  int64_t block_floats_;     ///< conv_floats + ssm_floats
  std::vector<float> data_;  ///< host pool: [num_slots, num_layers, block_floats]
  platform::Platform* platform_ = nullptr;  ///< device pool: its platform (null: host)
  platform::DeviceBuffer device_;           ///< device pool: the same layout in device memory
  float* base_ = nullptr;                   ///< data_.data() or device_.get()
  std::vector<int32_t> refcount_;
  std::vector<int32_t> free_;  ///< a stack: the next alloc takes back()
};

}  // namespace pagoda::kv
