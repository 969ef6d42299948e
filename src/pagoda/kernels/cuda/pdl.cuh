#pragma once
/// Programmatic dependent launch (PDL, sm_90+): a kernel started with launch_pdl() may begin while
/// the kernel before it on the stream is still running, so its launch, block scheduling and
/// prologue overlap the predecessor's tail instead of following it (in CUDA graphs too: stream
/// capture records a programmatic edge).
///
/// Contract for a kernel launched with launch_pdl():
///   - it calls pdl_wait() before it reads anything an earlier kernel of the stream wrote and
///     before it writes anything an earlier kernel reads (pdl_wait returns once the predecessor
///     grid has completed and its writes are visible; the predecessor itself waited for its own
///     predecessor, so every earlier kernel is complete too);
///   - before pdl_wait() it may read only data no kernel of the stream writes (weights, a plan
///     uploaded by a copy before the launch) and write nothing;
///   - it may call pdl_launch_dependents() at any point: the next PDL kernel is scheduled once
///     every block of this one has called it or exited (it then waits in its own pdl_wait()).
/// A kernel launched without the attribute (PDL off, sm_80, or a plain <<<>>> launch) finds
/// pdl_wait() and pdl_launch_dependents() to be no-ops, and a non-PDL kernel after a PDL one is
/// ordered as usual.

#include <cuda_runtime.h>

#include <utility>

namespace pagoda::kernels::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// True when the current device is sm_90+ (asked once per process).
inline bool pdl_enabled() {
  static const bool on = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return major >= 9;
  }();
  return on;
}

/// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization when
/// pdl_enabled(). Returns the launch status.
template <typename... Params, typename... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                       cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace pagoda::kernels::cuda
