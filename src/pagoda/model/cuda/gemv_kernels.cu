// Weight-streaming small-m GEMM (gemv_kernels.h). Built without fast math (the SwiGLU prologue
// uses the __expf / __fdividef intrinsics explicitly).
//
// Shape of the work. A thread block (256 threads = 8 warps) owns kRowsPerWarp * groups output
// rows ("row tile"); its 8 warps form `groups` row groups of 8 / groups warps each, and the warps
// of one row group split k. A warp streams kRowsPerWarp weight rows: each lane owns 16-byte chunks
// (8 elements) c = kg * 32 + lane + j * (32 * warps_per_group), so one warp instruction reads 512
// contiguous bytes of one row, and each iteration issues kRowsPerWarp * kUnroll = 8 independent
// 16-byte weight loads per thread before the first use. The activation chunk of the same k range
// (m rows, 16 bytes each, L1/L2 hits: x is at most a few hundred KB) is converted to f32 once per
// chunk and reused for all kRowsPerWarp rows. Partial sums: per-thread sequential, then a butterfly
// reduce-scatter across the warp (each of the V = rows * m sums ends in a distinct lane group), then
// the warps of a row group are added in warp order through shared memory. Every order is fixed.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "pagoda/kernels/cuda/pdl.cuh"
#include "pagoda/model/cuda/act_convert.cuh"
#include "pagoda/model/cuda/gemv_kernels.h"

namespace pagoda::model::cuda_kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

/// 16-byte load of read-only data that is used once: non-coherent path, no L1 allocation (the
/// weights must not evict the activation rows from L1).
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

/// 16-byte load of the activations (read-only during the kernel, re-read by every block: cached).
__device__ __forceinline__ uint4 ld_cached(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

/// Two packed 16-bit values (element 0 in the low half) to f32.
template <typename T>
__device__ __forceinline__ void unpack2(uint32_t v, float& lo, float& hi);
template <>
__device__ __forceinline__ void unpack2<__nv_bfloat16>(uint32_t v, float& lo, float& hi) {
  lo = __uint_as_float(v << 16);
  hi = __uint_as_float(v & 0xffff0000u);
}
template <>
__device__ __forceinline__ void unpack2<__half>(uint32_t v, float& lo, float& hi) {
  __half2 h;
  static_assert(sizeof(h) == sizeof(v));
  __builtin_memcpy(&h, &v, sizeof(v));
  const float2 f = __half22float2(h);
  lo = f.x;
  hi = f.y;
}

/// 8 elements of T in a 16-byte word to f32.
template <typename T>
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  unpack2<T>(v.x, f[0], f[1]);
  unpack2<T>(v.y, f[2], f[3]);
  unpack2<T>(v.z, f[4], f[5]);
  unpack2<T>(v.w, f[6], f[7]);
}

/// One reduce-scatter step over lanes lane ^ kOff: the lane with bit kOff set keeps (the sum of)
/// the upper kHalf values, its partner the lower kHalf, each in v[0, kHalf).
template <int kOff, int kHalf, int kN>
__device__ __forceinline__ void butterfly_step(float (&v)[kN], int lane) {
  const bool upper = (lane & kOff) != 0;
#pragma unroll
  for (int j = 0; j < kHalf; ++j) {
    const float send = upper ? v[j] : v[j + kHalf];
    const float keep = upper ? v[j + kHalf] : v[j];
    v[j] = keep + __shfl_xor_sync(0xffffffffu, send, kOff);
  }
}

/// Rows each warp streams for m padded to kMT: 8 for kMT <= 4, then 32 / kMT, so that
/// kRows * kMT (the per-thread accumulators, V) is at most 32.
template <int kMT>
constexpr int rows_per_warp() {
  return kMT <= 4 ? 8 : 32 / kMT;
}

/// Resident blocks per multiprocessor the register allocation must allow (caps the registers at
/// 80 for m = 1 and bf16 m = 2, 128 above): without it the m = 3..4 SwiGLU kernels took 150
/// registers (one block, 8 warps per SM: too few loads in flight). f16 m = 2 needs ~118 (its
/// conversions keep more live values) and spills under the 80 cap.
template <typename T, int kMT>
constexpr int min_blocks_per_sm() {
  return kMT == 1 || (kMT == 2 && std::is_same_v<T, __nv_bfloat16>) ? 3 : 2;
}

