#pragma once
/// Strong integer ids (ARCHITECTURE §4): distinct types for pages, request rows and layers so they
/// cannot be mixed up. Token slots stay plain int32 in arrays (kernels read them by the million).

#include <compare>
#include <cstdint>
#include <functional>

#include <fmt/format.h>

namespace pagoda {

/// A typed wrapper over an int32 value. `Tag` only distinguishes the type.
template <typename Tag>
class StrongId {
 public:
  constexpr StrongId() = default;
  constexpr explicit StrongId(int32_t value) : value_(value) {}
  constexpr int32_t value() const { return value_; }
  constexpr bool valid() const { return value_ >= 0; }
  static constexpr StrongId invalid() { return StrongId(-1); }
  constexpr auto operator<=>(const StrongId&) const = default;

 private:
  int32_t value_ = -1;
};

/// A KV page. PageId{0} is reserved as the dummy sink for padded (CUDA-graph) batches.
using PageId = StrongId<struct PageIdTag>;
/// A row of the ReqToTokenTable. ReqSlot{0} is reserved as the padding row.
using ReqSlot = StrongId<struct ReqSlotTag>;
/// A model layer (global layer index).
using LayerId = StrongId<struct LayerIdTag>;

/// A token slot: page * page_size + offset. Plain int32 for arrays; -1 means "none".
using SlotIndex = int32_t;

}  // namespace pagoda

template <typename Tag>
struct std::hash<pagoda::StrongId<Tag>> {
  size_t operator()(const pagoda::StrongId<Tag>& id) const noexcept {
    return std::hash<int32_t>()(id.value());
  }
};

template <typename Tag>
struct fmt::formatter<pagoda::StrongId<Tag>> : fmt::formatter<int32_t> {
  auto format(const pagoda::StrongId<Tag>& id, fmt::format_context& ctx) const {
    return fmt::formatter<int32_t>::format(id.value(), ctx);
  }
};
