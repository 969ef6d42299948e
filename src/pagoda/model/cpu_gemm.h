#pragma once
/// Internal to the CPU ops (cpu_ops.cpp): the GEMMs of one CpuOps in a CpuGemm mode
/// (model_ops.h). OpenBLAS computes on the caller's f32 weights; the oneDNN and AMX modes keep one
/// packed copy per weight matrix (kernels/cpu/onednn_linear.h, amx_linear.h), made by prepare()
/// (at model load) or else on first use, keyed by (w, n, k), so the same array at another shape
/// (a vocabulary shard) is packed separately. A weight is f32 or, in the bf16 modes (onednn, amx),
/// bf16 bits (a checkpoint loaded with LoadOptions::keep_bf16): its WeightRef says which.
/// Thread rules: one thread (the ops' driver).

#include <cstdint>
#include <map>
#include <tuple>

#include "pagoda/kernels/cpu/amx_linear.h"
#include "pagoda/kernels/cpu/onednn_linear.h"
#include "pagoda/model/model_ops.h"

namespace pagoda::model {

/// A weight matrix [n, k] (HF [out, in]) as the runner reads it: f32, or bf16 bits.
struct WeightRef {
  WeightRef(const float* f32) : data(f32), bf16(false) {}      // NOLINT: implicit on purpose
  WeightRef(const uint16_t* bits) : data(bits), bf16(true) {}  // NOLINT: implicit on purpose
  WeightRef(const void* w, bool is_bf16) : data(w), bf16(is_bf16) {}
  const void* data;
  bool bf16;
};

class CpuGemmRunner {
 public:
  /// Throws Error(kUnsupported) with cpu_gemm_unavailable's reason.
  explicit CpuGemmRunner(CpuGemm gemm);
  /// Packs w [n, k] now (oneDNN modes; nothing with OpenBLAS or when already packed).
  void prepare(WeightRef w, int64_t n, int64_t k);
  /// y[m, n] = x[m, k] · w[n, k]ᵀ, f32 in and out. A bf16 w outside the bf16 modes throws
  /// Error(kInternal) (CpuOps widens such uploads instead).
  void linear(const float* x, WeightRef w, float* y, int64_t m, int64_t n, int64_t k);
  /// y[m, n] = (silu(g) * u)[m, k] · w[n, k]ᵀ with g, u the halves of gate_up [m, 2k] (f32), in
  /// the bf16 modes (onednn, amx) only: the SwiGLU product is rounded to bf16 straight into the
  /// GEMM's operand (ops.h silu_mul_bf16), no f32 intermediate. Returns false (nothing computed)
  /// in the other modes, whose callers run silu_mul + linear (their f32 math unchanged).
  bool swiglu_linear(const float* gate_up, WeightRef w, float* y, int64_t m, int64_t n, int64_t k);
  /// True in the modes whose GEMMs read bf16 weights (cpu_gemm_reads_bf16).
  bool reads_bf16() const { return cpu_gemm_reads_bf16(gemm_); }
  /// Bytes of the packed copies made so far (0 with OpenBLAS, which packs nothing).
  size_t packed_bytes() const;

 private:
  using Key = std::tuple<const void*, int64_t, int64_t>;
  /// The packed copy of (w, n, k), made now if there is none (oneDNN modes).
  kernels::cpu::OnednnLinear& packed(WeightRef w, int64_t n, int64_t k);
  /// The same for the amx mode.
  kernels::cpu::AmxLinear& packed_amx(WeightRef w, int64_t n, int64_t k);

  CpuGemm gemm_;
  std::map<Key, kernels::cpu::OnednnLinear> packed_;
  std::map<Key, kernels::cpu::AmxLinear> packed_amx_;
};

}  // namespace pagoda::model
