#pragma once
/// Portability macros shared by host code and CUDA kernels. Header-only; no dependencies.

#if defined(__CUDACC__) || defined(__HIPCC__)
#define PAGODA_HOST_DEVICE __host__ __device__
#define PAGODA_DEVICE __device__
#else
#define PAGODA_HOST_DEVICE
#define PAGODA_DEVICE
#endif

#define PAGODA_INLINE inline __attribute__((always_inline))
#define PAGODA_LIKELY(x) __builtin_expect(!!(x), 1)
#define PAGODA_UNLIKELY(x) __builtin_expect(!!(x), 0)
