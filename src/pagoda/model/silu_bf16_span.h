#pragma once
/// Internal to model/ops.cpp: the inner loop of silu_mul_bf16 (ops.h), in its own translation
/// unit because it is compiled with -fno-trapping-math, which lets the compiler vectorize its
/// clamps (pagoda never enables floating-point traps, so no result changes).
/// Thread rules: none (pure function of its arguments).

#include <cstdint>

namespace pagoda::model {

/// o[i] = bf16 bits (RNE; NaN stays a quiet NaN) of silu(g[i]) * u[i] for i < n, exp through an
/// inline polynomial (relative error about 1e-7). Arrays must not alias.
void silu_mul_bf16_span(const float* g, const float* u, uint16_t* o, int64_t n);

}  // namespace pagoda::model
