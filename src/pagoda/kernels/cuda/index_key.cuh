#pragma once
/// kv::quantize_index_key's rule on the device, for DeepSeek sparse attention's index keys (the
/// model ops' store_index_keys) and the indexer's queries (dsa_indexer.cu): the power-of-two
/// scale of a vector from its amax, and an element's e4m3 code under it. Bit for bit the host's:
/// amax / 448 rounded to f32, the exponent from frexp, x / scale rounded once (exact: a power of
/// two), RNE and saturating. nvcc only.

#include <cuda_fp8.h>

namespace pagoda::kernels::cuda {

/// 2^e with e the least integer such that amax / 448 <= 2^e; 1 for amax 0.
__device__ __forceinline__ float index_key_scale(float amax) {
  if (!(amax > 0.f)) return 1.f;
  int e = 0;
  const float m = frexpf(__fdiv_rn(amax, 448.f), &e);  // amax / 448 = m · 2^e, m in [0.5, 1)
  return ldexpf(1.f, m == 0.5f ? e - 1 : e);
}

/// x's e4m3 code under `scale`.
__device__ __forceinline__ __nv_fp8_storage_t index_key_code(float x, float scale) {
  return __nv_cvt_float_to_fp8(__fdiv_rn(x, scale), __NV_SATFINITE, __NV_E4M3);
}

}  // namespace pagoda::kernels::cuda
