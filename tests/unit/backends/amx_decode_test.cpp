// The amx backend's decode kernel (kernels/cpu/amx_decode.h) through CpuBatchAttention with
// amx_decode on, against the fp64 reference (cpu_attention_case.h: permuted pages, NaN in every
// unused KV slot and output): page sizes 1 / 5 / 16 / 64 (strided tile loads and gathered
// blocks), GQA groups 1 to 16 rows per KV head, head dims 64 / 96 / 128 / 256, key counts that end
// inside a block, bf16 and f32 outputs with LSE, sinks and k/v scales, empty requests and split-KV
// partials; plus the eligibility contract. Skipped (with the reason printed) without AMX.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cpu_attention_case.h"
#include "pagoda/kernels/cpu/amx_decode.h"
#include "pagoda/kernels/cpu/amx_tile.h"

namespace pagoda::backends {
namespace {

using cpu_case::Case;
using cpu_case::run_case;

/// P·V runs on bf16 probabilities: an f32 output is as exact as P's rounding (2^-9 relative).
constexpr float kF32Tol = 4e-3f;

bool skip_without_amx() {
  if (kernels::cpu::detail::amx_tiles_available()) return false;
  std::printf("AMX decode tests skipped: this CPU (or OS) offers no AMX bf16 tiles\n");
  return true;
}

TEST(AmxDecode, PageSizesAndHeadShapes) {
  if (skip_without_amx()) GTEST_SKIP() << "no AMX bf16 tiles on this CPU";
  uint64_t seed = 4100;
  struct S { int hq, hkv, d; };
  for (int ps : {1, 5, 16, 64}) {
    for (S s : {S{32, 8, 128}, S{8, 1, 128}, S{16, 1, 64}, S{4, 4, 64}, S{6, 2, 256},
                S{12, 4, 96}}) {
      for (DType out : {DType::kBF16, DType::kF32}) {
        Case c{.seed = seed++, .bs = 4, .hq = s.hq, .hkv = s.hkv, .dqk = s.d, .dv = s.d,
               .page_size = ps, .out_dtype = out, .max_prefix = 700,
               .tol = out == DType::kF32 ? kF32Tol : 0.f,
               .options = {.num_threads = 2, .amx_decode = true}};
        run_case(c);
      }
    }
  }
}

TEST(AmxDecode, SplitKvSinksScalesAndEmptyRequests) {
  if (skip_without_amx()) GTEST_SKIP() << "no AMX bf16 tiles on this CPU";
  uint64_t seed = 4200;
  for (int threads : {1, 2, 3}) {
    Case c{.seed = seed++, .bs = 2, .hq = 16, .hkv = 2, .dqk = 128, .dv = 128, .page_size = 16,
           .out_dtype = DType::kF32, .min_prefix = 2000, .max_prefix = 5000, .sinks = true,
           .k_scale = 0.5f, .v_scale = 2.f, .empty_request = true, .tol = kF32Tol,
           .options = {.num_threads = threads, .min_split_tokens = 64, .amx_decode = true}};
    run_case(c);
  }
  // Non-causal decode rows and a split that ends inside a 16-key block (kv_block 48).
  Case d{.seed = seed++, .bs = 3, .hq = 8, .hkv = 2, .dqk = 64, .dv = 64, .page_size = 3,
         .out_dtype = DType::kF32, .min_prefix = 100, .max_prefix = 900,
         .mask = attention::MaskKind::kNonCausal, .tol = kF32Tol,
         .options = {.num_threads = 2, .kv_block = 48, .min_split_tokens = 48,
                     .amx_decode = true}};
  run_case(d);
}

// Items the kernel does not take run on the SIMD kernels, in the same step as those it takes (an
// extend's split-KV chunks that every row sees): 17+ rows per KV head, extends whose rows see
// different keys, windows, soft caps, f32 KV.
TEST(AmxDecode, IneligibleItemsFallBack) {
  if (skip_without_amx()) GTEST_SKIP() << "no AMX bf16 tiles on this CPU";
  uint64_t seed = 4300;
  const CpuAttentionOptions amx{.num_threads = 2, .amx_decode = true};
  run_case({.seed = seed++, .hq = 34, .hkv = 2, .dqk = 128, .dv = 128, .out_dtype = DType::kF32,
            .max_prefix = 300, .tol = kF32Tol, .options = amx});
  run_case({.seed = seed++, .hq = 8, .hkv = 2, .out_dtype = DType::kF32, .min_qo = 2,
            .max_qo = 9, .max_prefix = 300, .tol = kF32Tol, .options = amx});
  run_case({.seed = seed++, .hq = 8, .hkv = 2, .out_dtype = DType::kF32, .max_prefix = 300,
            .window_left = 40, .cap = 5.f, .tol = kF32Tol, .options = amx});
  run_case({.seed = seed++, .hq = 8, .hkv = 2, .kv_dtype = DType::kF32, .out_dtype = DType::kF32,
            .max_prefix = 300, .options = amx});
}

// The contract of amx_decode_eligible on one decode item (request 0: one query, 100 keys).
TEST(AmxDecode, Eligibility) {
  if (skip_without_amx()) GTEST_SKIP() << "no AMX bf16 tiles on this CPU";
  using kernels::cpu::CpuAttentionParams;
  using kernels::cpu::CpuMask;
  using kernels::cpu::CpuWorkItem;
  namespace kd = kernels::cpu::detail;
  const std::vector<int32_t> qo{0, 1}, kv_len{100};
  CpuAttentionParams p;
  p.num_qo_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim_qk = p.head_dim_v = 128;
  p.qo_indptr = qo.data();
  p.kv_len = kv_len.data();
  p.amx_decode = true;
  const CpuWorkItem it{.kv_head_end = 8, .group_end = 4, .q_end = 1, .kv_end = 100};
  EXPECT_TRUE(kd::amx_decode_eligible(p, it));
  auto with = [&](auto change) {
    CpuAttentionParams q = p;
    change(q);
    return kd::amx_decode_eligible(q, it);
  };
  EXPECT_FALSE(with([](CpuAttentionParams& q) { q.amx_decode = false; }));
  EXPECT_FALSE(with([](CpuAttentionParams& q) { q.window_left = 10; }));
  EXPECT_FALSE(with([](CpuAttentionParams& q) { q.logit_cap = 5.f; }));
  EXPECT_FALSE(with([](CpuAttentionParams& q) { q.mask = CpuMask::kCustom; }));
  EXPECT_FALSE(with([](CpuAttentionParams& q) { q.k.dtype = DType::kF32; }));
  EXPECT_FALSE(with([](CpuAttentionParams& q) { q.head_dim_qk = q.head_dim_v = 80; }));
  EXPECT_FALSE(with([](CpuAttentionParams& q) { q.head_dim_v = 64; }));
  CpuWorkItem wide = it;
  wide.group_end = 17;  // 17 rows per KV head
  EXPECT_FALSE(kd::amx_decode_eligible(p, wide));
  // An extend of 2 queries on 100 keys: query 0 does not see key 99 (causal), query 1 does.
  const std::vector<int32_t> qo2{0, 2};
  CpuAttentionParams e = p;
  e.qo_indptr = qo2.data();
  const CpuWorkItem first{.kv_head_end = 8, .group_end = 4, .q_end = 1, .kv_end = 100};
  const CpuWorkItem second{.kv_head_end = 8, .group_end = 4, .q_begin = 1, .q_end = 2,
                           .kv_end = 100};
  EXPECT_FALSE(kd::amx_decode_eligible(e, first));
  EXPECT_TRUE(kd::amx_decode_eligible(e, second));
  e.mask = CpuMask::kNone;
  EXPECT_TRUE(kd::amx_decode_eligible(e, first));
}

}  // namespace
}  // namespace pagoda::backends
