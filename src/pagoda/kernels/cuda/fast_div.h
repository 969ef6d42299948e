#pragma once
/// Division of non-negative ints by a divisor that is fixed for a launch (the GQA group size G,
/// the kv head count), by a multiply-high, an add and a shift instead of the ~30 instructions of
/// a runtime int division. Header-only, no CUDA dependency: compiled by the host compiler it is
/// plain inline C++ (the host test checks it against / and %), compiled by nvcc every function is
/// __host__ __device__. make() runs on the host, once per launch (it has a 64-bit division); the
/// kernel takes the result as a parameter, so its words sit in the constant bank, not registers.
///
/// The method is the round-up multiplier of Granlund and Montgomery, "Division by invariant
/// integers using multiplication" (PLDI 1994, section 4) with N = 32: for d >= 1, l =
/// ceil(log2 d) and m = floor(2^32 (2^l - d) / d) + 1 < 2^32, x / d = (mulhi(x, m) + x) >> l for
/// every 0 <= x < 2^32. Their form adds half of x - mulhi(x, m) to keep the sum in 32 bits; for
/// x < 2^31, which is every value divided here, mulhi(x, m) <= x and the plain sum fits.
/// d = 1 gives l = 0, m = 1: mulhi is 0 and x comes back.

#include <cstdint>

#if defined(__CUDACC__)
#define PAGODA_DIV_HD __host__ __device__ __forceinline__
#else
#define PAGODA_DIV_HD inline
#endif

namespace pagoda::kernels::cuda::detail {

struct FastDiv {
  int d = 1;       ///< the divisor (>= 1)
  uint32_t m = 1;  ///< the multiplier
  uint32_t l = 0;  ///< the shift, ceil(log2 d)

  /// The divider for d (1 <= d < 2^31). Host code (a 64-bit division), once per launch.
  static FastDiv make(int d) {
    FastDiv f;
    f.d = d;
    f.l = 0;
    while ((uint64_t(1) << f.l) < uint64_t(d)) ++f.l;
    f.m = static_cast<uint32_t>(
        ((uint64_t(1) << 32) * ((uint64_t(1) << f.l) - uint64_t(d))) / uint64_t(d) + 1);
    return f;
  }
  /// x / d for 0 <= x < 2^31 (undefined for negative x).
  PAGODA_DIV_HD int div(int x) const {
    const auto ux = static_cast<uint32_t>(x);
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(ux, m);
#else
    const auto hi = static_cast<uint32_t>((uint64_t(ux) * m) >> 32);
#endif
    return static_cast<int>((hi + ux) >> l);
  }
  /// x % d for 0 <= x < 2^31.
  PAGODA_DIV_HD int mod(int x) const {
    return x - div(x) * d;
  }
};

/// x / d with d an int (a runtime division) or a FastDiv (x >= 0: the kernels divide row indices
/// of planned work items, and the planner makes an item only where it has rows, so a tile's last
/// row index is never -1). The kernels' shared helpers take either, so a kernel that does not
/// pass a FastDiv keeps its code.
PAGODA_DIV_HD int div_by(int x, int d) {
  return x / d;
}
PAGODA_DIV_HD int div_by(int x, const FastDiv& d) {
  return d.div(x);
}
/// x % d, likewise.
PAGODA_DIV_HD int mod_by(int x, int d) {
  return x % d;
}
PAGODA_DIV_HD int mod_by(int x, const FastDiv& d) {
  return d.mod(x);
}
/// The divisor itself.
PAGODA_DIV_HD int divisor(int d) {
  return d;
}
PAGODA_DIV_HD int divisor(const FastDiv& d) {
  return d.d;
}

}  // namespace pagoda::kernels::cuda::detail
