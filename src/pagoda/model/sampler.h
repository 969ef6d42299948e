#pragma once
/// Token sampling: greedy, temperature, top-k, top-p, min-p, with a per-request seeded generator
/// so a request's output depends only on its logits and its seed (never on batch composition).
/// The GPU sampler (cuda/sampling_kernels.h) has the same semantics; its counter-based random
/// stream, philox_uniform(seed, step), lives in cuda/philox.h (host-usable, no CUDA needed).

#include <cstdint>
#include <span>
#include <vector>

namespace pagoda::model {

struct SamplingParams {
  float temperature = 0.f;  ///< 0 = greedy (argmax, lowest id on ties)
  int top_k = 0;            ///< 0 or < 0 = no top-k filter; 1 = greedy
  float top_p = 1.f;        ///< (0, 1]; 1 = no nucleus filter
  uint64_t seed = 0;
  /// [0, 1); after top-k and top-p, drop tokens with p < min_p * p_max; 0 = no min-p filter.
  float min_p = 0.f;
  /// Throws Error(kInvalidArgument) for temperature < 0 or non-finite, top_p outside (0, 1],
  /// min_p outside [0, 1).
  void validate() const;
  bool is_greedy() const { return temperature == 0.f || top_k == 1; }
};

/// Index of the largest value (lowest index on ties). Requires a non-empty span.
int32_t argmax(std::span<const float> logits);

/// A per-request sampler: owns the request's random stream (seeded by params.seed).
/// Each sample() call consumes exactly one draw (greedy consumes none): draw n is
/// sample_row(..., step = n) of host_sampling.h, so a stateful Sampler and the stateless worker
/// path pick the same tokens.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  const SamplingParams& params() const { return params_; }
  /// Picks the next token from `logits` [vocab] (f32, not modified).
  int32_t sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  int64_t draws_ = 0;
  std::vector<int32_t> order_;
  std::vector<double> probs_;
};

}  // namespace pagoda::model
