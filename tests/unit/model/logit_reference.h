#pragma once
// The logit processing of logit_processing.h written straight from its definitions, one token at
// a time over the whole vocabulary (the tests' independent reference):
//   l += logit_bias[token] (the last entry of a token wins);
//   seen in prompt or output: l = l > 0 ? l / repetition : l * repetition;
//   l -= presence * (count > 0) + frequency * count, count = occurrences in the output.

#include <algorithm>
#include <map>
#include <span>
#include <vector>

#include "pagoda/model/logit_processing.h"

namespace pagoda::testing {

template <typename T>
std::vector<double> reference_processed_logits(std::span<const T> logits,
                                               std::span<const int32_t> prompt,
                                               std::span<const int32_t> output,
                                               const model::LogitProcessing& p) {
  std::map<int32_t, double> bias;
  for (const auto& [t, b] : p.logit_bias) bias[t] = b;
  std::vector<double> out(logits.size());
  for (size_t v = 0; v < logits.size(); ++v) {
    const auto tok = static_cast<int32_t>(v);
    double l = static_cast<double>(logits[v]);
    if (auto it = bias.find(tok); it != bias.end()) l += it->second;
    const auto in_prompt = std::count(prompt.begin(), prompt.end(), tok);
    const auto count = std::count(output.begin(), output.end(), tok);
    if (in_prompt + count > 0) l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    l -= p.presence_penalty * (count > 0 ? 1.0 : 0.0) + p.frequency_penalty * static_cast<double>(count);
    out[v] = l;
  }
  return out;
}

}  // namespace pagoda::testing
