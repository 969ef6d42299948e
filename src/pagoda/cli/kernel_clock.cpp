#include "pagoda/cli/kernel_clock.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "pagoda/core/error.h"
#ifdef PAGODA_CLI_HAVE_CPU_BACKEND
#include "pagoda/kernels/cpu/paged_attention.h"
#endif
#ifdef PAGODA_CLI_HAVE_CUDA
#include "pagoda/platform/cuda/cuda_timing.h"
#endif

#ifdef PAGODA_CLI_HAVE_BLAS
extern "C" {
void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                 const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc);
void openblas_set_num_threads(int num_threads);
}
#endif

namespace pagoda::cli {
namespace {

using Clock = std::chrono::steady_clock;

/// Last-level cache size in bytes (0 when the OS does not say).
size_t host_llc_bytes() {
  long b = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
  b = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (b <= 0) b = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  return b > 0 ? static_cast<size_t>(b) : 0;
}

class HostClock final : public KernelClock {
 public:
  HostClock(int threads, bool flush) : threads_(threads) {
    if (flush) flush_buf_.resize(std::max(2 * host_llc_bytes(), size_t{64} << 20));
  }
  std::string timer_name() const override { return "wall_clock"; }
  void flush() override {
    if (flush_buf_.empty()) return;
    std::memset(flush_buf_.data(), ++fill_, flush_buf_.size());
    sink_ += flush_buf_[flush_buf_.size() / 2];
  }
  size_t flush_bytes() const override { return flush_buf_.size(); }
  void start() override { t0_ = Clock::now(); }
  double stop_ms() override { return seconds_since(t0_) * 1e3; }
  double copy_gbps() override {
    const size_t bytes = size_t{256} << 20;
    std::vector<unsigned char> src(bytes, 1), dst(bytes, 0);
    std::vector<double> rates;
    for (int r = 0; r < 5; ++r) {
      src[static_cast<size_t>(r)] = static_cast<unsigned char>(r);
      const auto t0 = Clock::now();
      std::memcpy(dst.data(), src.data(), bytes);
      rates.push_back(2.0 * static_cast<double>(bytes) / seconds_since(t0) / 1e9);
      sink_ += dst[static_cast<size_t>(r)];
    }
    rates.erase(rates.begin());  // first touch
    return median(rates);
  }
  std::string copy_name() const override { return "host_memcpy"; }
  double gemm_tflops() override {
#ifdef PAGODA_CLI_HAVE_BLAS
    openblas_set_num_threads(threads_);
    const int n = 2048;
    std::vector<float> a(size_t{n} * n, 0.5f), b(size_t{n} * n, 0.25f), c(size_t{n} * n);
    std::vector<double> rates;
    for (int r = 0; r < 4; ++r) {
      const auto t0 = Clock::now();
      cblas_sgemm(101, 111, 111, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
      rates.push_back(2.0 * n * n * n / seconds_since(t0) / 1e12);
    }
    rates.erase(rates.begin());  // warm-up
    return median(rates);
#else
    return 0.0;
#endif
  }
  std::string gemm_name() const override { return "openblas_sgemm"; }
  ~HostClock() override {
    if (sink_ == 0xdeadbeef) std::fprintf(stderr, " ");  // keeps the writes observable
  }

 private:
  int threads_;
  std::vector<unsigned char> flush_buf_;
  unsigned char fill_ = 0;
  uint64_t sink_ = 0;
  Clock::time_point t0_;
};

#ifdef PAGODA_CLI_HAVE_CUDA
class CudaClock final : public KernelClock {
 public:
  explicit CudaClock(bool flush) : timer_(nullptr) {
    if (flush) flusher_ = std::make_unique<platform::CudaL2Flusher>(nullptr);
  }
  std::string timer_name() const override { return "cuda_events"; }
  void flush() override {
    if (flusher_) flusher_->flush();
  }
  size_t flush_bytes() const override { return flusher_ ? flusher_->buffer_bytes() : 0; }
  void start() override { timer_.start(); }
  double stop_ms() override { return timer_.stop_ms(); }
  double copy_gbps() override { return platform::cuda_copy_bandwidth_gbps(nullptr); }
  std::string copy_name() const override { return "cuda_d2d_memcpy"; }
  double gemm_tflops() override { return platform::cuda_bf16_gemm_tflops(nullptr); }
  std::string gemm_name() const override { return "cublas_bf16"; }

 private:
  platform::CudaEventTimer timer_;
  std::unique_ptr<platform::CudaL2Flusher> flusher_;
};
#endif

}  // namespace

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::unique_ptr<KernelClock> make_host_clock(int threads, bool flush) {
  return std::make_unique<HostClock>(threads, flush);
}

std::unique_ptr<KernelClock> make_cuda_clock(bool flush) {
#ifdef PAGODA_CLI_HAVE_CUDA
  return std::make_unique<CudaClock>(flush);
#else
  (void)flush;
  throw_error(ErrorCode::kUnsupported, "kernels: this build has no CUDA backend");
#endif
}

double measure_host_read_gbps(int threads) {
#ifdef PAGODA_CLI_HAVE_CPU_BACKEND
  const int64_t n = int64_t{1} << 28;  // 1 GiB of floats
  std::vector<float> buf(static_cast<size_t>(n));
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) buf[static_cast<size_t>(i)] = static_cast<float>(i & 7);
  std::vector<double> rates;
  double sink = 0;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    sink += kernels::cpu::cpu_stream_read_sum(buf.data(), n, threads);
    rates.push_back(static_cast<double>(n) * 4 / seconds_since(t0) / 1e9);
  }
  if (sink == 0.125) std::fprintf(stderr, " ");  // keeps the reads observable
  return median(rates);
#else
  (void)threads;
  return 0.0;
#endif
}

}  // namespace pagoda::cli
