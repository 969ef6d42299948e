#pragma once
/// Small RAII owners of CUDA memory used by the CUDA backend (device and pinned host), and the
/// CUDA-error-to-Status/Error conversion used at its API boundary.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "pagoda/core/error.h"
#include "pagoda/core/status.h"

namespace pagoda::backends::cuda {

/// Status of a CUDA runtime call (kInternal naming `what` on failure).
inline Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::ok();
  return Status(ErrorCode::kInternal, std::string(what) + ": " + cudaGetErrorString(e));
}
/// Throws Error(kInternal) when `e` is not cudaSuccess (API boundary only).
inline void cuda_check(cudaError_t e, const char* what) { cuda_status(e, what).throw_if_error(); }

/// Device memory from cudaMalloc; move-only. Never reallocated behind a user's back.
class CudaBuffer {
 public:
  CudaBuffer() = default;
  explicit CudaBuffer(size_t bytes) { reset(bytes); }
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;
  CudaBuffer(CudaBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; o.bytes_ = 0; }
  CudaBuffer& operator=(CudaBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  ~CudaBuffer() { release(); }
  /// Frees and allocates `bytes` (throws Error(kResourceExhausted) when cudaMalloc fails).
  void reset(size_t bytes) {
    release();
    if (bytes == 0) return;
    const cudaError_t e = cudaMalloc(&ptr_, bytes);
    if (e != cudaSuccess) {
      ptr_ = nullptr;
      throw_error(ErrorCode::kResourceExhausted, "cudaMalloc({} bytes): {}", bytes,
                  cudaGetErrorString(e));
    }
    bytes_ = bytes;
  }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void release() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

/// Page-locked host memory from cudaMallocHost; move-only.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { release(); }
  void reset(size_t bytes) {
    release();
    if (bytes == 0) return;
    const cudaError_t e = cudaMallocHost(&ptr_, bytes);
    if (e != cudaSuccess) {
      ptr_ = nullptr;
      throw_error(ErrorCode::kResourceExhausted, "cudaMallocHost({} bytes): {}", bytes,
                  cudaGetErrorString(e));
    }
    bytes_ = bytes;
  }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void release() {
    if (ptr_ != nullptr) (void)cudaFreeHost(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace pagoda::backends::cuda