template <typename T, int kMT, bool kSwiglu, bool kF32Out>
__global__ void __launch_bounds__(kThreads, min_blocks_per_sm<T, kMT>())
    small_m_gemm_kernel(const T* __restrict__ x, const T* __restrict__ w, void* __restrict__ y,
                        int m, int64_t n, int64_t k, int groups) {
  constexpr int kRW = rows_per_warp<kMT>();
  constexpr int kUnroll = 8 / kRW;     // 16-byte weight loads in flight per thread: kRW * kUnroll
  constexpr int kV = kRW * kMT;        // sums per thread (power of two, <= 32)
  static_assert(kV <= 32 && (kV & (kV - 1)) == 0);
  __shared__ float red[kWarps][kV];

  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int per_group = kWarps / groups;  // warps splitting k in one row group
  const int grp = warp / per_group;
  const int kg = warp - grp * per_group;
  const int64_t row_base = (static_cast<int64_t>(blockIdx.x) * groups + grp) * kRW;
  const int64_t chunks = k / 8;  // 16-byte chunks per weight row
  const int64_t x_stride = kSwiglu ? 2 * k : k;

  // Rows past n read row n - 1 (valid memory) and are never stored.
  const T* wrow[kRW];
#pragma unroll
  for (int r = 0; r < kRW; ++r) {
    const int64_t row = row_base + r < n ? row_base + r : n - 1;
    wrow[r] = w + row * k;
  }

  float acc[kRW][kMT];
#pragma unroll
  for (int r = 0; r < kRW; ++r)
#pragma unroll
    for (int i = 0; i < kMT; ++i) acc[r][i] = 0.f;

  // acc[r][i] += a[i, chunk c] . w[row r, chunk c], a in f32 (SwiGLU applied), fixed order.
  auto accumulate = [&](int64_t c, const uint4 (&wv)[kRW]) {
    float wf[kRW][8];
#pragma unroll
    for (int r = 0; r < kRW; ++r) unpack8<T>(wv[r], wf[r]);
#pragma unroll
    for (int i = 0; i < kMT; ++i) {
      if (i < m) {
        const T* xr = x + i * x_stride + c * 8;
        float a[8];
        if constexpr (kSwiglu) {
          float g[8], u[8];
          unpack8<T>(ld_cached(xr), g);
          unpack8<T>(ld_cached(xr + k), u);
#pragma unroll
          for (int e = 0; e < 8; ++e) a[e] = __fdividef(g[e], 1.f + __expf(-g[e])) * u[e];
        } else {
          unpack8<T>(ld_cached(xr), a);
        }
#pragma unroll
        for (int r = 0; r < kRW; ++r)
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r][i] = fmaf(a[e], wf[r][e], acc[r][i]);
      }
    }
  };

  const int64_t step = static_cast<int64_t>(per_group) * 32;  // chunk stride of one lane
  int64_t c = static_cast<int64_t>(kg) * 32 + lane;
  // The weights are no kernel's output: the first iteration's loads are issued before waiting for
  // the kernel that wrote x (programmatic dependent launch, pdl.cuh), so they overlap its tail.
  // The accumulation order is the same as without the split.
  const bool first = c + (kUnroll - 1) * step < chunks;
  uint4 w0[kUnroll][kRW];
  if (first) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < kRW; ++r) w0[u][r] = ld_stream(wrow[r] + (c + u * step) * 8);
  }
  kernels::cuda::pdl_wait();
  kernels::cuda::pdl_launch_dependents();
  if (first) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) accumulate(c + u * step, w0[u]);
    c += kUnroll * step;
  }
  for (; c + (kUnroll - 1) * step < chunks; c += kUnroll * step) {
    uint4 wv[kUnroll][kRW];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < kRW; ++r) wv[u][r] = ld_stream(wrow[r] + (c + u * step) * 8);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) accumulate(c + u * step, wv[u]);
  }
  if constexpr (kUnroll > 1) {
    for (; c < chunks; c += step) {  // k tail: fewer than kUnroll chunks left for this lane
      uint4 wv[kRW];
#pragma unroll
      for (int r = 0; r < kRW; ++r) wv[r] = ld_stream(wrow[r] + c * 8);
      accumulate(c, wv);
    }
  }

  // Butterfly reduce-scatter over the warp: after log2(kV) steps lane holds the warp sum (over
  // the lanes that share its top log2(kV) bits) of value index lane >> (5 - log2(kV)); the
  // remaining xor steps add the other lanes.
  float v[kV];
#pragma unroll
  for (int r = 0; r < kRW; ++r)
#pragma unroll
    for (int i = 0; i < kMT; ++i) v[r * kMT + i] = acc[r][i];
  constexpr int kSteps = kV >= 32 ? 5 : kV >= 16 ? 4 : kV >= 8 ? 3 : kV >= 4 ? 2 : kV >= 2 ? 1 : 0;
  if constexpr (kSteps > 0) butterfly_step<16, kV / 2>(v, lane);
  if constexpr (kSteps > 1) butterfly_step<8, kV / 4>(v, lane);
  if constexpr (kSteps > 2) butterfly_step<4, kV / 8>(v, lane);
  if constexpr (kSteps > 3) butterfly_step<2, kV / 16>(v, lane);
  if constexpr (kSteps > 4) butterfly_step<1, kV / 32>(v, lane);
