#pragma once
// A random engine::TokenConstraint for the structured-output tests (engine_tests on the CPU,
// cuda_engine_tests on the device): deterministic, so a test can rebuild the allowed sets.

#include <cstdint>
#include <span>
#include <string>

#include "pagoda/engine/token_constraint.h"

namespace pagoda::testing {

/// A TokenConstraint whose allowed set at output position k is a pseudo-random function of
/// (key, k) (about 1 token in `every`, never none); it records any token sampled outside it.
class RandomConstraint final : public engine::TokenConstraint {
 public:
  RandomConstraint(uint64_t key, int every, int vocab) : key_(key), every_(every), vocab_(vocab) {}
  /// Whether `token` may come at output position k.
  bool allows(int64_t k, int32_t token) const {
    const uint64_t h = (key_ ^ static_cast<uint64_t>(k) * 0x9E3779B97F4A7C15ull) +
                       static_cast<uint64_t>(token) * 0xBF58476D1CE4E5B9ull;
    return token == static_cast<int32_t>(key_ % static_cast<uint64_t>(vocab_)) ||
           ((h ^ (h >> 29)) * 0x94D049BB133111EBull >> 40) % static_cast<uint64_t>(every_) == 0;
  }
  void allowed(std::span<uint32_t> mask) override {
    for (int32_t t = 0; t < vocab_; ++t)
      if (allows(pos_, t)) mask[static_cast<size_t>(t / 32)] |= 1u << (t % 32);
  }
  void consume(int32_t token) override { violations += allows(pos_++, token) ? 0 : 1; }
  bool done() const override { return false; }
  std::string error() const override { return {}; }
  int violations = 0;

 private:
  uint64_t key_;
  int every_, vocab_;
  int64_t pos_ = 0;
};

}  // namespace pagoda::testing
