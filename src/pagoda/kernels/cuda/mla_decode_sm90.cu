/// Raw launcher of the Hopper MLA decode kernel (mla_decode_sm90_kernel.cuh).

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "pagoda/kernels/cuda/launch_raw.h"
#include "pagoda/kernels/cuda/mla_decode_sm90_kernel.cuh"

namespace pagoda::kernels::cuda::raw {
namespace {

/// Whether the current device runs the kernel's sm_90a image (cached per device).
bool device_runs_mla_sm90() {
  static std::atomic<int> cache[64];  // 0 unknown, 1 yes, 2 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    (void)cudaGetLastError();
    return false;
  }
  int v = cache[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0, minor = 0, optin = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    cudaFuncAttributes attr{};
    const bool ok = major == 9 && minor == 0 &&
                    size_t(optin) >= detail::MlaSm90Config::kSmemBytes &&
                    cudaFuncGetAttributes(&attr, detail::mla_decode_sm90_kernel) == cudaSuccess &&
                    attr.binaryVersion == 90;
    (void)cudaGetLastError();  // a missing image is an answer, not a sticky error
    v = ok ? 1 : 2;
    cache[dev].store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

}  // namespace

bool mla_decode_sm90_chosen(ElemType q, ElemType kv, ElemType out, int num_qo_heads) {
  if (q != ElemType::kBF16 || kv != ElemType::kBF16 || out != ElemType::kBF16) return false;
  // PAGODA_MLA_SM90: 0 = never, 2 = every head count (a block of 64 rows, the live heads first),
  // else from kMlaSm90Heads heads up.
  const char* e = std::getenv("PAGODA_MLA_SM90");
  const int mode = e == nullptr || *e == '\0' ? 1 : std::atoi(e);
  if (mode == 0 || (mode != 2 && num_qo_heads < kMlaSm90Heads)) return false;
  return device_runs_mla_sm90();
}

cudaError_t mla_decode_sm90(const AttentionArgs& args, cudaStream_t stream) {
  if (args.grid_items == 0) return cudaSuccess;
  using C = detail::MlaSm90Config;
  const dim3 grid(args.grid_items * ((args.num_qo_heads + C::kHeads - 1) / C::kHeads));
  return detail::launch_attention(detail::mla_decode_sm90_kernel, grid, C::kThreads, C::kSmemBytes,
                                  args, stream);
}

}  // namespace pagoda::kernels::cuda::raw
