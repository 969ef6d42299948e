#pragma once
/// Compile-time dispatch of the tuned kernels over (q type, kv type, head dim).

#include <cuda_runtime_api.h>

#include "pagoda/kernels/cuda/device_utils.cuh"

namespace pagoda::kernels::cuda::detail {

/// Calls f.template operator()<T, KV, D>() for the matching instantiation; false when none.
template <typename F>
bool dispatch_fast(ElemType q, ElemType kv, int d, F&& f) {
  auto with_d = [&](auto t_tag, auto kv_tag) {
    using T = decltype(t_tag);
    using KV = decltype(kv_tag);
    switch (d) {
      case 64: f.template operator()<T, KV, 64>(); return true;
      case 128: f.template operator()<T, KV, 128>(); return true;
      case 256: f.template operator()<T, KV, 256>(); return true;
      default: return false;
    }
  };
  if (q == ElemType::kBF16) {
    if (kv == ElemType::kBF16) return with_d(__nv_bfloat16{}, __nv_bfloat16{});
    if (kv == ElemType::kE4M3) return with_d(__nv_bfloat16{}, E4M3{});
  } else if (q == ElemType::kF16) {
    if (kv == ElemType::kF16) return with_d(__half{}, __half{});
    if (kv == ElemType::kE4M3) return with_d(__half{}, E4M3{});
  }
  return false;
}



}  // namespace pagoda::kernels::cuda::detail
