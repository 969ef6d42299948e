#include "pagoda/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"

namespace pagoda::model {

void SamplingParams::validate() const {
  PAGODA_REQUIRE(std::isfinite(temperature) && temperature >= 0.f, kInvalidArgument,
                 "temperature must be finite and >= 0 (got {})", temperature);
  PAGODA_REQUIRE(top_p > 0.f && top_p <= 1.f, kInvalidArgument,
                 "top_p must be in (0, 1] (got {})", top_p);
  PAGODA_REQUIRE(min_p >= 0.f && min_p < 1.f, kInvalidArgument,
                 "min_p must be in [0, 1) (got {})", min_p);
}

int32_t argmax(std::span<const float> logits) {
  PAGODA_CHECK(!logits.empty());
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  return best;
}

Sampler::Sampler(const SamplingParams& params)
    : params_(params), state_(params.seed ^ 0xA0761D6478BD642Full) {
  params_.validate();
}

double Sampler::next_uniform() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;  // [0, 1)
}

int32_t Sampler::sample(std::span<const float> logits) {
  PAGODA_CHECK(!logits.empty());
  if (params_.is_greedy()) return argmax(logits);
  const int32_t n = static_cast<int32_t>(logits.size());
  order_.resize(n);
  std::iota(order_.begin(), order_.end(), 0);
  // Descending by logit, ties by id, so the candidate order is deterministic.
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  int32_t keep = n;
  if (params_.top_k > 0 && params_.top_k < n) {
    keep = params_.top_k;
    std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(), by_logit);
  } else {
    std::sort(order_.begin(), order_.end(), by_logit);
  }
  const double inv_t = 1.0 / params_.temperature;
  const double max_logit = logits[order_[0]];
  probs_.resize(keep);
  double total = 0.0;
  for (int32_t i = 0; i < keep; ++i) {
    probs_[i] = std::exp((logits[order_[i]] - max_logit) * inv_t);
    total += probs_[i];
  }
  if (params_.top_p < 1.f) {
    // Smallest prefix whose probability mass reaches top_p (always at least one token).
    double cum = 0.0;
    int32_t cut = keep;
    for (int32_t i = 0; i < keep; ++i) {
      cum += probs_[i] / total;
      if (cum >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    total = 0.0;
    for (int32_t i = 0; i < keep; ++i) total += probs_[i];
  }
  if (params_.min_p > 0.f) {
    // Drop tokens with p < min_p * p_max (probs_ is descending; the first always stays).
    const double floor_p = static_cast<double>(params_.min_p) * probs_[0];
    int32_t cut = 1;
    while (cut < keep && probs_[cut] >= floor_p) ++cut;
    keep = cut;
    total = 0.0;
    for (int32_t i = 0; i < keep; ++i) total += probs_[i];
  }
  const double r = next_uniform() * total;
  double cum = 0.0;
  for (int32_t i = 0; i < keep; ++i) {
    cum += probs_[i];
    if (r < cum) return order_[i];
  }
  return order_[keep - 1];
}

}  // namespace pagoda::model
