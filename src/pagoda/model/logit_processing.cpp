#include "pagoda/model/logit_processing.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <map>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"

namespace pagoda::model {

void LogitProcessing::validate(int64_t vocab) const {
  auto in = [](float v, float lo, float hi) { return std::isfinite(v) && v >= lo && v <= hi; };
  PAGODA_REQUIRE(in(presence_penalty, -2.f, 2.f), kInvalidArgument,
                 "presence_penalty {} outside [-2, 2]", presence_penalty);
  PAGODA_REQUIRE(in(frequency_penalty, -2.f, 2.f), kInvalidArgument,
                 "frequency_penalty {} outside [-2, 2]", frequency_penalty);
  PAGODA_REQUIRE(in(repetition_penalty, 0.f, 2.f) && repetition_penalty > 0.f,
                 kInvalidArgument, "repetition_penalty {} outside (0, 2]", repetition_penalty);
  for (const auto& [token, bias] : logit_bias) {
    PAGODA_REQUIRE(token >= 0 && token < vocab, kInvalidArgument,
                   "logit_bias token {} outside the vocabulary [0, {})", token, vocab);
    PAGODA_REQUIRE(in(bias, -100.f, 100.f), kInvalidArgument,
                   "logit_bias {} of token {} outside [-100, 100]", bias, token);
  }
}

void append_logit_adjust(std::span<const int32_t> prompt, std::span<const int32_t> output,
                         const LogitProcessing& p, int32_t row, std::vector<LogitAdjust>& out) {
  if (!p.active()) return;
  std::map<int32_t, LogitAdjust> by_token;
  auto entry = [&](int32_t token) -> LogitAdjust& {
    auto [it, added] = by_token.try_emplace(token);
    if (added) it->second = LogitAdjust{.row = row, .token = token};
    return it->second;
  };
  for (const auto& [token, bias] : p.logit_bias) entry(token).bias = bias;
  if (p.repetition_penalty != 1.f) {
    for (int32_t t : prompt) entry(t).rep = p.repetition_penalty;
    for (int32_t t : output) entry(t).rep = p.repetition_penalty;
  }
  if (p.presence_penalty != 0.f || p.frequency_penalty != 0.f) {
    std::map<int32_t, int32_t> count;
    for (int32_t t : output) ++count[t];
    for (const auto& [token, c] : count)
      entry(token).sub = p.presence_penalty + p.frequency_penalty * static_cast<float>(c);
  }
  for (const auto& [token, e] : by_token) out.push_back(e);
}

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int32_t top_n) {
  PAGODA_CHECK(!logits.empty() && token >= 0 && static_cast<size_t>(token) < logits.size() &&
               top_n >= 0 && static_cast<size_t>(top_n) <= logits.size());
  const double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - mx);
  const double lse = mx + std::log(sum);
  TokenLogprobs out;
  out.logprob = static_cast<float>(logits[static_cast<size_t>(token)] - lse);
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + top_n, ids.end(), [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
           (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
  });
  for (int32_t i = 0; i < top_n; ++i)
    out.top.emplace_back(ids[static_cast<size_t>(i)],
                         static_cast<float>(logits[static_cast<size_t>(ids[static_cast<size_t>(i)])] - lse));
  return out;
}

void apply_logit_adjust(float* logits, int64_t vocab, std::span<const LogitAdjust> adj) {
  for (const LogitAdjust& a : adj) {
    float& l = logits[static_cast<int64_t>(a.row) * vocab + a.token];
    const float l1 = l + a.bias;
    l = (l1 > 0.f ? l1 / a.rep : l1 * a.rep) - a.sub;
  }
}

}  // namespace pagoda::model
