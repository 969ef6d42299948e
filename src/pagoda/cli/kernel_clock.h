#pragma once
/// KernelClock: the one timer `pagoda kernels` uses for every backend, and the ceilings it
/// measures in the same run so a result can be read as "% of copy bandwidth" / "% of GEMM rate".
///
///   host backends (cpu, reference): wall clock around each run, which returns only when its work
///     is done (a synchronised loop); flush() writes a buffer of 2x the LLC (at least 64 MiB);
///     copy = host memcpy, GEMM = OpenBLAS sgemm (0 when BLAS is not built in).
///   cuda: CUDA events recorded on the backend's stream (the legacy default stream) around each
///     run; flush() writes 2x the L2 on the device, at least 256 MiB (triton's do_bench buffer);
///     copy = device-to-device cudaMemcpy, GEMM = cuBLAS bf16 (platform/cuda/cuda_timing.h).
///
/// flush() is enqueued before start() and is never inside a timed interval. Copy bandwidth counts
/// bytes read + bytes written per second. Units: ms, GB/s (1e9 B), TFLOP/s (1e12).
/// Thread rules: one thread.

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace pagoda::cli {

class KernelClock {
 public:
  virtual ~KernelClock() = default;
  virtual std::string timer_name() const = 0;  ///< "wall_clock" | "cuda_events"
  /// Evicts the last cache level (not timed); flush_bytes() is the buffer it writes.
  virtual void flush() = 0;
  virtual size_t flush_bytes() const = 0;
  virtual void start() = 0;
  /// Waits for the work since start() and returns its time in ms.
  virtual double stop_ms() = 0;
  /// Copy bandwidth in GB/s (read + write) and its name ("host_memcpy" | "cuda_d2d_memcpy").
  virtual double copy_gbps() = 0;
  virtual std::string copy_name() const = 0;
  /// GEMM rate in TFLOP/s (0 when unavailable) and its name ("openblas_sgemm" | "cublas_bf16").
  virtual double gemm_tflops() = 0;
  virtual std::string gemm_name() const = 0;
};

/// The host clock; `threads` is used by the ceilings (memcpy, sgemm). Allocates the flush buffer
/// only when `flush` is true.
std::unique_ptr<KernelClock> make_host_clock(int threads, bool flush);

/// The CUDA-event clock on the legacy default stream. Throws Error(kUnsupported) when this build
/// has no CUDA (or there is no GPU).
std::unique_ptr<KernelClock> make_cuda_clock(bool flush);

/// Seconds on the steady clock since `t0`.
double seconds_since(std::chrono::steady_clock::time_point t0);

/// The median of `v` (the upper one for an even size; 0 when empty).
double median(std::vector<double> v);

/// Streaming read bandwidth (GB/s) of `threads` threads over 1 GiB (0 without the CPU backend).
double measure_host_read_gbps(int threads);

}  // namespace pagoda::cli
