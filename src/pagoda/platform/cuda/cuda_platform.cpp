#include "pagoda/platform/cuda/cuda_platform.h"

#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/kernels/cuda/launch.h"
#include "pagoda/platform/cuda/cuda_check.h"

namespace pagoda::platform {
namespace {

/// Device memory through plain cudaMalloc (no managed memory, no pooling).
class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int ordinal) : ordinal_(ordinal) {}
  Device device() const override { return Device::cuda(ordinal_); }
  void* allocate(size_t bytes, size_t alignment) override {
    if (bytes == 0) return nullptr;
    PAGODA_REQUIRE(alignment <= 256, kInvalidArgument,
                   "cudaMalloc gives 256-byte alignment; {} requested", alignment);
    void* p = nullptr;
    cuda_check(cudaSetDevice(ordinal_), "cudaSetDevice");
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      throw_error(ErrorCode::kResourceExhausted, "cudaMalloc of {} bytes on cuda:{} failed: {}",
                  bytes, ordinal_, cudaGetErrorString(e));
    }
    return p;
  }
  void deallocate(void* ptr) override {
    if (ptr != nullptr) (void)cudaFree(ptr);
  }
  // The Allocator contract makes copies synchronous with respect to all device work. Plain
  // cudaMemcpy only orders against the legacy default stream (not the platform's non-blocking
  // stream) and may return before a pageable H2D copy lands, so both sides are fenced.
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  }
  void fill_bytes(void* dst, uint8_t value, size_t bytes) override {
    if (bytes) {
      cuda_check(cudaMemset(dst, value, bytes), "cudaMemset");
      cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
  }

 private:
  int ordinal_;
};

