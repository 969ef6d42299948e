#pragma once
/// CudaPlatform: the GPU as a pagoda Platform (ARCHITECTURE §2): device queries (SM arch and
/// count, opt-in shared memory, memory), a plain-cudaMalloc allocator, one owned stream, and
/// the KV append kernel for device-resident pools. Built only with PAGODA_CUDA.
///
/// Thread safety: const methods from any thread; the allocator is thread-safe (CUDA runtime).

#include <cuda_runtime_api.h>

#include <memory>

#include "pagoda/core/status.h"
#include "pagoda/kernels/cuda/attention_params.h"
#include "pagoda/platform/platform.h"

namespace pagoda::platform {

class CudaPlatform final : public Platform {
 public:
  /// Binds device `ordinal` (throws Error(kUnsupported) when it does not exist) and creates a
  /// non-blocking stream for its work.
  explicit CudaPlatform(int ordinal = 0);
  ~CudaPlatform() override;
  CudaPlatform(const CudaPlatform&) = delete;
  CudaPlatform& operator=(const CudaPlatform&) = delete;

  PlatformKind kind() const override { return PlatformKind::kCuda; }
  std::string name() const override { return "cuda"; }
  Device device() const override { return Device::cuda(ordinal_); }
  const Capabilities& capabilities() const override { return caps_; }
  Allocator& allocator() override { return *allocator_; }
  std::string default_attention_backend() const override { return "cuda"; }
  void synchronize() override;
  /// cudaMemGetInfo of the device.
  MemoryInfo memory_info() const override;
  void* native_stream() const override { return stream_; }
  void synchronize_stream() override;
  void copy_to_device_async(void* dst, const void* host_src, size_t bytes) override;
  void copy_to_host_async(void* host_dst, const void* src, size_t bytes) override;
  /// cudaMemcpyAsync (device to device) on stream().
  void copy_async(void* dst, const void* src, size_t bytes) override;
  /// cudaMemsetAsync on stream().
  void fill_bytes_async(void* dst, uint8_t value, size_t bytes) override;
  /// cudaHostAlloc'd (portable) host memory.
  Allocator& pinned_allocator() override { return *pinned_; }
  /// A cudaEvent (timing disabled) recorded on stream().
  std::unique_ptr<Event> make_event() override;
  /// A non-blocking stream of its own (cudaMemcpyAsync, cudaMemcpyDefault) whose events are
  /// cudaEvents (timing disabled).
  std::unique_ptr<CopyStream> make_copy_stream() override;
  /// cudaStreamWaitEvent(stream(), event): never blocks the host; capturable.
  void wait_event(Event& event) override;

  /// The platform's stream (non-blocking, capturable into CUDA graphs). Owned; valid while the
  /// platform lives.
  cudaStream_t stream() const { return stream_; }

 private:
  int ordinal_;
  Capabilities caps_;
  std::unique_ptr<Allocator> allocator_;
  std::unique_ptr<Allocator> pinned_;
  cudaStream_t stream_ = nullptr;
};

/// Number of visible CUDA devices (0 when there is no driver or no GPU; never throws).
int cuda_device_count() noexcept;

/// A CudaPlatform on device 0, or nullptr when no GPU is present.
std::unique_ptr<Platform> make_cuda_platform();

/// Adds "cuda" (priority 100, above the CPU) to `registry`; its factory returns nullptr on a
/// machine without a GPU, so make_default() then falls back to the CPU.
void register_cuda_platform(PlatformRegistry& registry);

/// Writes n new tokens into a device paged cache (KvPool::set_kv on the GPU): see
/// kernels/cuda AppendArgs. Enqueued on `stream`; returns the launch status (never throws).
Status cuda_append_kv(const kernels::cuda::AppendArgs& args, cudaStream_t stream) noexcept;

}  // namespace pagoda::platform
