#include "pagoda/model/host_sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "pagoda/core/check.h"
#include "pagoda/model/sampler.h"

namespace pagoda::model {

double counter_uniform(uint64_t seed, int64_t step) {
  uint64_t z = (seed ^ 0xA0761D6478BD642Full) +
               static_cast<uint64_t>(step + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

namespace {

/// The candidates a non-greedy row samples from: order[0, keep) in descending logit order with
/// unnormalised probabilities probs[0, keep). Returns keep.
int32_t kept_candidates(std::span<const float> logits, const SampleRow& p,
                        std::vector<int32_t>& order, std::vector<double>& probs) {
  const int32_t n = static_cast<int32_t>(logits.size());
  order.resize(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  int32_t keep = n;
  if (p.top_k > 0 && p.top_k < n) {
    keep = p.top_k;
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), by_logit);
  } else {
    std::sort(order.begin(), order.end(), by_logit);
  }
  const double inv_t = 1.0 / p.temperature;
  const double max_logit = logits[order[0]];
  probs.resize(static_cast<size_t>(keep));
  double total = 0.0;
  for (int32_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((logits[order[i]] - max_logit) * inv_t);
    total += probs[i];
  }
  if (p.top_p < 1.f) {
    double cum = 0.0;
    int32_t cut = keep;
    for (int32_t i = 0; i < keep; ++i) {
      cum += probs[i] / total;
      if (cum >= p.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
  }
  if (p.min_p > 0.f) {  // probs[0] is the largest (exp(0) = 1 before normalisation)
    int32_t cut = 1;
    while (cut < keep && probs[cut] >= static_cast<double>(p.min_p) * probs[0]) ++cut;
    keep = cut;
  }
  return keep;
}

}  // namespace

int32_t sample_row(std::span<const float> logits, const SampleRow& p,
                   std::vector<int32_t>& order, std::vector<double>& probs) {
  PAGODA_CHECK(!logits.empty());
  if (p.temperature == 0.f || p.top_k == 1) return argmax(logits);
  const int32_t keep = kept_candidates(logits, p, order, probs);
  double total = 0.0;
  for (int32_t i = 0; i < keep; ++i) total += probs[i];
  const double r = counter_uniform(p.seed, p.step) * total;
  double cum = 0.0;
  for (int32_t i = 0; i < keep; ++i) {
    cum += probs[i];
    if (r < cum) return order[i];
  }
  return order[keep - 1];
}

void sampling_probs(std::span<const float> logits, const SampleRow& p,
                    std::vector<double>& out) {
  PAGODA_CHECK(!logits.empty());
  out.assign(logits.size(), 0.0);
  if (p.temperature == 0.f || p.top_k == 1) {
    out[static_cast<size_t>(argmax(logits))] = 1.0;
    return;
  }
  std::vector<int32_t> order;
  std::vector<double> probs;
  const int32_t keep = kept_candidates(logits, p, order, probs);
  double total = 0.0;
  for (int32_t i = 0; i < keep; ++i) total += probs[i];
  for (int32_t i = 0; i < keep; ++i) out[static_cast<size_t>(order[i])] = probs[i] / total;
}

}  // namespace pagoda::model
