/// Times small_m_gemm (model/cuda/gemv_kernels.h) against cublasGemmEx (bf16 inputs, f32
/// compute, CUBLAS_GEMM_DEFAULT) at the decode projection shapes of Llama-3.2-1B and Llama-3-8B,
/// m = 1, 2, 4, 8, 16, and prints one table row per (shape, m).
///
/// Method: the device-to-device copy bandwidth is measured first (cudaMemcpy of 2 GiB, best of 5,
/// counting bytes read + written). Each kernel is timed over a CUDA graph of R launches that
/// rotate over enough weight copies that the weights in flight are >= 4x the L2 (so every launch
/// streams its weights from HBM), after a warm-up replay; the time per launch is the best of 20
/// replays / R. "GB/s" counts the bytes the kernel must move (weights + x + y); "%copy" is that
/// over the copy bandwidth. The swiglu rows time our fused SwiGLU + GEMM against cuBLAS's plain
/// GEMM on the already-activated input (cuBLAS would also need the silu_mul kernel). "diff" is
/// max |ours - cuBLAS| / rms(cuBLAS) of one plain launch (-1 on swiglu rows; ~1e-2 is one bf16
/// rounding of the largest outputs, f32 rows should show ~1e-6).
///
/// Usage: gemv_bench [--m 1,2,4,8,16]   (needs one CUDA GPU; prints to stdout)

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "pagoda/model/cuda/gemv_kernels.h"

namespace {

using pagoda::model::cuda_kernels::ActDType;
using pagoda::model::cuda_kernels::small_m_gemm;

#define CK(x)                                                                   \
  do {                                                                          \
    cudaError_t e_ = (x);                                                       \
    if (e_ != cudaSuccess) {                                                    \
      std::fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_));      \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

#define CB(x)                                                      \
  do {                                                             \
    cublasStatus_t s_ = (x);                                       \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                             \
      std::fprintf(stderr, "%s failed: status %d\n", #x, int(s_)); \
      std::exit(1);                                                \
    }                                                              \
  } while (0)

/// Random bf16 in about [-1, 1] (never zero), generated on the host.
void fill_bf16(void* dst, size_t elems, uint64_t seed) {
  std::vector<uint16_t> h(elems);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& v : h) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = uint16_t(((x & 1) << 15) | ((119 + (x >> 1) % 8) << 7) | ((x >> 8) & 0x7F));
  }
  CK(cudaMemcpy(dst, h.data(), elems * 2, cudaMemcpyHostToDevice));
}

/// Device-to-device copy bandwidth (read + written bytes / s), best of 5 copies of 2 GiB.
double copy_bandwidth() {
  const size_t bytes = size_t{2} << 30;
  void *a = nullptr, *b = nullptr;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMemset(a, 1, bytes));
  CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));  // warm-up
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  float best = 1e30f;
  for (int i = 0; i < 5; ++i) {
    CK(cudaEventRecord(e0));
    CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    best = std::min(best, ms);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaFree(a));
  CK(cudaFree(b));
  return 2.0 * double(bytes) / (double(best) * 1e-3);
}

struct Shape {
  const char* name;
  int64_t k, n;
  bool swiglu, f32_out;
};

/// Best-of-20 time per launch (µs) of `launch(copy)` captured R times into one graph.
template <typename F>
double time_graph(cudaStream_t s, int copies, F&& launch) {
  const int reps = std::max(copies, 8);
  launch(0);  // warm-up outside capture (cuBLAS heuristics and workspace)
  CK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int r = 0; r < reps; ++r) launch(r % copies);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, s));  // warm-up replay
  CK(cudaStreamSynchronize(s));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  float best = 1e30f;
  for (int i = 0; i < 20; ++i) {
    CK(cudaEventRecord(e0, s));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    best = std::min(best, ms);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return double(best) * 1e3 / reps;
}

