#pragma once
/// Device-side timing and same-run ceilings for `pagoda kernels --backend cuda` (and any bench
/// that wants one timer for every backend). No CUDA header here: streams are passed as void*
/// (a cudaStream_t; nullptr = the legacy default stream, which make_cuda_batch_attention() uses).
///
/// Units: milliseconds, GB/s (1e9 bytes), TFLOP/s (1e12). Everything runs on the current device.
/// Thread safety: one thread per object; the free functions are thread-safe but contend for the
/// device, so call them when nothing else is running.

#include <cstddef>

namespace pagoda::platform {

/// A pair of timing CUDA events on one stream: start() records the first, stop_ms() records the
/// second, waits for it and returns the GPU time between them. Throws Error(kInternal) on a CUDA
/// failure (no device, launch error pending).
class CudaEventTimer {
 public:
  explicit CudaEventTimer(void* stream);
  ~CudaEventTimer();
  CudaEventTimer(const CudaEventTimer&) = delete;
  CudaEventTimer& operator=(const CudaEventTimer&) = delete;

  void start();
  double stop_ms();

 private:
  void* stream_;
  void* start_ = nullptr;  // cudaEvent_t
  void* stop_ = nullptr;
};

/// Evicts the L2: flush() writes (cudaMemsetAsync, enqueued on the stream) a device buffer of
/// 2x the L2 size, at least 256 MiB: the buffer triton.testing.do_bench zeroes before every
/// repetition, so pagoda and its Python peers are timed under one L2 policy. The next kernel
/// reads its operands from HBM.
class CudaL2Flusher {
 public:
  explicit CudaL2Flusher(void* stream);
  ~CudaL2Flusher();
  CudaL2Flusher(const CudaL2Flusher&) = delete;
  CudaL2Flusher& operator=(const CudaL2Flusher&) = delete;

  void flush();
  size_t buffer_bytes() const { return bytes_; }

 private:
  void* stream_;
  void* buf_ = nullptr;
  size_t bytes_ = 0;
};

/// L2 cache size of the current device in bytes.
size_t cuda_l2_bytes();

/// Device-to-device cudaMemcpyAsync bandwidth over 1 GiB buffers on `stream`, counted as bytes
/// read + bytes written per second (the same accounting as a kernel that reads its operands and
/// writes its output), median of 5 timed copies after one warm-up.
double cuda_copy_bandwidth_gbps(void* stream);

/// cuBLAS bf16 x bf16 -> bf16 GEMM (f32 accumulate, tensor cores) rate at m = n = k = 8192 on
/// `stream`, median of 5 timed calls after one warm-up.
double cuda_bf16_gemm_tflops(void* stream);

}  // namespace pagoda::platform
