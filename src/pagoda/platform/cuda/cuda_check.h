#pragma once
/// cuda_status / cuda_check: the one conversion of a CUDA runtime error, for every module that
/// calls the runtime (platform/cuda, backends/cuda, model/cuda, dist): kInternal with the message
/// "<what> failed: <CUDA's message> (<error number>)". cuda_status returns it as a Status (paths
/// that must not throw: launches, graph replay); cuda_check throws it as an Error (API
/// boundaries). Header-only: a module needs the CUDA runtime's headers, not pagoda_platform_cuda.

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "pagoda/core/error.h"
#include "pagoda/core/status.h"

namespace pagoda::platform {

/// Status::ok() for cudaSuccess, else kInternal naming `what` and the error.
inline Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::ok();
  return Status(ErrorCode::kInternal, fmt::format("{} failed: {} ({})", what,
                                                  cudaGetErrorString(e), static_cast<int>(e)));
}

/// Throws cuda_status(e, what) as an Error when `e` is not cudaSuccess.
inline void cuda_check(cudaError_t e, const char* what) { cuda_status(e, what).throw_if_error(); }

}  // namespace pagoda::platform
