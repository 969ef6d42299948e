// Dense kernels of the bf16/f16/f32 model path (dense_kernels.h). Built without fast math.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "pagoda/kernels/cuda/pdl.cuh"
#include "pagoda/model/cuda/dense_kernels.h"

namespace pagoda::model::cuda_kernels {

namespace {

using kernels::cuda::launch_pdl;
using kernels::cuda::pdl_launch_dependents;
using kernels::cuda::pdl_wait;

// ---------------------------------------------------------------------------------------------
// Conversions and vector loads.

template <typename T>
struct Conv;
template <>
struct Conv<float> {
  static __device__ __forceinline__ float to(float x) { return x; }
  static __device__ __forceinline__ float from(float x) { return x; }
};
template <>
struct Conv<__half> {
  static __device__ __forceinline__ float to(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from(float x) { return __float2half_rn(x); }
};
template <>
struct Conv<__nv_bfloat16> {
  static __device__ __forceinline__ float to(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from(float x) { return __float2bfloat16_rn(x); }
};

/// Loads N elements of T at p as f32: 16-byte words when N * sizeof(T) is a multiple of 16 (p
/// must then be 16-byte aligned), element by element otherwise.
template <typename T, int N>
__device__ __forceinline__ void load_f32(const T* p, float (&f)[N]) {
  if constexpr ((N * sizeof(T)) % 16 == 0) {
    constexpr int kWords = static_cast<int>(N * sizeof(T) / 16);
    uint4 raw[kWords];
#pragma unroll
    for (int w = 0; w < kWords; ++w) raw[w] = reinterpret_cast<const uint4*>(p)[w];
    const T* e = reinterpret_cast<const T*>(raw);
#pragma unroll
    for (int i = 0; i < N; ++i) f[i] = Conv<T>::to(e[i]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) f[i] = Conv<T>::to(p[i]);
  }
}

/// Rounds N f32 values to T and stores them at p (same vectorisation rule as load_f32).
template <typename T, int N>
__device__ __forceinline__ void store_f32(T* p, const float (&f)[N]) {
  if constexpr ((N * sizeof(T)) % 16 == 0) {
    constexpr int kWords = static_cast<int>(N * sizeof(T) / 16);
    uint4 raw[kWords];
    T* e = reinterpret_cast<T*>(raw);
#pragma unroll
    for (int i = 0; i < N; ++i) e[i] = Conv<T>::from(f[i]);
#pragma unroll
    for (int w = 0; w < kWords; ++w) reinterpret_cast<uint4*>(p)[w] = raw[w];
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = Conv<T>::from(f[i]);
  }
}

/// Sum over the block (blockDim.x a multiple of 32, <= 1024) in a fixed order, so the result is
/// deterministic and identical in every thread. `part` is shared scratch of 32 floats.
__device__ __forceinline__ float block_sum(float v, float* part) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  float total = 0.f;
  const int warps = static_cast<int>(blockDim.x >> 5);
  for (int w = 0; w < warps; ++w) total += part[w];
  __syncthreads();  // part may be reused after return
  return total;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

unsigned round_up_warp(int64_t n, int64_t lo, int64_t hi) {
  int64_t t = (n + 31) / 32 * 32;
  t = t < lo ? lo : t;
  return static_cast<unsigned>(t > hi ? hi : t);
}

unsigned blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (int64_t{1} << 20) ? (int64_t{1} << 20) : b));
}

unsigned row_grid(int64_t rows) {
  return static_cast<unsigned>(rows > 65535 * 16 ? 65535 * 16 : rows);
}

/// 16-byte vector width (elements) of T.
template <typename T>
constexpr int kVec = static_cast<int>(16 / sizeof(T));

// ---------------------------------------------------------------------------------------------
// Embedding gather: a bit copy in words of W.

template <typename W>
__global__ void embed_kernel(const W* __restrict__ table, const int32_t* __restrict__ ids,
                             W* __restrict__ out, int64_t rows, int64_t words,
                             int64_t vocab_begin, int64_t vocab_rows) {
  pdl_wait();  // every kernel here reads its predecessor's output (pdl.cuh)
  pdl_launch_dependents();
  for (int64_t t = blockIdx.x; t < rows; t += gridDim.x) {
    const int64_t local = static_cast<int64_t>(ids[t]) - vocab_begin;
    W* dst = out + t * words;
    if (vocab_rows >= 0 && (local < 0 || local >= vocab_rows)) {
      for (int64_t i = threadIdx.x; i < words; i += blockDim.x) dst[i] = W{};
      continue;
    }
    const W* src = table + local * words;
    for (int64_t i = threadIdx.x; i < words; i += blockDim.x) dst[i] = src[i];
  }
}

template <typename W>
cudaError_t launch_embed(const void* table, const int32_t* ids, void* out, int64_t rows,
                         int64_t bytes, cudaStream_t stream, int64_t vocab_begin,
                         int64_t vocab_rows) {
  const int64_t words = bytes / static_cast<int64_t>(sizeof(W));
  return launch_pdl(embed_kernel<W>, row_grid(rows), round_up_warp(words, 32, 256), 0, stream,
                    static_cast<const W*>(table), ids, static_cast<W*>(out), rows, words,
                    vocab_begin, vocab_rows);
}

// ---------------------------------------------------------------------------------------------
// Residual add + RMSNorm (one block per row, grid-stride over rows).

enum class NormMode { kAssign, kAdd, kRead };

constexpr int kNormCache = 4;  // chunks per thread kept in registers between the two phases

template <typename T, int N, NormMode kMode>
__global__ void __launch_bounds__(1024)
    norm_kernel(const T* x, float* residual, const int32_t* __restrict__ row_index,
                const T* __restrict__ weight, T* out, int64_t rows, int64_t hidden, float eps) {
  pdl_wait();  // every kernel here reads its predecessor's output (pdl.cuh)
  pdl_launch_dependents();
  __shared__ float part[32];
  const int64_t chunks = hidden / N;
  for (int64_t t = blockIdx.x; t < rows; t += gridDim.x) {
    const int64_t r = (kMode == NormMode::kRead && row_index != nullptr) ? row_index[t] : t;
    float* res = residual + r * hidden;
    const T* xr = kMode == NormMode::kRead ? nullptr : x + t * hidden;
    // Phase 1: residual update and sum of squares.
    auto update = [&](int64_t idx, float (&v)[N]) {
      if constexpr (kMode == NormMode::kRead) {
        load_f32<float, N>(res + idx * N, v);
      } else {
        float xv[N];
        load_f32<T, N>(xr + idx * N, xv);
        if constexpr (kMode == NormMode::kAdd) {
          float rv[N];
          load_f32<float, N>(res + idx * N, rv);
#pragma unroll
          for (int i = 0; i < N; ++i) v[i] = __fadd_rn(rv[i], xv[i]);
        } else {
#pragma unroll
          for (int i = 0; i < N; ++i) v[i] = xv[i];
        }
        store_f32<float, N>(res + idx * N, v);
      }
    };
    float cache[kNormCache][N];
    float ss = 0.f;
#pragma unroll
    for (int c = 0; c < kNormCache; ++c) {
      const int64_t idx = threadIdx.x + static_cast<int64_t>(c) * blockDim.x;
      if (idx < chunks) {
        update(idx, cache[c]);
#pragma unroll
        for (int i = 0; i < N; ++i) ss += cache[c][i] * cache[c][i];
      }
    }
    for (int64_t idx = threadIdx.x + int64_t{kNormCache} * blockDim.x; idx < chunks;
         idx += blockDim.x) {
      float v[N];
      update(idx, v);
#pragma unroll
      for (int i = 0; i < N; ++i) ss += v[i] * v[i];
    }
    const float total = block_sum(ss, part);
    const float inv = 1.f / sqrtf(total / static_cast<float>(hidden) + eps);
    // Phase 2: scale by inv and the weight, one rounding to T.
    T* o = out + t * hidden;
    auto emit = [&](int64_t idx, const float (&v)[N]) {
      float w[N], y[N];
      load_f32<T, N>(weight + idx * N, w);
#pragma unroll
      for (int i = 0; i < N; ++i) y[i] = __fmul_rn(__fmul_rn(v[i], inv), w[i]);
      store_f32<T, N>(o + idx * N, y);
    };
#pragma unroll
    for (int c = 0; c < kNormCache; ++c) {
      const int64_t idx = threadIdx.x + static_cast<int64_t>(c) * blockDim.x;
      if (idx < chunks) emit(idx, cache[c]);
    }
    for (int64_t idx = threadIdx.x + int64_t{kNormCache} * blockDim.x; idx < chunks;
         idx += blockDim.x) {
      float v[N];
      load_f32<float, N>(res + idx * N, v);  // written by this thread in phase 1
      emit(idx, v);
    }
  }
}

template <typename T, NormMode kMode>
cudaError_t launch_norm(const void* x, float* residual, const int32_t* row_index,
                        const void* weight, void* out, int64_t rows, int64_t hidden, float eps,
                        cudaStream_t stream) {
  constexpr int kN = 8;
  const bool vec = hidden % kN == 0 && (kMode == NormMode::kRead || aligned16(x)) &&
                   aligned16(residual) && aligned16(weight) && aligned16(out);
  const T* xt = static_cast<const T*>(x);
  const T* wt = static_cast<const T*>(weight);
  T* ot = static_cast<T*>(out);
  if (vec) {
    const unsigned threads = round_up_warp((hidden / kN + 1) / 2, 64, 1024);
    return launch_pdl(norm_kernel<T, kN, kMode>, row_grid(rows), threads, 0, stream, xt, residual,
                      row_index, wt, ot, rows, hidden, eps);
  }
  const unsigned threads = round_up_warp((hidden + 3) / 4, 64, 1024);
  return launch_pdl(norm_kernel<T, 1, kMode>, row_grid(rows), threads, 0, stream, xt, residual,
                    row_index, wt, ot, rows, hidden, eps);
}

// ---------------------------------------------------------------------------------------------
// q/k/v split + bias + NeoX RoPE. blockIdx.y strides over rows; x over (head, chunk of N pairs).
// kStore: k/v rows also (or only, when k/v are null) go to the paged KV cache at the token's slot.

template <typename T, int N, bool kBias, bool kStore>
__global__ void qkv_rope_kernel(const T* __restrict__ qkv, const T* __restrict__ bias,
                                const int32_t* __restrict__ positions,
                                const float* __restrict__ inv_freq, T* __restrict__ q,
                                T* __restrict__ k, T* __restrict__ v, KvCacheWrite cache,
                                int64_t rows, int hq, int hkv, int d) {
  pdl_wait();  // every kernel here reads its predecessor's output (pdl.cuh)
  pdl_launch_dependents();
  const int half = d / 2;
  const int per_head = half / N;
  const int heads = hq + 2 * hkv;
  const int items = heads * per_head;
  for (int64_t t = blockIdx.y; t < rows; t += gridDim.y) {
    const float pos = static_cast<float>(positions[t]);
    const T* row = qkv + t * static_cast<int64_t>(heads) * d;
    int64_t slot = -1;
    if (kStore && hkv > 0) {
      const int64_t s = cache.out_cache_loc[t];
      slot = (s >= 0 && s < cache.num_slots) ? s : -1;  // out of range: skip the k/v stores
    }
    for (int it = blockIdx.x * blockDim.x + threadIdx.x; it < items;
         it += gridDim.x * blockDim.x) {
      const int h = it / per_head;
      const int i0 = (it - h * per_head) * N;
      float a[N], b[N];
      load_f32<T, N>(row + h * d + i0, a);
      load_f32<T, N>(row + h * d + half + i0, b);
      if constexpr (kBias) {
        float ba[N], bb[N];
        load_f32<T, N>(bias + h * d + i0, ba);
        load_f32<T, N>(bias + h * d + half + i0, bb);
#pragma unroll
        for (int e = 0; e < N; ++e) {
          a[e] = __fadd_rn(a[e], ba[e]);
          b[e] = __fadd_rn(b[e], bb[e]);
        }
      }
      T* dst;             // the contiguous row (k/v: null when kStore skips them)
      T* dst2 = nullptr;  // the cache row (kStore, k/v heads, valid slot)
      if (h < hq) {
        dst = q + (t * hq + h) * static_cast<int64_t>(d);
      } else if (h < hq + hkv) {
        const int kh = h - hq;
        dst = k == nullptr ? nullptr : k + (t * hkv + kh) * static_cast<int64_t>(d);
        if (kStore && slot >= 0)
          dst2 = static_cast<T*>(cache.k_cache) + (slot * hkv + kh) * static_cast<int64_t>(d);
      } else {
        const int vh = h - hq - hkv;
        dst = v == nullptr ? nullptr : v + (t * hkv + vh) * static_cast<int64_t>(d);
        if (kStore && slot >= 0)
          dst2 = static_cast<T*>(cache.v_cache) + (slot * hkv + vh) * static_cast<int64_t>(d);
      }
      if (h < hq + hkv) {
        float f[N];
        load_f32<float, N>(inv_freq + i0, f);
#pragma unroll
        for (int e = 0; e < N; ++e) {
          float s, c;
          sincosf(__fmul_rn(pos, f[e]), &s, &c);
          const float ra = __fsub_rn(__fmul_rn(a[e], c), __fmul_rn(b[e], s));
          const float rb = __fadd_rn(__fmul_rn(b[e], c), __fmul_rn(a[e], s));
          a[e] = ra;
          b[e] = rb;
        }
      }
      if (!kStore || dst != nullptr) {
        store_f32<T, N>(dst + i0, a);
        store_f32<T, N>(dst + half + i0, b);
      }
      if constexpr (kStore) {
        if (dst2 != nullptr) {
          store_f32<T, N>(dst2 + i0, a);
          store_f32<T, N>(dst2 + half + i0, b);
        }
      }
    }
  }
}

template <typename T, int N, bool kStore>
cudaError_t launch_qkv_rope_n(const void* qkv, const void* bias, const int32_t* positions,
                              const float* inv_freq, void* q, void* k, void* v,
                              const KvCacheWrite& cache, int64_t rows, int hq, int hkv, int d,
                              cudaStream_t stream) {
  const int items = (hq + 2 * hkv) * (d / 2 / N);
  constexpr int kThreads = 128;
  const dim3 grid(blocks_for(items, kThreads),
                  static_cast<unsigned>(rows > 65535 ? 65535 : rows));
  const T* b = static_cast<const T*>(bias);
  auto kernel = b != nullptr ? qkv_rope_kernel<T, N, true, kStore>
                             : qkv_rope_kernel<T, N, false, kStore>;
  return launch_pdl(kernel, grid, kThreads, 0, stream, static_cast<const T*>(qkv), b, positions,
                    inv_freq, static_cast<T*>(q), static_cast<T*>(k), static_cast<T*>(v), cache,
                    rows, hq, hkv, d);
}

bool aligned16_or_null(const void* p) { return p == nullptr || aligned16(p); }

template <typename T, bool kStore>
cudaError_t launch_qkv_rope(const void* qkv, const void* bias, const int32_t* positions,
                            const float* inv_freq, void* q, void* k, void* v,
                            const KvCacheWrite& cache, int64_t rows, int hq, int hkv, int d,
                            cudaStream_t stream) {
  constexpr int kN = kVec<T>;
  const bool vec = (d / 2) % kN == 0 && aligned16(qkv) && aligned16_or_null(bias) &&
                   aligned16(inv_freq) && aligned16(q) && aligned16_or_null(k) &&
                   aligned16_or_null(v) && aligned16_or_null(cache.k_cache) &&
                   aligned16_or_null(cache.v_cache);
  if (vec)
    return launch_qkv_rope_n<T, kN, kStore>(qkv, bias, positions, inv_freq, q, k, v, cache, rows,
                                            hq, hkv, d, stream);
  return launch_qkv_rope_n<T, 1, kStore>(qkv, bias, positions, inv_freq, q, k, v, cache, rows,
                                         hq, hkv, d, stream);
}

template <bool kStore>
cudaError_t dispatch_qkv_rope(ActDType dtype, const void* qkv, const void* bias,
                              const int32_t* positions, const float* inv_freq, void* q, void* k,
                              void* v, const KvCacheWrite& cache, int64_t rows, int hq, int hkv,
                              int d, cudaStream_t stream) {
  switch (dtype) {
    case ActDType::kF32:
      return launch_qkv_rope<float, kStore>(qkv, bias, positions, inv_freq, q, k, v, cache, rows,
                                            hq, hkv, d, stream);
    case ActDType::kF16:
      return launch_qkv_rope<__half, kStore>(qkv, bias, positions, inv_freq, q, k, v, cache,
                                             rows, hq, hkv, d, stream);
    case ActDType::kBF16:
      return launch_qkv_rope<__nv_bfloat16, kStore>(qkv, bias, positions, inv_freq, q, k, v,
                                                    cache, rows, hq, hkv, d, stream);
  }
  return cudaErrorInvalidValue;
}

// ---------------------------------------------------------------------------------------------
// SwiGLU and logits conversion (grid-stride over N-element chunks).

template <typename T, int N>
__global__ void silu_mul_kernel(const T* __restrict__ gate_up, T* __restrict__ out, int64_t rows,
                                int64_t inter) {
  pdl_wait();  // every kernel here reads its predecessor's output (pdl.cuh)
  pdl_launch_dependents();
  const int64_t per_row = inter / N;
  const int64_t total = rows * per_row;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < total;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = j / per_row;
    const int64_t c = (j - t * per_row) * N;
    float g[N], u[N], y[N];
    load_f32<T, N>(gate_up + t * 2 * inter + c, g);
    load_f32<T, N>(gate_up + t * 2 * inter + inter + c, u);
#pragma unroll
    for (int i = 0; i < N; ++i)
      y[i] = __fmul_rn(__fdiv_rn(g[i], __fadd_rn(1.f, expf(-g[i]))), u[i]);
    store_f32<T, N>(out + t * inter + c, y);
  }
}

