#include "pagoda/kv/state_pool.h"

#include <algorithm>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"

namespace pagoda::kv {

StatePool::StatePool(int32_t num_layers, int32_t num_slots, StateShape shape)
    : StatePool(num_layers, num_slots, shape, nullptr) {}

StatePool::StatePool(int32_t num_layers, int32_t num_slots, StateShape shape,
                     platform::Platform& platform)
    : StatePool(num_layers, num_slots, shape,
                platform.kind() == platform::PlatformKind::kCpu ? nullptr : &platform) {}

StatePool::StatePool(int32_t num_layers, int32_t num_slots, StateShape shape,
                     platform::Platform* device)
    : num_layers_(num_layers),
      shape_(shape),
      block_floats_(shape.conv_floats() + shape.ssm_floats()),
      platform_(device) {
  PAGODA_REQUIRE(num_layers >= 1 && num_slots >= 1, kInvalidArgument,
                 "StatePool needs >= 1 layer and >= 1 slot (got {} layers, {} slots)", num_layers,
                 num_slots);
  PAGODA_REQUIRE(shape.conv_dim >= 1 && shape.conv_width >= 0 && shape.num_heads >= 1 &&
                     shape.head_dim >= 1 && shape.state_size >= 1,
                 kInvalidArgument,
                 "StatePool shape: conv_dim {}, conv_width {}, heads {}, head_dim {}, state {} "
                 "(all >= 1, conv_width >= 0)",
                 shape.conv_dim, shape.conv_width, shape.num_heads, shape.head_dim,
                 shape.state_size);
  const size_t floats = static_cast<size_t>(num_slots) * static_cast<size_t>(slot_stride_floats());
  if (on_device()) {
    device_ = platform::make_buffer(platform_->allocator(), floats * sizeof(float));
    platform_->allocator().fill_bytes(device_.get(), 0, floats * sizeof(float));
    base_ = static_cast<float*>(device_.get());
  } else {
    data_.assign(floats, 0.f);
    base_ = data_.data();
  }
  refcount_.assign(static_cast<size_t>(num_slots), 0);
  free_.reserve(static_cast<size_t>(num_slots));
  for (int32_t s = num_slots - 1; s >= 0; --s) free_.push_back(s);  // slot 0 is taken first
}

Device StatePool::device() const {
  return on_device() ? platform_->device() : Device::cpu();
}

int64_t StatePool::bytes_per_slot() const {
  return int64_t{num_layers_} * shape_.bytes();
}

std::optional<int32_t> StatePool::try_alloc() {
  if (free_.empty()) return std::nullopt;
  const int32_t s = free_.back();
  free_.pop_back();
  refcount_[static_cast<size_t>(s)] = 1;
  return s;
}

int32_t StatePool::alloc() {
  std::optional<int32_t> s = try_alloc();
  PAGODA_REQUIRE(s.has_value(), kResourceExhausted,
                 "state pool exhausted: all {} slots are held (raise the state pool size or "
                 "admit fewer requests)",
                 num_slots());
  return *s;
}

void StatePool::require_slot(int32_t slot) const {
  PAGODA_REQUIRE(slot >= 0 && slot < num_slots(), kOutOfRange, "state slot {} outside [0, {})",
                 slot, num_slots());
}

void StatePool::require_held(int32_t slot, const char* what) const {
  require_slot(slot);
  PAGODA_REQUIRE(refcount_[static_cast<size_t>(slot)] > 0, kFailedPrecondition,
                 "StatePool::{}: state slot {} is not held", what, slot);
}

int32_t StatePool::refcount(int32_t slot) const {
  require_slot(slot);
  return refcount_[static_cast<size_t>(slot)];
}

void StatePool::retain(int32_t slot) {
  require_held(slot, "retain");
  ++refcount_[static_cast<size_t>(slot)];
}

void StatePool::free(int32_t slot) {
  require_held(slot, "free");
  if (--refcount_[static_cast<size_t>(slot)] > 0) return;
  zero(slot);
  free_.push_back(slot);
}

void StatePool::copy_slot(int32_t src, int32_t dst) {
  require_held(src, "copy_slot (source)");
  require_held(dst, "copy_slot (destination)");
  PAGODA_REQUIRE(src != dst, kInvalidArgument, "StatePool::copy_slot: slot {} onto itself", src);
  const int64_t n = slot_stride_floats();
  if (on_device()) {
    platform_->copy_async(base_ + dst * n, base_ + src * n,
                          static_cast<size_t>(n) * sizeof(float));
  } else {
    std::copy(base_ + src * n, base_ + (src + 1) * n, base_ + dst * n);
  }
}

size_t StatePool::block(int32_t layer, int32_t slot) const {
  PAGODA_REQUIRE(layer >= 0 && layer < num_layers_, kOutOfRange, "state layer {} outside [0, {})",
                 layer, num_layers_);
  require_slot(slot);
  return static_cast<size_t>(slot) * static_cast<size_t>(slot_stride_floats()) +
         static_cast<size_t>(layer) * static_cast<size_t>(block_floats_);
}

float* StatePool::conv_state(int32_t layer, int32_t slot) {
  return base_ + block(layer, slot);
}
const float* StatePool::conv_state(int32_t layer, int32_t slot) const {
  return base_ + block(layer, slot);
}
float* StatePool::ssm_state(int32_t layer, int32_t slot) {
  return conv_state(layer, slot) + shape_.conv_floats();
}
const float* StatePool::ssm_state(int32_t layer, int32_t slot) const {
  return conv_state(layer, slot) + shape_.conv_floats();
}

std::vector<float> StatePool::read_state(int32_t layer, int32_t slot) const {
  const float* from = conv_state(layer, slot);
  if (!on_device()) return std::vector<float>(from, from + block_floats_);
  std::vector<float> out(static_cast<size_t>(block_floats_));
  platform_->synchronize_stream();
  platform_->allocator().copy_to_host(out.data(), from, out.size() * sizeof(float));
  return out;
}

void StatePool::write_state(int32_t layer, int32_t slot, std::span<const float> state) {
  PAGODA_REQUIRE(static_cast<int64_t>(state.size()) == block_floats_, kInvalidArgument,
                 "StatePool::write_state: {} floats for a state of {}", state.size(),
                 block_floats_);
  float* to = conv_state(layer, slot);
  if (!on_device()) {
    std::copy(state.begin(), state.end(), to);
    return;
  }
  platform_->synchronize_stream();
  platform_->allocator().copy_to_device(to, state.data(), state.size_bytes());
}

void StatePool::zero(int32_t slot) {
  const int64_t n = slot_stride_floats();
  if (on_device()) {
    platform_->fill_bytes_async(base_ + slot * n, 0, static_cast<size_t>(n) * sizeof(float));
  } else {
    std::fill(base_ + slot * n, base_ + (slot + 1) * n, 0.f);
  }
}

std::vector<int32_t> StatePool::leaked(std::span<const int32_t> holders) const {
  std::vector<int32_t> known(refcount_.size(), 0);
  for (int32_t s : holders) {
    require_slot(s);
    ++known[static_cast<size_t>(s)];
  }
  std::vector<int32_t> out;
  for (size_t s = 0; s < known.size(); ++s) {
    PAGODA_REQUIRE(known[s] <= refcount_[s], kFailedPrecondition,
                   "state slot {} is named by {} holders but held {} times", s, known[s],
                   refcount_[s]);
    if (known[s] < refcount_[s]) out.push_back(static_cast<int32_t>(s));
  }
  return out;
}

bool StatePool::slot_is_zero(int32_t slot) const {
  const int64_t n = slot_stride_floats();
  const float* from = base_ + slot * n;
  auto zero = [](float v) { return v == 0.f; };
  if (!on_device()) return std::all_of(from, from + n, zero);
  std::vector<float> b(static_cast<size_t>(n));
  platform_->synchronize_stream();
  platform_->allocator().copy_to_host(b.data(), from, b.size() * sizeof(float));
  return std::all_of(b.begin(), b.end(), zero);
}

void StatePool::check_integrity() const {
  std::vector<char> on_free(refcount_.size(), 0);
  for (int32_t s : free_) {
    PAGODA_CHECK(s >= 0 && s < num_slots(), "free state slot {} outside the pool", s);
    PAGODA_CHECK(!on_free[static_cast<size_t>(s)], "state slot {} on the free list twice", s);
    on_free[static_cast<size_t>(s)] = 1;
    PAGODA_CHECK_EQ(refcount_[static_cast<size_t>(s)], 0);
    PAGODA_CHECK(slot_is_zero(s), "free state slot {} is not zero", s);
  }
  for (size_t s = 0; s < refcount_.size(); ++s)
    PAGODA_CHECK(on_free[s] || refcount_[s] > 0, "state slot {} is neither free nor held", s);
}

}  // namespace pagoda::kv
