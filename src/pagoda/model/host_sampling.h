#pragma once
/// Stateless token sampling on the host: the same rules as the device sampler, keyed by
/// (seed, step) so a request's tokens depend only on its logits, its seed and the index of the
/// token being sampled (never on batch composition or on which device sampled).
///
/// Rules: temperature 0 or top_k == 1 → argmax (lowest id on ties). Otherwise candidates in
/// descending logit order (ties by id), keep the top_k (<= 0: all), probabilities
/// exp((l - l_max) / T), keep the smallest prefix whose mass reaches top_p, drop candidates with
/// p < min_p * p_max, then pick by inverse CDF with u = counter_uniform(seed, step).

#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/model/model_ops.h"

namespace pagoda::model {

/// A uniform double in [0, 1) from (seed, step): splitmix64 of (seed ^ K) + (step + 1) · φ.
/// Step n of a seed equals the n-th draw of the historical per-request Sampler stream, so
/// existing seeded outputs are unchanged. Host and device (sampling_kernels) compute the same bits.
double counter_uniform(uint64_t seed, int64_t step);

/// Samples one id from logits [vocab] (not modified). `scratch` is reused storage.
int32_t sample_row(std::span<const float> logits, const SampleRow& params,
                   std::vector<int32_t>& order_scratch, std::vector<double>& prob_scratch);

/// The distribution sample_row draws from, dense: out[vocab] (resized) holds each token's
/// probability after temperature, top-k, top-p and min-p (one-hot argmax for greedy rows).
/// Speculative verification uses it for exact rejection sampling.
void sampling_probs(std::span<const float> logits, const SampleRow& params,
                    std::vector<double>& out);

}  // namespace pagoda::model
