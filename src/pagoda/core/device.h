#pragma once
/// Where memory lives and code runs.

#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace pagoda {

enum class DeviceKind : uint8_t { kCpu, kCuda };

/// A device: kind plus ordinal (always 0 for the CPU).
struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;

  static constexpr Device cpu() { return Device{DeviceKind::kCpu, 0}; }
  static constexpr Device cuda(int index = 0) { return Device{DeviceKind::kCuda, index}; }
  constexpr bool is_cpu() const { return kind == DeviceKind::kCpu; }
  constexpr bool is_cuda() const { return kind == DeviceKind::kCuda; }
  constexpr bool operator==(const Device&) const = default;
  /// "cpu" or "cuda:N".
  std::string to_string() const {
    return is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", index);
  }
};

}  // namespace pagoda
