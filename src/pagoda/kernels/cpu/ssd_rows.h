#pragma once
/// The elementwise rows of the cpu linear backend's Mamba2 layer
/// (backends/cpu/cpu_linear_backend.h): the causal depthwise convolution with its SiLU, and the
/// per-token time steps and decays of the SSD scan. Highway code with runtime ISA dispatch (the targets of paged_attention.cpp); no
/// allocation, one thread per call. Exponentials and logarithms are Highway's (a few ulp), so
/// the results differ from libm's in the last bits.

#include <cstdint>

namespace pagoda::kernels::cpu {

/// out[c] = silu(bias[c] + Σ_{j<k} taps[j·n + c] · in[j][c]) for c < n, silu(v) = v·σ(v):
/// one output row of a causal convolution of k taps (taps tap-major [k, n]; in[j] the input row
/// of tap j; bias may be null = 0). `out` must not alias an input.
void conv_silu_row(const float* const* in, const float* taps, const float* bias, int k, int64_t n,
                   float* out);

/// One token's time steps and decays over n heads: delta[h] = clamp(softplus(raw[h] + bias[h]),
/// dt_min, dt_max) (softplus linear above 20, as torch's) and decay[h] = exp(delta[h] · a[h]).
void ssd_time_steps(const float* raw, const float* bias, const float* a, int64_t n, float dt_min,
                    float dt_max, float* delta, float* decay);

}  // namespace pagoda::kernels::cpu
