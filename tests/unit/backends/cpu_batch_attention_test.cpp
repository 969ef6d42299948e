// CpuBatchAttention against the fp64 reference on random paged inputs: every dtype, page sizes,
// GQA/MQA/MLA, decode / extend / verify, causal / non-causal, window, soft cap, sinks, custom
// mask, split-KV, empty rows. Pages are permuted, unused KV slots are NaN, outputs are NaN before
// each run; every case prints its seed.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cpu_attention_case.h"
#include "pagoda/backends/cpu/cpu_batch_attention.h"
#include "pagoda/core/error.h"
#include "pagoda/kernels/cpu/tile_bf16.h"

namespace pagoda::backends {
namespace {

using attention::AttentionShape;
using attention::MaskKind;
using attention::PagedPlanInput;
using attention::RunParams;
using cpu_case::Case;
using cpu_case::run_case;

const DType kActDtypes[] = {DType::kF32, DType::kF16, DType::kBF16};
const DType kKvDtypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kFp8E4M3,
                           DType::kFp8E5M2};

TEST(CpuBatchAttention, DecodeAllDtypesAndPageSizes) {
  uint64_t seed = 100;
  for (DType kv : kKvDtypes) {
    for (DType qd : kActDtypes) {
      for (int ps : {1, 3, 16, 64}) {
        Case c{.seed = seed++, .bs = 5, .hq = 8, .hkv = 2, .dqk = 128, .dv = 128, .page_size = ps,
               .q_dtype = qd, .kv_dtype = kv, .out_dtype = qd, .max_prefix = 300};
        run_case(c);
      }
    }
  }
}

// The decode tests run with the opt-in AVX512-BF16 decode kernels off (the default) and on
// (CpuAttentionOptions::bf16_decode; on CPUs without AVX512-BF16 both runs take the f32 path).
TEST(CpuBatchAttention, DecodeHeadShapes) {
  for (const bool bf16_decode : {false, true}) {
    SCOPED_TRACE(bf16_decode ? "bf16_decode on" : "bf16_decode off");
    uint64_t seed = 200;
    struct S { int hq, hkv, d; };
    for (S s : {S{4, 4, 64}, S{8, 1, 128}, S{32, 8, 128}, S{6, 2, 256}, S{2, 1, 80}, S{3, 3, 40}}) {
      Case c{.seed = seed++, .bs = 3, .hq = s.hq, .hkv = s.hkv, .dqk = s.d, .dv = s.d,
             .page_size = 16, .out_dtype = DType::kF32, .max_prefix = 500,
             .options = {.num_threads = 2, .bf16_decode = bf16_decode}};
      run_case(c);
    }
  }
}

TEST(CpuBatchAttention, SplitKvLongContextSmallBatch) {
  for (const bool bf16_decode : {false, true}) {
    SCOPED_TRACE(bf16_decode ? "bf16_decode on" : "bf16_decode off");
    uint64_t seed = 300;
    for (int threads : {1, 2, 3}) {
      Case c{.seed = seed++, .bs = 1, .hq = 8, .hkv = 2, .dqk = 128, .dv = 128, .page_size = 16,
             .out_dtype = DType::kF32, .min_prefix = 2000, .max_prefix = 5000, .sinks = true,
             .options = {.num_threads = threads, .min_split_tokens = 64,
                         .bf16_decode = bf16_decode}};
      run_case(c);
    }
  }
}

TEST(CpuBatchAttention, ExtendCausalAndNonCausal) {
  uint64_t seed = 400;
  for (MaskKind m : {MaskKind::kCausal, MaskKind::kNonCausal}) {
    for (int ps : {1, 16}) {
      Case c{.seed = seed++, .bs = 3, .hq = 8, .hkv = 2, .dqk = 64, .dv = 64, .page_size = ps,
             .out_dtype = DType::kF32, .min_qo = 1, .max_qo = 70, .min_prefix = 0,
             .max_prefix = 120, .mask = m};
      run_case(c);
    }
  }
}

// The bf16 extend tile path (more than 16 rows per KV head, bf16 q/K/V; AVX512-BF16 CPUs only,
// the f32 path elsewhere): bf16 output (bf16 P·V) and f32 output (f32 P·V), GQA groups of 4 and
// 8, unequal head dims, odd key blocks (kv_block 48), window + cap + sinks, custom masks, and
// split-KV partials merged by LSE.
TEST(CpuBatchAttention, ExtendTilePath) {
  std::printf("AVX512-BF16 tile path %s\n",
              kernels::cpu::detail::cpu_avx512bf16_available() ? "on" : "off (not this CPU)");
  uint64_t seed = 450;
  for (DType out : {DType::kBF16, DType::kF32}) {
    for (int variant = 0; variant < 3; ++variant) {
      Case c{.seed = seed++, .bs = 2, .hq = variant == 1 ? 16 : 8, .hkv = 2,
             .dqk = variant == 2 ? 96 : 128, .dv = variant == 2 ? 64 : 128,
             .page_size = variant == 1 ? 1 : 16, .out_dtype = out, .min_qo = 17, .max_qo = 70,
             .max_prefix = 150, .custom_mask = variant == 2,
             .window_left = variant == 0 ? 30 : -1, .cap = variant == 0 ? 5.f : 0.f,
             .sinks = variant == 0,
             .options = {.num_threads = 2, .kv_block = 48, .min_split_tokens = 48,
                         .items_per_thread = variant == 1 ? 64 : 4}};  // variant 1: split-KV
      run_case(c);
    }
  }
}

// Decode items of many KV heads (rows_per_item 256: 128 rows of D = 32 per item) through the
// AVX512-BF16 decode path with a bf16 output (P pairs must fit the per-thread scratch).
TEST(CpuBatchAttention, DecodeWideItems) {
  std::printf("AVX512-BF16 decode path %s\n", kernels::cpu::detail::cpu_avx512bf16_available()
                                                   ? "runs with bf16_decode"
                                                   : "off (not this CPU)");
  for (const bool bf16_decode : {false, true}) {
    SCOPED_TRACE(bf16_decode ? "bf16_decode on" : "bf16_decode off");
    Case c{.seed = 470, .bs = 3, .hq = 128, .hkv = 32, .dqk = 32, .dv = 32, .page_size = 16,
           .max_prefix = 200,
           .options = {.num_threads = 2, .rows_per_item = 256, .bf16_decode = bf16_decode}};
    run_case(c);
  }
}

TEST(CpuBatchAttention, WindowCapSinksScales) {
  uint64_t seed = 500;
  for (int w : {0, 5, 40}) {
    for (float cap : {0.f, 5.f}) {
      Case c{.seed = seed++, .bs = 3, .hq = 4, .hkv = 2, .dqk = 128, .dv = 128, .page_size = 16,
             .kv_dtype = DType::kFp8E4M3, .out_dtype = DType::kF32, .min_qo = 1, .max_qo = 20,
             .max_prefix = 200, .window_left = w, .cap = cap, .sinks = true, .k_scale = 0.5f,
             .v_scale = 2.f};
      run_case(c);
    }
  }
}

TEST(CpuBatchAttention, CustomMaskVerify) {
  uint64_t seed = 600;
  for (int w : {-1, 7}) {
    Case c{.seed = seed++, .bs = 4, .hq = 8, .hkv = 2, .dqk = 128, .dv = 128, .page_size = 16,
           .out_dtype = DType::kF32, .min_qo = 4, .max_qo = 16, .max_prefix = 100,
           .custom_mask = true, .window_left = w};
    run_case(c);
  }
}

TEST(CpuBatchAttention, MlaStridedV) {
  uint64_t seed = 700;
  for (int hq : {16, 128}) {
    for (int qo : {1, 4}) {
      Case c{.seed = seed++, .bs = 2, .hq = hq, .hkv = 1, .dqk = 576, .dv = 512, .page_size = 64,
             .out_dtype = DType::kF32, .min_qo = qo, .max_qo = qo, .max_prefix = 300,
             .mla = true, .options = {.num_threads = 2, .min_split_tokens = 64}};
      run_case(c);
    }
  }
}

TEST(CpuBatchAttention, EmptyRowsAreZeroWithMinusInfLse) {
  Case c{.seed = 800, .bs = 3, .hq = 4, .hkv = 2, .dqk = 64, .dv = 64, .page_size = 4,
         .out_dtype = DType::kF32, .min_qo = 2, .max_qo = 5, .max_prefix = 30, .sinks = true,
         .empty_request = true};
  run_case(c);
  // Custom mask whose first byte is 0: query 0 of request 0 (kv <= 6 keys) sees nothing.
  Case d{.seed = 801, .bs = 2, .hq = 2, .hkv = 1, .dqk = 64, .dv = 64, .page_size = 1,
         .out_dtype = DType::kF32, .min_qo = 3, .max_qo = 6, .min_prefix = 0, .max_prefix = 0,
         .custom_mask = true};
  run_case(d);
}

TEST(CpuBatchAttention, RejectsBadInput) {
  auto cpu = make_cpu_batch_attention({.num_threads = 1});
  const std::vector<int32_t> qo{0, 1}, kvp{0, 1}, idx{0}, last{1};
  PagedPlanInput in{.qo_indptr = qo, .kv_indptr = kvp, .kv_indices = idx, .kv_last_page_len = last,
                    .page_size = 4};
  AttentionShape big{.num_qo_heads = 1, .num_kv_heads = 1, .head_dim_qk = 2048, .head_dim_v = 2048};
  try {
    cpu->plan(in, big);
    ADD_FAILURE() << "head dim 2048 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("1..1024"), std::string::npos) << e.what();
  }
  AttentionShape ok{.num_qo_heads = 2, .num_kv_heads = 1, .head_dim_qk = 64, .head_dim_v = 64};
  cpu->plan(in, ok);
  std::vector<uint16_t> qd(2 * 64), kd(4 * 64), od(2 * 64);
  std::vector<float> lse(2);
  const TensorView q(qd.data(), DType::kBF16, {1, 2, 64});
  const TensorView k(kd.data(), DType::kBF16, {1, 4, 1, 64});
  const TensorView out(od.data(), DType::kBF16, {1, 2, 64});
  const TensorView wrong_q(qd.data(), DType::kF16, {1, 2, 64});
  EXPECT_THROW(cpu->run(wrong_q, k, k, out, TensorView(), RunParams{}), Error);
  const std::vector<int32_t> far{5};
  PagedPlanInput in2 = in;
  in2.kv_indices = far;
  cpu->plan(in2, ok);
  try {
    cpu->run(q, k, k, out, TensorView(lse.data(), DType::kF32, {1, 2}), RunParams{});
    ADD_FAILURE() << "page 5 of a 1-page cache accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
  }
  EXPECT_THROW(make_cpu_batch_attention({.kv_block = 20}), Error);
}

TEST(CpuBatchAttention, RandomFeatureMix) {
  std::mt19937_64 meta(900);
  for (int iter = 0; iter < 24; ++iter) {
    Case c;
    c.seed = 1000 + iter;
    const int hkv = 1 + static_cast<int>(meta() % 3);
    c.hkv = hkv;
    c.hq = hkv * (1 + static_cast<int>(meta() % 5));
    c.dqk = c.dv = (1 + static_cast<int>(meta() % 4)) * 32;
    c.page_size = std::vector<int>{1, 2, 16, 64}[meta() % 4];
    c.q_dtype = kActDtypes[meta() % 3];
    c.out_dtype = kActDtypes[meta() % 3];
    c.kv_dtype = kKvDtypes[meta() % 5];
    c.bs = 1 + static_cast<int>(meta() % 4);
    c.max_qo = 1 + static_cast<int>(meta() % 33);
    c.max_prefix = static_cast<int>(meta() % 700);
    c.mask = meta() % 3 == 0 ? MaskKind::kNonCausal : MaskKind::kCausal;
    c.custom_mask = meta() % 4 == 0;
    c.window_left = meta() % 3 == 0 ? static_cast<int>(meta() % 64) : -1;
    c.cap = meta() % 3 == 0 ? 10.f : 0.f;
    c.sinks = meta() % 2 == 0;
    c.options = {.num_threads = 1 + static_cast<int>(meta() % 2),
                 .kv_block = 16 * (1 + static_cast<int>(meta() % 4)),
                 .min_split_tokens = 32};
    run_case(c);
  }
}

}  // namespace
}  // namespace pagoda::backends
