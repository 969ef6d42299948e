#pragma once
/// The conformance oracle of the linear-* columns: one Mamba2 sequence in fp64, written from the
/// math of attention/linear_backend.h and sharing no code with any backend. It takes the
/// sequence's whole input at once, the K-1 inputs of the conv state followed by the T new
/// ones, and evaluates the recurrence in its closed ("quadratic", SSD dual) form instead of
/// stepping it: with L_t = Σ_{r<=t} Δ_r·A (per head, L_{-1} = 0),
///
///   xBC_t = SiLU(conv_bias + Σ_k conv[:, k]·in[t + k])        in = state rows ++ new rows
///   h_t   = exp(L_t)·h_0 + Σ_{s<=t} exp(L_t - L_s)·Δ_s·x_s ⊗ B_s
///   y_t   = h_t·C_t + D·x_t
///
/// O(T²·H·P·N): for the short sequences of the conformance grid. The state after the last token
/// is the last K-1 inputs and h_{T-1}.

#include <cstdint>
#include <vector>

#include "pagoda/attention/linear_backend.h"

namespace pagoda::backends::conformance {

/// One layer's weights as the oracle reads them (the values the backend gets, widened).
struct LinearOracleWeights {
  std::vector<double> conv;               ///< [conv_dim, K]
  std::vector<double> conv_bias;          ///< [conv_dim]; empty = none
  std::vector<double> dt_bias, a_log, d;  ///< [H] each
};

/// A sequence's state: conv [K-1, conv_dim] (oldest first), ssm [H, P, N].
struct LinearOracleState {
  std::vector<double> conv;
  std::vector<double> ssm;
};

/// Runs one sequence's tokens (xbc rows [T, conv_dim], dt rows [T, H], both row-major) from
/// `state`, which becomes the state after the last token. Returns y [T, d_inner].
std::vector<double> linear_oracle(const attention::LinearShape& shape, const LinearOracleWeights& w,
                                  LinearOracleState& state, const std::vector<double>& xbc,
                                  const std::vector<double>& dt);

}  // namespace pagoda::backends::conformance
