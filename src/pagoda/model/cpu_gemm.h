#pragma once
/// Internal to the CPU ops (cpu_ops.cpp): the GEMMs of one CpuOps in a CpuGemm mode
/// (model_ops.h). OpenBLAS computes on the caller's f32 weights; the oneDNN modes keep one
/// packed copy per weight matrix (kernels/cpu/onednn_linear.h), made by prepare() (at model
/// load) or else on first use, keyed by (w, n, k), so the same array at another shape (a
/// vocabulary shard) is packed separately.
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
  /// Packs w [n, k] now (oneDNN modes; nothing with OpenBLAS or when already packed).
  void prepare(const float* w, int64_t n, int64_t k);
  /// y[m, n] = x[m, k] · w[n, k]ᵀ, f32 in and out (w: f32 HF [out, in]).
  void linear(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k);
  /// y[m, n] = (silu(g) * u)[m, k] · w[n, k]ᵀ with g, u the halves of gate_up [m, 2k] (f32), in
  /// the bf16 oneDNN mode only: the SwiGLU product is rounded to bf16 straight into the GEMM's
  /// operand (ops.h silu_mul_bf16), no f32 intermediate. Returns false (nothing computed) in the
  /// other modes, whose callers run silu_mul + linear (their f32 math unchanged).
  bool swiglu_linear(const float* gate_up, const float* w, float* y, int64_t m, int64_t n,
                     int64_t k);
  /// Bytes of the packed copies made so far (0 with OpenBLAS, which packs nothing).
  size_t packed_bytes() const;

 private:
  /// The packed copy of (w, n, k), made now if there is none (oneDNN modes).
  kernels::cpu::OnednnLinear& packed(const float* w, int64_t n, int64_t k);

  CpuGemm gemm_;
  std::map<std::tuple<const float*, int64_t, int64_t>, kernels::cpu::OnednnLinear> packed_;
};

}  // namespace pagoda::model
