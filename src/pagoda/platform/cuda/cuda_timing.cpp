#include "pagoda/platform/cuda/cuda_timing.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/platform/cuda/cuda_check.h"

namespace pagoda::platform {
namespace {

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw_error(ErrorCode::kInternal, "{}: cuBLAS status {}", what, static_cast<int>(s));
  }
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// A device allocation freed on scope exit.
struct DeviceMem {
  void* p = nullptr;
  explicit DeviceMem(size_t bytes) { cuda_check(cudaMalloc(&p, bytes), "cudaMalloc"); }
  ~DeviceMem() { (void)cudaFree(p); }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
};

/// Times `fn` (enqueued on `stream`) `reps` times after one warm-up; returns each run's ms.
template <typename Fn>
std::vector<double> time_runs(void* stream, int reps, Fn&& fn) {
  CudaEventTimer timer(stream);
  fn();
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    timer.start();
    fn();
    ms.push_back(timer.stop_ms());
  }
  return ms;
}

}  // namespace

CudaEventTimer::CudaEventTimer(void* stream) : stream_(stream) {
  cudaEvent_t a = nullptr, b = nullptr;
  cuda_check(cudaEventCreate(&a), "cudaEventCreate");
  if (const cudaError_t e = cudaEventCreate(&b); e != cudaSuccess) {
    (void)cudaEventDestroy(a);
    cuda_check(e, "cudaEventCreate");
  }
  start_ = a;
  stop_ = b;
}

CudaEventTimer::~CudaEventTimer() {
  (void)cudaEventDestroy(as_event(start_));
  (void)cudaEventDestroy(as_event(stop_));
}

void CudaEventTimer::start() {
  cuda_check(cudaEventRecord(as_event(start_), as_stream(stream_)), "cudaEventRecord");
}

double CudaEventTimer::stop_ms() {
  cuda_check(cudaEventRecord(as_event(stop_), as_stream(stream_)), "cudaEventRecord");
  cuda_check(cudaEventSynchronize(as_event(stop_)), "cudaEventSynchronize");
  float ms = 0;
  cuda_check(cudaEventElapsedTime(&ms, as_event(start_), as_event(stop_)), "cudaEventElapsedTime");
  return ms;
}

size_t cuda_l2_bytes() {
  int dev = 0, l2 = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev), "cudaDeviceGetAttribute(L2)");
  return static_cast<size_t>(l2);
}

CudaL2Flusher::CudaL2Flusher(void* stream)
    : stream_(stream), bytes_(std::max<size_t>(2 * cuda_l2_bytes(), size_t{256} << 20)) {
  cuda_check(cudaMalloc(&buf_, bytes_), "cudaMalloc (L2 flush buffer)");
}

CudaL2Flusher::~CudaL2Flusher() { (void)cudaFree(buf_); }

void CudaL2Flusher::flush() {
  static unsigned char value = 0;
  cuda_check(cudaMemsetAsync(buf_, ++value, bytes_, as_stream(stream_)), "cudaMemsetAsync (L2 flush)");
}

double cuda_copy_bandwidth_gbps(void* stream) {
  const size_t bytes = size_t{1} << 30;
  DeviceMem src(bytes), dst(bytes);
  cuda_check(cudaMemsetAsync(src.p, 1, bytes, as_stream(stream)), "cudaMemsetAsync");
  const auto ms = time_runs(stream, 5, [&] {
    cuda_check(cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, as_stream(stream)),
          "cudaMemcpyAsync D2D");
  });
  return 2.0 * static_cast<double>(bytes) / (median(ms) * 1e-3) / 1e9;
}

double cuda_bf16_gemm_tflops(void* stream) {
  const int n = 8192;
  const size_t bytes = size_t{n} * n * 2;
  DeviceMem a(bytes), b(bytes), c(bytes);
  // 0x3c3c is the bf16 0.0115: finite products, no denormals.
  cuda_check(cudaMemsetAsync(a.p, 0x3c, bytes, as_stream(stream)), "cudaMemsetAsync");
  cuda_check(cudaMemsetAsync(b.p, 0x3c, bytes, as_stream(stream)), "cudaMemsetAsync");
  cublasHandle_t handle = nullptr;
  check_blas(cublasCreate(&handle), "cublasCreate");
  std::vector<double> ms;
  try {
    check_blas(cublasSetStream(handle, as_stream(stream)), "cublasSetStream");
    const float alpha = 1.f, beta = 0.f;
    ms = time_runs(stream, 5, [&] {
      check_blas(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.p,
                              CUDA_R_16BF, n, b.p, CUDA_R_16BF, n, &beta, c.p, CUDA_R_16BF, n,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
    });
  } catch (...) {
    (void)cublasDestroy(handle);
    throw;
  }
  (void)cublasDestroy(handle);
  return 2.0 * n * static_cast<double>(n) * n / (median(ms) * 1e-3) / 1e12;
}

}  // namespace pagoda::platform
