#include "pagoda/model/sampler.h"

#include <cmath>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"
#include "pagoda/model/host_sampling.h"

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

Sampler::Sampler(const SamplingParams& params) : params_(params) { params_.validate(); }

int32_t Sampler::sample(std::span<const float> logits) {
  PAGODA_CHECK(!logits.empty());
  if (params_.is_greedy()) return argmax(logits);
  const SampleRow row{.temperature = params_.temperature,
                      .top_k = params_.top_k,
                      .top_p = params_.top_p,
                      .min_p = params_.min_p,
                      .seed = params_.seed,
                      .step = draws_++};
  return sample_row(logits, row, order_, probs_);
}

}  // namespace pagoda::model