#pragma unroll
  for (int off = 16 >> kSteps; off > 0; off >>= 1) v[0] += __shfl_xor_sync(0xffffffffu, v[0], off);
  constexpr int kLowBits = 5 - kSteps;
  if ((lane & ((1 << kLowBits) - 1)) == 0) red[warp][lane >> kLowBits] = v[0];
  __syncthreads();

  // Warps of one row group in order; thread t -> (group, value index).
  const int t = static_cast<int>(threadIdx.x);
  if (t < groups * kV) {
    const int g = t / kV;
    const int idx = t - g * kV;
    float sum = red[g * per_group][idx];
    for (int q = 1; q < per_group; ++q) sum += red[g * per_group + q][idx];
    const int r = idx / kMT;
    const int i = idx - r * kMT;
    const int64_t row = (static_cast<int64_t>(blockIdx.x) * groups + g) * kRW + r;
    if (i < m && row < n) {
      if constexpr (kF32Out) {
        static_cast<float*>(y)[i * n + row] = sum;
      } else {
        static_cast<T*>(y)[i * n + row] = round_to<T>(sum);
      }
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

int sm_count() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0)
    return 132;
  return sms;
}

template <typename T, int kMT, bool kSwiglu, bool kF32Out>
cudaError_t launch(const void* x, const void* w, void* y, int64_t m, int64_t n, int64_t k,
                   cudaStream_t stream) {
  constexpr int kRW = rows_per_warp<kMT>();
  // Most row groups per block (fewest warps splitting k, longest streams) that still gives every
  // multiprocessor two blocks (one for m > 2); else one row group (the whole block splits k).
  // Every block re-reads all of x from L1/L2 (row groups of one block share it in L1), so the
  // x traffic is m * (x row length) / (rows per block) of the weight traffic: for m > 2 the
  // larger tiles keep it at or below the weight bytes (m = 8: 0.25-1x) at the cost of some tail.
  const int64_t want = (kMT > 2 ? 1 : 2) * static_cast<int64_t>(sm_count());
  int groups = kWarps;
  while (groups > 1 && (n + int64_t{groups} * kRW - 1) / (int64_t{groups} * kRW) < want)
    groups /= 2;
  const int64_t blocks = (n + int64_t{groups} * kRW - 1) / (int64_t{groups} * kRW);
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  return kernels::cuda::launch_pdl(small_m_gemm_kernel<T, kMT, kSwiglu, kF32Out>,
                                   static_cast<unsigned>(blocks), kThreads, 0, stream,
                                   static_cast<const T*>(x), static_cast<const T*>(w), y,
                                   static_cast<int>(m), n, k, groups);
}

template <typename T, int kMT>
cudaError_t dispatch_flags(const void* x, const void* w, void* y, bool f32_out, bool swiglu,
                           int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  if (swiglu) {
    return f32_out ? launch<T, kMT, true, true>(x, w, y, m, n, k, stream)
                   : launch<T, kMT, true, false>(x, w, y, m, n, k, stream);
  }
  return f32_out ? launch<T, kMT, false, true>(x, w, y, m, n, k, stream)
                 : launch<T, kMT, false, false>(x, w, y, m, n, k, stream);
}

template <typename T>
cudaError_t dispatch_m(const void* x, const void* w, void* y, bool f32_out, bool swiglu,
                       int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  if (m <= 1) return dispatch_flags<T, 1>(x, w, y, f32_out, swiglu, m, n, k, stream);
  if (m <= 2) return dispatch_flags<T, 2>(x, w, y, f32_out, swiglu, m, n, k, stream);
  if (m <= 4) return dispatch_flags<T, 4>(x, w, y, f32_out, swiglu, m, n, k, stream);
  if (m <= 8) return dispatch_flags<T, 8>(x, w, y, f32_out, swiglu, m, n, k, stream);
  return dispatch_flags<T, 16>(x, w, y, f32_out, swiglu, m, n, k, stream);
}

}  // namespace

bool small_m_gemm_supported(ActDType dtype, int64_t m, int64_t n, int64_t k) {
  return (dtype == ActDType::kBF16 || dtype == ActDType::kF16) && m >= 1 &&
         m <= kSmallMGemmMaxRows && n >= 1 && k >= 8 && k % 8 == 0;
}

cudaError_t small_m_gemm(ActDType dtype, const void* x, const void* w, void* y, bool f32_out,
                         bool swiglu, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  if (!small_m_gemm_supported(dtype, m, n, k) || !aligned16(x) || !aligned16(w) || y == nullptr)
    return cudaErrorInvalidValue;
  if (dtype == ActDType::kBF16)
    return dispatch_m<__nv_bfloat16>(x, w, y, f32_out, swiglu, m, n, k, stream);
  return dispatch_m<__half>(x, w, y, f32_out, swiglu, m, n, k, stream);
}

}  // namespace pagoda::model::cuda_kernels
