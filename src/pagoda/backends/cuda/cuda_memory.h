#pragma once
/// Small RAII owners of CUDA memory used by the CUDA backend (device and pinned host); the
/// backend's CUDA error conversion is platform's (cuda_check.h).

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/core/status.h"
#include "pagoda/platform/cuda/cuda_check.h"

namespace pagoda::backends::cuda {

using platform::cuda_check;
using platform::cuda_status;

/// Byte offsets of consecutive arrays in one allocation, each starting at a 256-byte boundary
/// (cudaMalloc's alignment, so every array is aligned as an allocation of its own): add(bytes)
/// returns the next array's offset and records (offset, bytes); total is the allocation's size.
struct AlignedRegions {
  size_t total = 0;
  std::vector<std::pair<size_t, size_t>> regions;  ///< (offset, bytes) of each add(), in order
  size_t add(size_t bytes) {
    const size_t at = total;
    total = (total + bytes + 255) / 256 * 256;
    regions.emplace_back(at, bytes);
    return at;
  }
};

/// Where a CudaMemory allocates: device memory (cudaMalloc) or page-locked host memory
/// (cudaMallocHost).
struct DeviceMemory {
  static constexpr const char* kName = "cudaMalloc";
  static cudaError_t alloc(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
  static void free(void* p) { (void)cudaFree(p); }
};
struct PinnedHostMemory {
  static constexpr const char* kName = "cudaMallocHost";
  static cudaError_t alloc(void** p, size_t bytes) { return cudaMallocHost(p, bytes); }
  static void free(void* p) { (void)cudaFreeHost(p); }
};

/// An owned CUDA allocation of the kind `Kind` names; move-only. Never reallocated behind a
/// user's back: only reset() changes the pointer.
template <typename Kind>
class CudaMemory {
 public:
  CudaMemory() = default;
  explicit CudaMemory(size_t bytes) { reset(bytes); }
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;
  CudaMemory(CudaMemory&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  CudaMemory& operator=(CudaMemory&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  ~CudaMemory() { release(); }
  /// Frees and allocates `bytes` (throws Error(kResourceExhausted) when the allocation fails).
  void reset(size_t bytes) {
    release();
    if (bytes == 0) return;
    const cudaError_t e = Kind::alloc(&ptr_, bytes);
    if (e != cudaSuccess) {
      ptr_ = nullptr;
      throw_error(ErrorCode::kResourceExhausted, "{}({} bytes): {}", Kind::kName, bytes,
                  cudaGetErrorString(e));
    }
    bytes_ = bytes;
  }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void release() {
    if (ptr_ != nullptr) Kind::free(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

/// Device memory (cudaMalloc).
using CudaBuffer = CudaMemory<DeviceMemory>;
/// Page-locked host memory (cudaMallocHost), the staging side of async uploads.
using PinnedBuffer = CudaMemory<PinnedHostMemory>;

}  // namespace pagoda::backends::cuda