template <typename T>
cudaError_t launch_silu_mul(const void* gate_up, void* out, int64_t rows, int64_t inter,
                            cudaStream_t stream) {
  constexpr int kN = kVec<T>;
  constexpr int kThreads = 256;
  const T* g = static_cast<const T*>(gate_up);
  T* o = static_cast<T*>(out);
  if (inter % kN == 0 && aligned16(gate_up) && aligned16(out))
    return launch_pdl(silu_mul_kernel<T, kN>, blocks_for(rows * (inter / kN), kThreads), kThreads,
                      0, stream, g, o, rows, inter);
  return launch_pdl(silu_mul_kernel<T, 1>, blocks_for(rows * inter, kThreads), kThreads, 0, stream,
                    g, o, rows, inter);
}

template <typename T, int N>
__global__ void to_f32_kernel(const T* in, float* out, int64_t chunks, float cap) {
  pdl_wait();  // every kernel here reads its predecessor's output (pdl.cuh)
  pdl_launch_dependents();
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < chunks;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float x[N];
    load_f32<T, N>(in + j * N, x);
    if (cap > 0.f) {
#pragma unroll
      for (int i = 0; i < N; ++i) x[i] = __fmul_rn(cap, tanhf(__fdiv_rn(x[i], cap)));
    }
    store_f32<float, N>(out + j * N, x);
  }
}

