// The CpuGemm modes (model_ops.h) and CpuGemmRunner (cpu_gemm.h).
#include "pagoda/model/cpu_gemm.h"

#include "pagoda/core/error.h"
#include "pagoda/model/ops.h"

namespace pagoda::model {

std::string_view cpu_gemm_name(CpuGemm gemm) {
  switch (gemm) {
    case CpuGemm::kOpenBlas: return "openblas";
    case CpuGemm::kOnednn: return "onednn";
    case CpuGemm::kOnednnF32: return "onednn-f32";
  }
  return "?";
}

std::optional<CpuGemm> parse_cpu_gemm(std::string_view name) {
  for (CpuGemm g : {CpuGemm::kOpenBlas, CpuGemm::kOnednn, CpuGemm::kOnednnF32})
    if (name == cpu_gemm_name(g)) return g;
  return std::nullopt;
}

std::string cpu_gemm_unavailable(CpuGemm gemm) {
  if (gemm == CpuGemm::kOpenBlas) return "";
  return kernels::cpu::onednn_linear_unavailable(gemm == CpuGemm::kOnednn ? DType::kBF16
                                                                          : DType::kF32);
}

CpuGemm auto_cpu_gemm() {
  return kernels::cpu::onednn_has_native_bf16() && cpu_gemm_unavailable(CpuGemm::kOnednn).empty()
             ? CpuGemm::kOnednn
             : CpuGemm::kOpenBlas;
}

CpuGemmRunner::CpuGemmRunner(CpuGemm gemm) : gemm_(gemm) {
  const std::string why = cpu_gemm_unavailable(gemm);
  PAGODA_REQUIRE(why.empty(), kUnsupported, "--cpu-gemm {}: {}", cpu_gemm_name(gemm), why);
}

kernels::cpu::OnednnLinear& CpuGemmRunner::packed(const float* w, int64_t n, int64_t k) {
  const auto key = std::make_tuple(w, n, k);
  auto it = packed_.find(key);
  if (it == packed_.end())
    it = packed_
             .emplace(key, kernels::cpu::OnednnLinear(
                               w, n, k, gemm_ == CpuGemm::kOnednn ? DType::kBF16 : DType::kF32))
             .first;
  return it->second;
}

void CpuGemmRunner::prepare(const float* w, int64_t n, int64_t k) {
  if (gemm_ != CpuGemm::kOpenBlas && n > 0 && k > 0) (void)packed(w, n, k);
}

void CpuGemmRunner::linear(const float* x, const float* w, float* y, int64_t m, int64_t n,
                           int64_t k) {
  if (gemm_ == CpuGemm::kOpenBlas) return model::linear(x, w, y, m, n, k);
  if (m == 0 || n == 0) return;
  packed(w, n, k).forward(x, y, m);
}

bool CpuGemmRunner::swiglu_linear(const float* gate_up, const float* w, float* y, int64_t m,
                                  int64_t n, int64_t k) {
  if (gemm_ != CpuGemm::kOnednn) return false;
  if (m == 0 || n == 0) return true;
  kernels::cpu::OnednnLinear& lin = packed(w, n, k);
  silu_mul_bf16(gate_up, static_cast<uint16_t*>(lin.input(m)), m, k);
  lin.forward_input(y, m);
  return true;
}

size_t CpuGemmRunner::packed_bytes() const {
  size_t bytes = 0;
  for (const auto& [key, lin] : packed_) bytes += lin.weight_bytes();
  return bytes;
}

}  // namespace pagoda::model