/// Page-locked host memory (cudaHostAlloc); device() is the host.
class PinnedAllocator final : public Allocator {
 public:
  Device device() const override { return Device::cpu(); }
  void* allocate(size_t bytes, size_t alignment) override {
    if (bytes == 0) return nullptr;
    PAGODA_REQUIRE(alignment <= 4096, kInvalidArgument,
                   "pinned memory is page aligned; {} requested", alignment);
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      throw_error(ErrorCode::kResourceExhausted, "cudaHostAlloc of {} bytes failed: {}", bytes,
                  cudaGetErrorString(e));
    }
    return p;
  }
  void deallocate(void* ptr) override {
    if (ptr != nullptr) (void)cudaFreeHost(ptr);
  }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void fill_bytes(void* dst, uint8_t value, size_t bytes) override {
    if (bytes) std::memset(dst, value, bytes);
  }
};

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(cudaStream_t stream) : stream_(stream) {
    cuda_check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~CudaEvent() override { (void)cudaEventDestroy(event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  void record() override { cuda_check(cudaEventRecord(event_, stream_), "cudaEventRecord"); }
  void synchronize() override { cuda_check(cudaEventSynchronize(event_), "cudaEventSynchronize"); }
  cudaEvent_t native() const { return event_; }
  bool done() override {
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) return false;
    cuda_check(e, "cudaEventQuery");
    return true;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t event_ = nullptr;
};

/// A stream of its own for bulk copies (the hierarchical KV cache); events are CudaEvents
/// recorded on it, which the compute stream can wait for (CudaPlatform::wait_event).
class CudaCopyStream final : public CopyStream {
 public:
  CudaCopyStream() { cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~CudaCopyStream() override {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
  CudaCopyStream(const CudaCopyStream&) = delete;
  CudaCopyStream& operator=(const CudaCopyStream&) = delete;
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "cudaMemcpyAsync");
  }
  void copy_batch(std::span<const Op> ops) override {
    dsts_.clear();
    srcs_.clear();
    sizes_.clear();
    for (const Op& op : ops) {
      if (op.bytes == 0) continue;
      dsts_.push_back(op.dst);
      srcs_.push_back(op.src);
      sizes_.push_back(op.bytes);
    }
    if (dsts_.empty()) return;
    // One attribute for every copy: sources read in stream order (after what the stream waited
    // for), and the copies may yield to the compute stream's kernels.
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attr_index = 0;
    cuda_check(cudaMemcpyBatchAsync(dsts_.data(), srcs_.data(), sizes_.data(), dsts_.size(),
                                    &attr, &attr_index, 1, stream_),
               "cudaMemcpyBatchAsync");
  }
  std::unique_ptr<Event> record() override {
    auto e = std::make_unique<CudaEvent>(stream_);
    e->record();
    return e;
  }
  void synchronize() override { cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }
  void wait(Event& event) override {
    auto* e = dynamic_cast<CudaEvent*>(&event);
    PAGODA_REQUIRE(e != nullptr, kInvalidArgument, "CopyStream::wait: not a CUDA event");
    cuda_check(cudaStreamWaitEvent(stream_, e->native(), 0), "cudaStreamWaitEvent");
  }

 private:
  cudaStream_t stream_ = nullptr;
  std::vector<void*> dsts_;  ///< copy_batch's arrays, kept to reuse their memory
  std::vector<const void*> srcs_;
  std::vector<size_t> sizes_;
};

}  // namespace

std::unique_ptr<CopyStream> CudaPlatform::make_copy_stream() {
  return std::make_unique<CudaCopyStream>();
}

void CudaPlatform::wait_event(Event& event) {
  auto* e = dynamic_cast<CudaEvent*>(&event);
  PAGODA_REQUIRE(e != nullptr, kInvalidArgument, "wait_event: not an event of the CUDA platform");
  cuda_check(cudaStreamWaitEvent(stream_, e->native(), 0), "cudaStreamWaitEvent");
}

CudaPlatform::CudaPlatform(int ordinal) : ordinal_(ordinal) {
  const int n = cuda_device_count();
  PAGODA_REQUIRE(ordinal >= 0 && ordinal < n, kUnsupported,
                 "CUDA device {} does not exist ({} visible)", ordinal, n);
  cuda_check(cudaSetDevice(ordinal), "cudaSetDevice");
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
  caps_.sm_arch = prop.major * 10 + prop.minor;
  caps_.sm_count = prop.multiProcessorCount;
  caps_.max_smem_per_block = prop.sharedMemPerBlockOptin;
  caps_.total_memory = prop.totalGlobalMem;
  caps_.device_name = prop.name;
  caps_.num_cpu_threads = 1;
  allocator_ = std::make_unique<CudaAllocator>(ordinal);
  pinned_ = std::make_unique<PinnedAllocator>();
  cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
}

CudaPlatform::~CudaPlatform() {
  if (stream_ != nullptr) {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
}

void CudaPlatform::synchronize() { cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

MemoryInfo CudaPlatform::memory_info() const {
  size_t free = 0, total = 0;
  cuda_check(cudaSetDevice(ordinal_), "cudaSetDevice");
  cuda_check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return {.free_bytes = static_cast<int64_t>(free), .total_bytes = static_cast<int64_t>(total)};
}

void CudaPlatform::synchronize_stream() {
  cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void CudaPlatform::copy_to_device_async(void* dst, const void* host_src, size_t bytes) {
  if (bytes)
    cuda_check(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync H2D");
}

void CudaPlatform::copy_to_host_async(void* host_dst, const void* src, size_t bytes) {
  if (bytes)
    cuda_check(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync D2H");
}

void CudaPlatform::copy_async(void* dst, const void* src, size_t bytes) {
  if (bytes)
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_),
               "cudaMemcpyAsync D2D");
}

void CudaPlatform::fill_bytes_async(void* dst, uint8_t value, size_t bytes) {
  if (bytes) cuda_check(cudaMemsetAsync(dst, value, bytes, stream_), "cudaMemsetAsync");
}

std::unique_ptr<Event> CudaPlatform::make_event() { return std::make_unique<CudaEvent>(stream_); }

int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<Platform> make_cuda_platform() {
  if (cuda_device_count() == 0) return nullptr;
  return std::make_unique<CudaPlatform>(0);
}

void register_cuda_platform(PlatformRegistry& registry) {
  registry.add("cuda", &make_cuda_platform, 100);
}

Status cuda_append_kv(const kernels::cuda::AppendArgs& args, cudaStream_t stream) noexcept {
  return kernels::cuda::launch_append_kv(args, stream);
}

}  // namespace pagoda::platform
