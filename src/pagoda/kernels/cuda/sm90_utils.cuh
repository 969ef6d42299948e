#pragma once
/// sm_90 building blocks of the Hopper kernels: mbarriers, named barriers, proxy fences,
/// register reallocation, wgmma fences and shared-memory matrix descriptors.
///
/// Everything here compiles for any architecture (the kernels guard their sm_90a bodies), but
/// only runs on sm_90a: the wgmma / setmaxnreg instructions do not exist elsewhere.

#include <cuda.h>  // CUtensorMap (a plain struct; no driver call is made here)

#include <atomic>
#include <cstdint>

#include "pagoda/kernels/cuda/device_utils.cuh"
#include "pagoda/kernels/cuda/wgmma_ops.cuh"

namespace pagoda::kernels::cuda::detail {

/// Host: whether the current device runs `kernel`'s sm_90a image (compute capability 9.0 and
/// the sm_90a code built); cached per device for each kernel type. A missing image is an
/// answer, not a sticky error.
template <typename Kernel>
bool device_runs_sm90a(Kernel kernel) {
  static std::atomic<int> cache[64];  // 0 unknown, 1 yes, 2 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    (void)cudaGetLastError();
    return false;
  }
  int v = cache[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    cudaFuncAttributes attr{};
    const bool ok = major == 9 && minor == 0 &&
                    cudaFuncGetAttributes(&attr, kernel) == cudaSuccess && attr.binaryVersion == 90;
    (void)cudaGetLastError();
    v = ok ? 1 : 2;
    cache[dev].store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

// ---- mbarriers (CTA scope) ----------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
/// Arrives on `bar` once every cp.async this thread issued before it has landed in shared
/// memory (.noinc: the arrival is one of the barrier's expected count); the thread goes on. A
/// reader of the data fences it into the async proxy (fence_proxy_async) after its wait.
__device__ __forceinline__ void cp_async_mbar_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar))
               : "memory");
}
/// A ring of `stages` (full, empty) mbarrier pairs, full[s] expecting `full_count` arrivals and
/// empty[s] `empty_count`, then the init fence. One thread calls it; the block syncs after.
__device__ __forceinline__ void mbar_init_ring(uint64_t* full, uint64_t* empty, int stages,
                                               int full_count, int empty_count) {
  for (int s = 0; s < stages; ++s) {
    mbar_init(&full[s], full_count);
    mbar_init(&empty[s], empty_count);
  }
  mbar_init_fence();
}
/// Blocks until the barrier's phase with the given parity (0 / 1) has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "LAB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra DONE;\n"
      "bra LAB_WAIT;\n"
      "DONE:\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

/// Arrives on `bar` (counting as one of its arrivals) and raises the bytes its current phase
/// waits for by `bytes`: the phase completes once every arrival came and that many bytes of
/// tensor copies (tma_load_4d) signalled it.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

// ---- tensor memory access (TMA) -----------------------------------------------------------
/// One box of the 4-D tensor `map` (a kernel parameter: __grid_constant__) at coordinates
/// c0 (innermost) .. c3 into shared memory at `dst`, completing `bytes` of `bar`'s transaction
/// count when it lands. Issued by one thread; the writes are in the async proxy (a wgmma may
/// read them once the barrier's phase completed, without a proxy fence).
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                            int c2, int c3, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(smem_addr(bar))
      : "memory");
}

/// One box of the 3-D tensor `map` (a kernel parameter: __grid_constant__) from shared memory
/// at `src` to global memory at coordinates c0 (innermost) .. c2, in the issuing thread's bulk
/// async group: that thread commits (tma_store_commit) and, before `src` may be written again,
/// waits for the group's reads (tma_store_wait_read). Generic-proxy writes of `src` must be
/// fenced into the async proxy (fence_proxy_async) by their writers and synced before the issue.
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, uint32_t src, int c0, int c1,
                                             int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group"
      " [%0, {%2, %3, %4}], [%1];\n" ::"l"(reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void tma_store_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
/// Waits until every committed bulk store of this thread has read its shared-memory source.
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
/// Waits until every committed bulk store of this thread has completed.
__device__ __forceinline__ void tma_store_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// ---- barriers and fences ------------------------------------------------------------------
/// bar.sync on a named barrier (id 1..15; 0 is __syncthreads) for `threads` threads.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
/// bar.arrive on a named barrier: counts this thread towards `threads` without waiting.
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
/// Orders this thread's generic-proxy shared-memory writes (stores, completed cp.async) before
/// later async-proxy reads (wgmma operands).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void reg_alloc() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void reg_dealloc() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

// ---- wgmma ordering -----------------------------------------------------------------------
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/// Pins accumulator registers at this point of the program, so the compiler neither reads them
/// before a wgmma_wait nor writes them after a wgmma that is still in flight.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
/// The same for registers a wgmma reads (its A fragments): they stay live, unchanged, up to here.
template <int N>
__device__ __forceinline__ void fence_operands(uint32_t (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// ---- shared-memory matrix descriptors (128-byte swizzle) ----------------------------------
/// Byte offset of 16-byte chunk `c` (0..7) of 128-byte row `r` inside a 128B-swizzled atom
/// column (rows of 64 16-bit elements; the column's base is 1024-byte aligned).
__device__ __forceinline__ uint32_t sw128_offset(int r, int c) {
  return static_cast<uint32_t>(r * 128 + ((c ^ (r & 7)) << 4));
}
/// Descriptor of a 128B-swizzled operand at shared byte address `addr`.
/// K-major (Q, K): rows of 128 bytes, 8-row groups `sbo` = 1024 bytes apart, `lbo` unused.
/// MN-major (V with the transpose bit): 8 k-rows of 64 MN elements per 1024-byte atom,
/// `lbo` = bytes between atoms along MN, `sbo` = bytes between 8-row groups along K.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = (addr & 0x3FFFFu) >> 4;
  d |= static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16;
  d |= static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32;
  d |= static_cast<uint64_t>(1) << 62;
  return d;
}
/// Descriptor `d` moved `bytes` (a multiple of 16) further into shared memory. Only the start
/// address field (bits 0-13, 16-byte units) changes, by a 32-bit add that cannot carry out of it
/// while the address stays inside shared memory (< 256 KB). A kernel builds each operand's base
/// descriptor once and advances it per wgmma: one add instead of the mask / shift / or chain of
/// sw128_desc in front of every wgmma (on the H200 those instructions held a fifth of the sm90
/// prefill consumer loop's stall samples at D 128, ncu, 2026-12-02).
__device__ __forceinline__ uint64_t desc_advance(uint64_t d, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(d) + (bytes >> 4);
  return (d & 0xFFFFFFFF00000000ull) | lo;
}

}  // namespace pagoda::kernels::cuda::detail