template <typename T>
cudaError_t launch_to_f32(const void* in, float* out, int64_t n, float cap, cudaStream_t stream) {
  constexpr int kN = 8;
  constexpr int kThreads = 256;
  const T* src = static_cast<const T*>(in);
  if (n % kN == 0 && aligned16(in) && aligned16(out))
    return launch_pdl(to_f32_kernel<T, kN>, blocks_for(n / kN, kThreads), kThreads, 0, stream, src,
                      out, n / kN, cap);
  return launch_pdl(to_f32_kernel<T, 1>, blocks_for(n, kThreads), kThreads, 0, stream, src, out, n,
                    cap);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Launchers.

cudaError_t embed_rows(ActDType dtype, const void* table, const int32_t* ids, void* out,
                       int64_t rows, int64_t hidden, cudaStream_t stream, int64_t vocab_begin,
                       int64_t vocab_rows) {
  if (rows <= 0 || hidden <= 0) return cudaSuccess;
  const int64_t bytes = hidden * act_dtype_size(dtype);
  if (bytes % 16 == 0 && aligned16(table) && aligned16(out))
    return launch_embed<uint4>(table, ids, out, rows, bytes, stream, vocab_begin, vocab_rows);
  if (bytes % 4 == 0 && (reinterpret_cast<uintptr_t>(table) & 3u) == 0 &&
      (reinterpret_cast<uintptr_t>(out) & 3u) == 0)
    return launch_embed<uint32_t>(table, ids, out, rows, bytes, stream, vocab_begin, vocab_rows);
  return launch_embed<uint16_t>(table, ids, out, rows, bytes, stream, vocab_begin, vocab_rows);
}

cudaError_t add_rms_norm(ActDType dtype, const void* x, float* residual, const void* weight,
                         void* out, int64_t rows, int64_t hidden, float eps, ResidualOp op,
                         cudaStream_t stream) {
  if (rows <= 0 || hidden <= 0) return cudaSuccess;
  const bool add = op == ResidualOp::kAdd;
  switch (dtype) {
    case ActDType::kF32:
      return add ? launch_norm<float, NormMode::kAdd>(x, residual, nullptr, weight, out, rows,
                                                      hidden, eps, stream)
                 : launch_norm<float, NormMode::kAssign>(x, residual, nullptr, weight, out, rows,
                                                         hidden, eps, stream);
    case ActDType::kF16:
      return add ? launch_norm<__half, NormMode::kAdd>(x, residual, nullptr, weight, out, rows,
                                                       hidden, eps, stream)
                 : launch_norm<__half, NormMode::kAssign>(x, residual, nullptr, weight, out,
                                                          rows, hidden, eps, stream);
    case ActDType::kBF16:
      return add ? launch_norm<__nv_bfloat16, NormMode::kAdd>(x, residual, nullptr, weight, out,
                                                              rows, hidden, eps, stream)
                 : launch_norm<__nv_bfloat16, NormMode::kAssign>(x, residual, nullptr, weight,
                                                                 out, rows, hidden, eps, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t rms_norm_rows(ActDType dtype, const float* residual, const int32_t* row_index,
                          const void* weight, void* out, int64_t rows, int64_t hidden, float eps,
                          cudaStream_t stream) {
  if (rows <= 0 || hidden <= 0) return cudaSuccess;
  // kRead never writes the residual.
  float* res = const_cast<float*>(residual);
  switch (dtype) {
    case ActDType::kF32:
      return launch_norm<float, NormMode::kRead>(nullptr, res, row_index, weight, out, rows,
                                                 hidden, eps, stream);
    case ActDType::kF16:
      return launch_norm<__half, NormMode::kRead>(nullptr, res, row_index, weight, out, rows,
                                                  hidden, eps, stream);
    case ActDType::kBF16:
      return launch_norm<__nv_bfloat16, NormMode::kRead>(nullptr, res, row_index, weight, out,
                                                         rows, hidden, eps, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t qkv_bias_rope(ActDType dtype, const void* qkv, const void* bias,
                          const int32_t* positions, const float* inv_freq, void* q, void* k,
                          void* v, int64_t rows, int hq, int hkv, int head_dim,
                          cudaStream_t stream) {
  if (head_dim <= 0 || head_dim % 2 != 0 || hq < 0 || hkv < 0) return cudaErrorInvalidValue;
  if (rows <= 0 || hq + 2 * hkv == 0) return cudaSuccess;
  return dispatch_qkv_rope<false>(dtype, qkv, bias, positions, inv_freq, q, k, v,
                                  KvCacheWrite{nullptr, nullptr, nullptr, 0}, rows, hq, hkv,
                                  head_dim, stream);
}

cudaError_t qkv_bias_rope_store(ActDType dtype, const void* qkv, const void* bias,
                                const int32_t* positions, const float* inv_freq, void* q, void* k,
                                void* v, const KvCacheWrite& cache, int64_t rows, int hq, int hkv,
                                int head_dim, cudaStream_t stream) {
  if (head_dim <= 0 || head_dim % 2 != 0 || hq < 0 || hkv < 0) return cudaErrorInvalidValue;
  if (rows <= 0 || hq + 2 * hkv == 0) return cudaSuccess;
  if (hkv > 0 && (cache.k_cache == nullptr || cache.v_cache == nullptr ||
                  cache.out_cache_loc == nullptr || cache.num_slots < 0))
    return cudaErrorInvalidValue;
  return dispatch_qkv_rope<true>(dtype, qkv, bias, positions, inv_freq, q, k, v, cache, rows, hq,
                                 hkv, head_dim, stream);
}

cudaError_t silu_mul(ActDType dtype, const void* gate_up, void* out, int64_t rows, int64_t inter,
                     cudaStream_t stream) {
  if (rows <= 0 || inter <= 0) return cudaSuccess;
  switch (dtype) {
    case ActDType::kF32:
      return launch_silu_mul<float>(gate_up, out, rows, inter, stream);
    case ActDType::kF16:
      return launch_silu_mul<__half>(gate_up, out, rows, inter, stream);
    case ActDType::kBF16:
      return launch_silu_mul<__nv_bfloat16>(gate_up, out, rows, inter, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t logits_to_f32_softcap(ActDType dtype, const void* in, float* out, int64_t n,
                                  float cap, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  switch (dtype) {
    case ActDType::kF32:
      return launch_to_f32<float>(in, out, n, cap, stream);
    case ActDType::kF16:
      return launch_to_f32<__half>(in, out, n, cap, stream);
    case ActDType::kBF16:
      return launch_to_f32<__nv_bfloat16>(in, out, n, cap, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t soft_cap_inplace(float* x, int64_t n, float cap, cudaStream_t stream) {
  if (n <= 0 || !(cap > 0.f)) return cudaSuccess;
  return launch_to_f32<float>(x, x, n, cap, stream);
}

}  // namespace pagoda::model::cuda_kernels