/// max |a - b| / rms(b) over n outputs (bf16 or f32), b the cuBLAS result.
double max_rel_diff(const void* a, const void* b, size_t n, bool f32) {
  const size_t es = f32 ? 4 : 2;
  std::vector<unsigned char> ha(n * es), hb(n * es);
  CK(cudaMemcpy(ha.data(), a, n * es, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hb.data(), b, n * es, cudaMemcpyDeviceToHost));
  auto get = [&](const std::vector<unsigned char>& v, size_t i) {
    if (f32) {
      float f;
      std::memcpy(&f, v.data() + i * 4, 4);
      return double(f);
    }
    uint16_t u;
    std::memcpy(&u, v.data() + i * 2, 2);
    const uint32_t bits = uint32_t(u) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return double(f);
  };
  double ss = 0, worst = 0;
  for (size_t i = 0; i < n; ++i) ss += get(hb, i) * get(hb, i);
  const double rms = std::sqrt(ss / double(n));
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(get(ha, i) - get(hb, i)));
  return rms > 0 ? worst / rms : worst;
}

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  std::string str(s);
  size_t pos = 0;
  while (pos < str.size()) {
    const size_t end = str.find(',', pos);
    v.push_back(std::atoll(str.substr(pos, end - pos).c_str()));
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> ms = {1, 2, 4, 8, 16};
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--m") == 0) ms = parse_list(argv[i + 1]);

  int dev = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  const double copy_bw = copy_bandwidth();
  std::printf("device %s, %d SMs, L2 %d MB; D2D copy %.0f GB/s (read + write)\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, copy_bw / 1e9);

  const Shape shapes[] = {
      {"1B qkv", 2048, 3072, false, false},      {"1B o", 2048, 2048, false, false},
      {"1B gate_up", 2048, 16384, false, false}, {"1B down", 8192, 2048, false, false},
      {"1B down+swiglu", 8192, 2048, true, false}, {"1B lm_head f32", 2048, 128256, false, true},
      {"8B qkv", 4096, 6144, false, false},      {"8B o", 4096, 4096, false, false},
      {"8B gate_up", 4096, 28672, false, false}, {"8B down", 14336, 4096, false, false},
      {"8B down+swiglu", 14336, 4096, true, false},
  };

  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cublasHandle_t h;
  CB(cublasCreate(&h));
  CB(cublasSetStream(h, s));
  // A fixed workspace, so that cuBLAS allocates nothing while the graphs are captured.
  void* cublas_ws = nullptr;
  const size_t cublas_ws_bytes = size_t{32} << 20;
  CK(cudaMalloc(&cublas_ws, cublas_ws_bytes));
  CB(cublasSetWorkspace(h, cublas_ws, cublas_ws_bytes));

  std::printf("%-16s %6s %6s %3s %10s %10s %9s %6s %7s %9s\n", "shape", "k", "n", "m",
              "ours_us", "cublas_us", "ours_GB/s", "%copy", "speedup", "diff");
  for (const Shape& sh : shapes) {
    const size_t wbytes = size_t(sh.n * sh.k) * 2;
    const size_t l2 = size_t(std::max(prop.l2CacheSize, 1 << 20));
    const int copies = int(std::min<size_t>(64, (4 * l2 + wbytes - 1) / wbytes + 1));
    std::vector<void*> w(size_t(copies), nullptr);
    for (int c = 0; c < copies; ++c) {
      CK(cudaMalloc(&w[size_t(c)], wbytes));
      fill_bf16(w[size_t(c)], size_t(sh.n * sh.k), 17 + uint64_t(c));
    }
    const int64_t mmax = *std::max_element(ms.begin(), ms.end());
    void *x = nullptr, *y = nullptr;
    const int64_t xk = sh.swiglu ? 2 * sh.k : sh.k;
    CK(cudaMalloc(&x, size_t(mmax * xk) * 2));
    fill_bf16(x, size_t(mmax * xk), 5);
    CK(cudaMalloc(&y, size_t(mmax * sh.n) * 4));
    void* y_ref = nullptr;
    CK(cudaMalloc(&y_ref, size_t(mmax * sh.n) * 4));
    for (int64_t m : ms) {
      const double ours = time_graph(s, copies, [&](int c) {
        CK(small_m_gemm(ActDType::kBF16, x, w[size_t(c)], y, sh.f32_out, sh.swiglu, m, sh.n,
                        sh.k, s));
      });
      const float alpha = 1.f, beta = 0.f;
      const double cublas = time_graph(s, copies, [&](int c) {
        CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(sh.n), int(m), int(sh.k), &alpha,
                        w[size_t(c)], CUDA_R_16BF, int(sh.k), x, CUDA_R_16BF, int(sh.k), &beta,
                        y, sh.f32_out ? CUDA_R_32F : CUDA_R_16BF, int(sh.n), CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT));
      });
      // Sanity check against cuBLAS (plain GEMM only): max |ours - cublas| / rms(cublas).
      double diff = -1;
      if (!sh.swiglu) {
        CK(small_m_gemm(ActDType::kBF16, x, w[0], y, sh.f32_out, false, m, sh.n, sh.k, s));
        CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(sh.n), int(m), int(sh.k), &alpha, w[0],
                        CUDA_R_16BF, int(sh.k), x, CUDA_R_16BF, int(sh.k), &beta, y_ref,
                        sh.f32_out ? CUDA_R_32F : CUDA_R_16BF, int(sh.n), CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT));
        CK(cudaStreamSynchronize(s));
        diff = max_rel_diff(y, y_ref, size_t(m * sh.n), sh.f32_out);
      }
      const double bytes = double(wbytes) + double(m * xk * 2) +
                           double(m * sh.n * (sh.f32_out ? 4 : 2));
      const double gbs = bytes / (ours * 1e-6) / 1e9;
      std::printf("%-16s %6lld %6lld %3lld %10.2f %10.2f %9.0f %5.1f%% %6.2fx %9.2e\n",
                  sh.name, (long long)sh.k, (long long)sh.n, (long long)m, ours, cublas, gbs,
                  100.0 * gbs * 1e9 / copy_bw, cublas / ours, diff);
      std::fflush(stdout);
    }
    for (void* p : w) CK(cudaFree(p));
    CK(cudaFree(x));
    CK(cudaFree(y));
    CK(cudaFree(y_ref));
  }
  CB(cublasDestroy(h));
  CK(cudaFree(cublas_ws));
  CK(cudaStreamDestroy(s));
  return 0;
}
