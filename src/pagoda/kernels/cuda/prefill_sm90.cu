/// Instantiations and raw launcher of the Hopper (sm_90a) paged prefill / extend kernel.

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "pagoda/kernels/cuda/launch_raw.h"
#include "pagoda/kernels/cuda/prefill_sm90_kernel.cuh"

namespace pagoda::kernels::cuda::raw {
namespace {

template <typename F>
bool dispatch_sm90(ElemType q, int d, F&& f) {
  auto with_d = [&](auto t_tag) {
    using T = decltype(t_tag);
    if (d == 64) return f.template operator()<T, 64>(), true;
    if (d == 128) return f.template operator()<T, 128>(), true;
    return false;
  };
  if (q == ElemType::kBF16) return with_d(__nv_bfloat16{});
  if (q == ElemType::kF16) return with_d(__half{});
  return false;
}

/// Whether the current device runs the sm_90a image of the kernel (cached per device).
bool device_has_sm90a() {
  static std::atomic<int> cache[64];  // 0 unknown, 1 yes, 2 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  int v = cache[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    cudaFuncAttributes attr{};
    const bool ok = major == 9 && minor == 0 &&
                    cudaFuncGetAttributes(&attr, detail::prefill_sm90_kernel<__nv_bfloat16, 128, false>) ==
                        cudaSuccess &&
                    attr.binaryVersion == 90;
    cudaGetLastError();  // a missing image is an answer, not a sticky error
    v = ok ? 1 : 2;
    cache[dev].store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

}  // namespace

bool prefill_sm90_usable(const AttentionArgs& a) {
  static const bool disabled = [] {
    const char* e = std::getenv("PAGODA_SM90_PREFILL");
    return e != nullptr && std::strcmp(e, "0") == 0;
  }();
  if (disabled) return false;
  if (a.q_dtype != a.kv_dtype || (a.q_dtype != ElemType::kBF16 && a.q_dtype != ElemType::kF16)) {
    return false;
  }
  if (a.head_dim_qk != a.head_dim_v || (a.head_dim_qk != 64 && a.head_dim_qk != 128)) return false;
  return device_has_sm90a();
}

cudaError_t prefill_sm90(const AttentionArgs& args, cudaStream_t stream) {
  if (args.grid_items == 0) return cudaSuccess;
  cudaError_t st = cudaErrorNotSupported;
  const dim3 grid(args.grid_items, args.num_kv_heads);
  dispatch_sm90(args.q_dtype, args.head_dim_qk, [&]<typename T, int D>() {
    using Cfg = detail::PrefillSm90Config<T, D>;
    static const bool pingpong = [] {
      const char* e = std::getenv("PAGODA_SM90_PINGPONG");
      return e != nullptr && std::strcmp(e, "1") == 0;
    }();
    auto kernel = pingpong ? detail::prefill_sm90_kernel<T, D, true>
                           : detail::prefill_sm90_kernel<T, D, false>;
    st = detail::launch_attention(kernel, grid, Cfg::kThreads, Cfg::kSmemBytes, args, stream);
  });
  return st;
}

}  // namespace pagoda::kernels::cuda::raw
