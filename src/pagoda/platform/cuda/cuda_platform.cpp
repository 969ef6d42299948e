#include "pagoda/platform/cuda/cuda_platform.h"

#include <string>

#include "pagoda/core/error.h"
#include "pagoda/kernels/cuda/launch.h"

namespace pagoda::platform {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw_error(ErrorCode::kInternal, "{}: {}", what, cudaGetErrorString(e));
  }
}

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
    check(cudaSetDevice(ordinal_), "cudaSetDevice");
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
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  }
  void fill_bytes(void* dst, uint8_t value, size_t bytes) override {
    if (bytes) {
      check(cudaMemset(dst, value, bytes), "cudaMemset");
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
  }

 private:
  int ordinal_;
};

}  // namespace

CudaPlatform::CudaPlatform(int ordinal) : ordinal_(ordinal) {
  const int n = cuda_device_count();
  PAGODA_REQUIRE(ordinal >= 0 && ordinal < n, kUnsupported,
                 "CUDA device {} does not exist ({} visible)", ordinal, n);
  check(cudaSetDevice(ordinal), "cudaSetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
  caps_.sm_arch = prop.major * 10 + prop.minor;
  caps_.sm_count = prop.multiProcessorCount;
  caps_.max_smem_per_block = prop.sharedMemPerBlockOptin;
  caps_.total_memory = prop.totalGlobalMem;
  caps_.device_name = prop.name;
  caps_.num_cpu_threads = 1;
  allocator_ = std::make_unique<CudaAllocator>(ordinal);
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
}

CudaPlatform::~CudaPlatform() {
  if (stream_ != nullptr) {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
}

void CudaPlatform::synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

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
