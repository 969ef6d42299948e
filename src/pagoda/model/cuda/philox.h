#pragma once
/// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), the
/// counter-based generator of the GPU sampler (sampling_kernels.h). Header-only, no CUDA
/// dependency: compiled by the host compiler it is plain inline C++, compiled by nvcc every
/// function is __host__ __device__, so the host can reproduce the device's random stream.
///
/// One draw per (seed, step): key = (seed low 32 bits, seed high 32 bits), counter = (step low,
/// step high, 0, 0). The 64-bit draw is (out[0] << 32) | out[1]; the device sampler uses it as
/// the fraction u = draw / 2^64 in [0, 1). philox_uniform() is the same value truncated to 53
/// bits, as a double. Nothing here holds state; every function is a pure function.

#include <cstdint>

#if defined(__CUDACC__)
#define PAGODA_PHILOX_HD __host__ __device__ __forceinline__
#else
#define PAGODA_PHILOX_HD inline
#endif

namespace pagoda::model {

/// The four 32-bit outputs of one Philox4x32-10 block.
struct Philox4x32Out {
  uint32_t v[4];
};

/// Philox4x32 with 10 rounds of counter (c0..c3) under key (k0, k1). Matches the Random123
/// known-answer vectors (e.g. all-zero counter and key -> 6627e8d5 e169c58d bc57ac4c 9b00dbd8).
PAGODA_PHILOX_HD Philox4x32Out philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                             uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0;
    const uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  return Philox4x32Out{{c0, c1, c2, c3}};
}

/// The 64-bit draw of (seed, step): (out[0] << 32) | out[1] of Philox4x32-10 with key = seed and
/// counter = (step, 0). The device sampler picks the token whose cumulative fixed-point mass
/// first exceeds floor(total * draw / 2^64).
PAGODA_PHILOX_HD uint64_t philox_draw64(uint64_t seed, int64_t step) {
  const uint64_t s = static_cast<uint64_t>(step);
  const Philox4x32Out o =
      philox4x32_10(static_cast<uint32_t>(s), static_cast<uint32_t>(s >> 32), 0u, 0u,
                    static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return (static_cast<uint64_t>(o.v[0]) << 32) | o.v[1];
}

/// Uniform double in [0, 1): the top 53 bits of philox_draw64(seed, step), times 2^-53. The
/// host-side view of the device sampler's draw (usable by a CPU sampler that wants the same
/// stream as the GPU one).
PAGODA_PHILOX_HD double philox_uniform(uint64_t seed, int64_t step) {
  return static_cast<double>(philox_draw64(seed, step) >> 11) * 0x1.0p-53;
}

}  // namespace pagoda::model
