#pragma once
/// The conformance oracle: naive dense attention in fp64, written from the math alone. It shares
/// no code with backends/reference or any BatchAttention (no plan, no page table, no CSR): each
/// DenseRow lists its keys as logical token ids, and the answer for query i of a row, q head h is
///
///   s_j  = scale · q·k_j                       (k_j, v_j: kv head h / (Hq / Hkv); MLA: the one
///   s_j  = cap · tanh(s_j / cap)   if cap > 0    latent row, v_j its first Dv elements)
///   vis  = bits[i, j] if the row has a custom mask (tree verify), else causal j <= kv - qo + i
///          (every j when non-causal), and with a window W >= 0 also pos(j) >= pos(i) - W, where
///          pos is the key's sequence position (DenseRow::pos: a tree node's is prefix + depth)
///          and pos(i) that of the query's own key kv - qo + i
///   Z    = Σ_vis exp(s_j) [+ exp(sink_h)],  O = Σ_vis exp(s_j) v_j / Z,  LSE = log2 Z
///   (no visible key: O = 0, LSE = -inf)
///
/// where stored K / V are what a KvPool of kv_dtype holds: k_j = kv_dtype(x / k_scale) · k_scale
/// (v likewise with v_scale; MLA's V uses k_scale). Draft-step branches arrive as rows whose keys
/// are the prefix plus the branch's tokens up to the step (causal covers them).
///
/// LSE tolerance (per query and head; Expected::lse_tol). Dropping visible key j moves the LSE by
/// |log2(1 - p_j)| >= p_j · log2(e), p_j = exp(s_j) / Z, so the smallest such move of the row is
/// δ = -log2(1 - p_min). The tolerance is δ / 2, so any single dropped key fails the check, but
/// never below the f32 noise floor kLseNoise · (1 + |LSE|) + lse_sum_noise(n) (a correct f32
/// backend's rounding of log2 and of a sum of n visible terms, 4 · sqrt(n) · 2^-24 · log2 e)
/// and never above the old 1e-3 · (1 + |LSE|). At 4,096 keys with the harness's logits
/// (|s| <~ 1.5) δ / 2 ~ 5e-5 against a floor of ~3.5e-5, so the guarantee holds on the CPU grid;
/// tests/conformance proves it by running the reference with ReferenceFaults::drop_weakest_key.
/// At 32,768 keys (the GPU grid's --long-kv) δ / 2 falls below the floor: the check is then as
/// tight as f32 rounding allows, no longer one-key exact. With `q_rounding` > 0 (a case whose
/// backends may round the query, relative error up to q_rounding: f32 queries over bf16 KV, 2^-9)
/// the tolerance is at least the largest score move that rounding can cause,
/// q_rounding · scale · max_j Σ_d |q_d k_jd| / ln 2: such a case is not one-key exact.

#include <cstdint>
#include <vector>

#include "pagoda/attention/layer.h"
#include "pagoda/backends/conformance/tensors.h"

namespace pagoda::backends::conformance {

/// Relative f32 noise floor of the LSE comparison (see above).
inline constexpr double kLseNoise = 1e-6;
/// Absolute LSE (base 2) noise of an f32 sum of n positive terms (see above).
double lse_sum_noise(int64_t n);

/// The answer for `rows` (in order; their qo_len sum is q.shape[0]) with q [n, Hq, Dqk] and the
/// layer's scale, cap, window, mask kind, sinks and scales. k_store / v_store hold each logical
/// token's row ([*, k_row] / [*, v_row] floats, values of the model dtype). Host only, O(n·kv·D).
Expected dense_oracle(const std::vector<float>& k_store, const std::vector<float>& v_store,
                      int k_row, int v_row, const std::vector<DenseRow>& rows, const HostTensor& q,
                      const attention::AttentionLayer& layer, DType kv_dtype, bool mla,
                      int head_dim_v, double q_rounding = 0);

}  // namespace pagoda::backends::conformance
