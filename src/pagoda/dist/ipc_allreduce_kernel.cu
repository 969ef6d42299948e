// The one-shot all-reduce kernel (see ipc_allreduce.h). Device code only: no pagoda/core
// headers (fmt does not compile under nvcc).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "pagoda/dist/ipc_allreduce_kernel.h"

namespace pagoda::dist::detail {

namespace {

constexpr int kMaxRanks = kIpcMaxRanks;
constexpr int kMaxBlocks = kIpcMaxBlocks;
constexpr int kThreads = kIpcThreads;
// Flag area: arrival flags [kMaxBlocks][kMaxRanks], then epoch and done counters (own use).
constexpr size_t kFlagWords = kMaxBlocks * kMaxRanks + 2;
static_assert(kFlagWords * 4 <= kIpcFlagBytes);
using Peers = IpcPeers;

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

template <typename T>
struct Vec {  // 16 bytes of T as f32
  static constexpr int kN = 16 / sizeof(T);
};

__device__ __forceinline__ void add_to(float* acc, const uint4& v, float) {
  const float* f = reinterpret_cast<const float*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] += f[i];
}
__device__ __forceinline__ void add_to(float* acc, const uint4& v, __half) {
  const __half* h = reinterpret_cast<const __half*>(&v);
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] += __half2float(h[i]);
}
__device__ __forceinline__ void add_to(float* acc, const uint4& v, __nv_bfloat16) {
  const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&v);
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] += __bfloat162float(h[i]);
}
__device__ __forceinline__ uint4 pack(const float* acc, float) {
  uint4 v;
  float* f = reinterpret_cast<float*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) f[i] = acc[i];
  return v;
}
__device__ __forceinline__ uint4 pack(const float* acc, __half) {
  uint4 v;
  __half* h = reinterpret_cast<__half*>(&v);
#pragma unroll
  for (int i = 0; i < 8; ++i) h[i] = __float2half_rn(acc[i]);
  return v;
}
__device__ __forceinline__ uint4 pack(const float* acc, __nv_bfloat16) {
  uint4 v;
  __nv_bfloat16* h = reinterpret_cast<__nv_bfloat16*>(&v);
#pragma unroll
  for (int i = 0; i < 8; ++i) h[i] = __float2bfloat16_rn(acc[i]);
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    oneshot_allreduce(Peers peers, int rank, int world, uint4* data, int64_t nvec,
                      size_t half_bytes) {
  __shared__ uint32_t epoch;
  uint32_t* mine = peers.flags[rank];
  uint32_t* epoch_word = mine + kMaxBlocks * kMaxRanks;
  uint32_t* done_word = epoch_word + 1;
  if (threadIdx.x == 0) epoch = *reinterpret_cast<volatile uint32_t*>(epoch_word) + 1;
  __syncthreads();
  const uint32_t e = epoch;
  const size_t off = (e & 1u) * half_bytes;
  const int64_t per = (nvec + gridDim.x - 1) / gridDim.x;
  const int64_t lo = blockIdx.x * per;
  const int64_t hi = lo + per < nvec ? lo + per : nvec;
  // 1. This block's chunk into this rank's half, visible system-wide before the flag.
  uint4* own = reinterpret_cast<uint4*>(peers.data[rank] + off);
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) own[i] = data[i];
  __threadfence_system();
  __syncthreads();
  // 2. Barrier: raise this block's flag in every rank, wait for every rank's.
  if (threadIdx.x < world) {
    st_release_sys(peers.flags[threadIdx.x] + blockIdx.x * kMaxRanks + rank, e);
    while (ld_acquire_sys(mine + blockIdx.x * kMaxRanks + threadIdx.x) < e) {
    }
  }
  __syncthreads();
  // 3. Sum the chunk over the ranks in rank order.
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    float acc[Vec<T>::kN] = {};
    for (int r = 0; r < world; ++r) {
      const uint4 v = reinterpret_cast<const uint4*>(peers.data[r] + off)[i];
      add_to(acc, v, T{});
    }
    data[i] = pack(acc, T{});
  }
  // 4. The last block to finish advances the epoch for the next call.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const uint32_t prev = atomicAdd(done_word, 1u);
    if (prev == gridDim.x - 1) {
      *done_word = 0;
      *reinterpret_cast<volatile uint32_t*>(epoch_word) = e;
    }
  }
}

}  // namespace

cudaError_t launch_oneshot_allreduce(IpcDType dtype, const IpcPeers& peers, int rank, int world,
                                     void* data, int64_t nvec, size_t half_bytes, int blocks,
                                     cudaStream_t stream) {
  auto* d = static_cast<uint4*>(data);
  switch (dtype) {
    case IpcDType::kF32:
      oneshot_allreduce<float><<<blocks, kThreads, 0, stream>>>(peers, rank, world, d, nvec,
                                                                half_bytes);
      break;
    case IpcDType::kF16:
      oneshot_allreduce<__half><<<blocks, kThreads, 0, stream>>>(peers, rank, world, d, nvec,
                                                                 half_bytes);
      break;
    case IpcDType::kBF16:
      oneshot_allreduce<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(peers, rank, world, d,
                                                                        nvec, half_bytes);
      break;
  }
  return cudaGetLastError();
}

}  // namespace pagoda::dist::detail
