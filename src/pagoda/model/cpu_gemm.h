#pragma once
/// Internal to the CPU ops (cpu_ops.cpp): the GEMMs of one CpuOps in a CpuGemm mode
/// (model_ops.h). OpenBLAS computes on the caller's f32 weights; the oneDNN modes keep one
/// packed copy per weight matrix (kernels/cpu/onednn_linear.h), made on first use and keyed by
/// (w, n, k), so the same array at another shape (a vocabulary shard) is packed separately.
/// Thread rules: one thread (the ops' driver).

#include <cstdint>
#include <map>
#include <tuple>

#include "pagoda/kernels/cpu/onednn_linear.h"
#include "pagoda/model/model_ops.h"

namespace pagoda::model {

class CpuGemmRunner {
 public:
  /// Throws Error(kUnsupported) with cpu_gemm_unavailable's reason.
  explicit CpuGemmRunner(CpuGemm gemm);
  /// y[m, n] = x[m, k] · w[n, k]ᵀ, f32 in and out (w: f32 HF [out, in]).
  void linear(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k);
  /// Bytes of the packed copies made so far (0 with OpenBLAS, which packs nothing).
  size_t packed_bytes() const;

 private:
  CpuGemm gemm_;
  std::map<std::tuple<const float*, int64_t, int64_t>, kernels::cpu::OnednnLinear> packed_;
};

}  // namespace pagoda::model
