#pragma once
/// cuda_check: a CUDA runtime error as Error(kInternal) naming the call and CUDA's message.

#include <cuda_runtime.h>

#include "pagoda/core/error.h"

namespace pagoda::platform {

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw_error(ErrorCode::kInternal, "{}: {}", what, cudaGetErrorString(e));
}

}  // namespace pagoda::platform
