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
    case CpuGemm::kAmx: return "amx";
  }
  return "?";
}

std::optional<CpuGemm> parse_cpu_gemm(std::string_view name) {
  for (CpuGemm g : {CpuGemm::kOpenBlas, CpuGemm::kOnednn, CpuGemm::kOnednnF32, CpuGemm::kAmx})
    if (name == cpu_gemm_name(g)) return g;
  return std::nullopt;
}

std::string cpu_gemm_unavailable(CpuGemm gemm) {
  if (gemm == CpuGemm::kOpenBlas) return "";
  if (gemm == CpuGemm::kAmx) return kernels::cpu::amx_linear_unavailable();
  return kernels::cpu::onednn_linear_unavailable(gemm == CpuGemm::kOnednn ? DType::kBF16
                                                                          : DType::kF32);
}

CpuGemm auto_cpu_gemm() {
  if (cpu_gemm_unavailable(CpuGemm::kAmx).empty()) return CpuGemm::kAmx;
  return kernels::cpu::onednn_has_native_bf16() && cpu_gemm_unavailable(CpuGemm::kOnednn).empty()
             ? CpuGemm::kOnednn
             : CpuGemm::kOpenBlas;
}

bool cpu_gemm_reads_bf16(CpuGemm gemm) {
  return gemm == CpuGemm::kOnednn || gemm == CpuGemm::kAmx;
}

CpuGemmRunner::CpuGemmRunner(CpuGemm gemm) : gemm_(gemm) {
  const std::string why = cpu_gemm_unavailable(gemm);
  PAGODA_REQUIRE(why.empty(), kUnsupported, "--cpu-gemm {}: {}", cpu_gemm_name(gemm), why);
}

namespace {

/// The packed copy of (w, n, k) in `cache`, made by `make` if there is none.
template <typename Map, typename Make>
auto& find_or_pack(Map& cache, WeightRef w, int64_t n, int64_t k, Make make) {
  const auto key = std::make_tuple(w.data, n, k);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make()).first;
  return it->second;
}

}  // namespace

kernels::cpu::OnednnLinear& CpuGemmRunner::packed(WeightRef w, int64_t n, int64_t k) {
  return find_or_pack(packed_, w, n, k, [&] {
    using kernels::cpu::OnednnLinear;
    if (!w.bf16)
      return OnednnLinear(static_cast<const float*>(w.data), n, k,
                          gemm_ == CpuGemm::kOnednn ? DType::kBF16 : DType::kF32);
    PAGODA_REQUIRE(gemm_ == CpuGemm::kOnednn, kInternal, "bf16 weights in --cpu-gemm {}",
                   cpu_gemm_name(gemm_));
    return OnednnLinear(static_cast<const uint16_t*>(w.data), n, k);
  });
}

kernels::cpu::AmxLinear& CpuGemmRunner::packed_amx(WeightRef w, int64_t n, int64_t k) {
  return find_or_pack(packed_amx_, w, n, k, [&] {
    using kernels::cpu::AmxLinear;
    return w.bf16 ? AmxLinear(static_cast<const uint16_t*>(w.data), n, k)
                  : AmxLinear(static_cast<const float*>(w.data), n, k);
  });
}

void CpuGemmRunner::prepare(WeightRef w, int64_t n, int64_t k) {
  if (gemm_ == CpuGemm::kOpenBlas || n <= 0 || k <= 0) return;
  if (gemm_ == CpuGemm::kAmx) {
    (void)packed_amx(w, n, k);
  } else {
    (void)packed(w, n, k);
  }
}

void CpuGemmRunner::linear(const float* x, WeightRef w, float* y, int64_t m, int64_t n, int64_t k) {
  if (gemm_ == CpuGemm::kOpenBlas) {
    PAGODA_REQUIRE(!w.bf16, kInternal, "bf16 weights in --cpu-gemm openblas");
    return model::linear(x, static_cast<const float*>(w.data), y, m, n, k);
  }
  if (m == 0 || n == 0) return;
  if (gemm_ == CpuGemm::kAmx) return packed_amx(w, n, k).forward(x, y, m);
  packed(w, n, k).forward(x, y, m);
}

bool CpuGemmRunner::swiglu_linear(const float* gate_up, WeightRef w, float* y, int64_t m, int64_t n,
                                  int64_t k) {
  if (gemm_ != CpuGemm::kOnednn && gemm_ != CpuGemm::kAmx) return false;
  if (m == 0 || n == 0) return true;
  if (gemm_ == CpuGemm::kAmx) {
    kernels::cpu::AmxLinear& lin = packed_amx(w, n, k);
    silu_mul_bf16(gate_up, lin.input(m), m, k, lin.input_ld());
    lin.forward_input(y, m);
    return true;
  }
  kernels::cpu::OnednnLinear& lin = packed(w, n, k);
  silu_mul_bf16(gate_up, static_cast<uint16_t*>(lin.input(m)), m, k);
  lin.forward_input(y, m);
  return true;
}

size_t CpuGemmRunner::packed_bytes() const {
  size_t bytes = 0;
  for (const auto& [key, lin] : packed_) bytes += lin.weight_bytes();
  for (const auto& [key, lin] : packed_amx_) bytes += lin.weight_bytes();
  return bytes;
}

}  // namespace pagoda::model
