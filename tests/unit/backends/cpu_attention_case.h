#pragma once
// The random paged-attention case of the CPU kernel tests (cpu_batch_attention_test.cpp,
// amx_decode_test.cpp): random requests on permuted pages, NaN in every unused KV slot and in the
// outputs before each run, the fp64 reference backend as the oracle; run twice on one plan.
#include <cstdint>
#include <string>

#include "pagoda/attention/batch_attention.h"
#include "pagoda/backends/cpu/cpu_batch_attention.h"
#include "pagoda/core/dtype.h"

namespace pagoda::backends::cpu_case {

struct Case {
  uint64_t seed = 1;
  int bs = 2;
  int hq = 4, hkv = 2, dqk = 64, dv = 64;
  int page_size = 16;
  DType q_dtype = DType::kBF16, kv_dtype = DType::kBF16, out_dtype = DType::kBF16;
  int min_qo = 1, max_qo = 1;  ///< query rows per request
  int min_prefix = 0, max_prefix = 100;  ///< keys before the queries
  attention::MaskKind mask = attention::MaskKind::kCausal;
  bool custom_mask = false;
  bool mla = false;  ///< V is a strided view of K's latent rows (Hkv must be 1)
  int window_left = -1;
  float cap = 0.f;
  bool sinks = false;
  float k_scale = 1.f, v_scale = 1.f;
  bool empty_request = false;  ///< add a request without keys (its rows must be 0 / -inf)
  /// Relative output tolerance; 0: by output dtype (f32 2e-4, f16 2e-3, bf16 1.6e-2).
  float tol = 0.f;
  CpuAttentionOptions options{.num_threads = 2};
};

std::string describe(const Case& c);

/// Runs c on CpuBatchAttention(c.options) and the reference; gtest failures name the first bad
/// outputs and LSEs (SCOPED_TRACE: describe(c), the seed included).
void run_case(const Case& c);

}  // namespace pagoda::backends::cpu_case
