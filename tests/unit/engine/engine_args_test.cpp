// EngineArgs → EngineConfig (engine_args.h): random valid arguments land field by field in the
// config; every bad value is an Error naming its flag; an unknown backend is kUnsupported.
#include <gtest/gtest.h>

#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/engine/engine_args.h"
#include "test_seed.h"

namespace pagoda::engine {
namespace {

/// The error code and message of make_engine_config(args) (no code when it converts).
std::pair<std::optional<ErrorCode>, std::string> convert_error(const EngineArgs& args) {
  auto platform = make_platform(args);
  try {
    make_engine_config(args, *platform);
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
  return {std::nullopt, ""};
}

TEST(EngineArgs, RandomValidArgsLandInTheConfig) {
  const testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  const std::vector<std::pair<std::string, std::optional<DType>>> dtypes = {
      {"auto", std::nullopt}, {"", std::nullopt}, {"f32", DType::kF32},
      {"bf16", DType::kBF16}, {"f16", DType::kF16}};
  for (int i = 0; i < 200; ++i) {
    EngineArgs a;
    const int32_t page_sizes[] = {1, 16, 32, 64};
    a.page_size = page_sizes[rng() % 4];
    a.pool_tokens = a.page_size * static_cast<int64_t>(1 + rng() % 4096);
    a.max_running = static_cast<int32_t>(1 + rng() % 256);
    a.chunk_size = a.page_size * static_cast<int32_t>(rng() % 64);
    a.max_prefill_tokens = static_cast<int32_t>(1 + rng() % 16384);
    a.policy = rng() % 2 ? "lpm" : "fcfs";
    const auto& [dtype_name, dtype] = dtypes[rng() % dtypes.size()];
    const auto& [kv_name, kv_dtype] = dtypes[rng() % dtypes.size()];
    a.dtype = dtype_name;
    a.kv_dtype = kv_name;
    a.cuda_graph = rng() % 2;
    a.overlap = rng() % 2;
    a.radix_cache = rng() % 2;
    a.mixed_batches = rng() % 2;
    a.max_context_len = static_cast<int32_t>(rng() % 8192);
    a.max_mamba_cache_size = static_cast<int32_t>(rng() % 300);
    if (rng() % 2) a.backend.attention = "reference";
    auto platform = make_platform(a);
    const EngineConfig c = make_engine_config(a, *platform);
    EXPECT_EQ(c.page_size, a.page_size);
    EXPECT_EQ(c.pool_tokens, a.pool_tokens);
    EXPECT_EQ(c.scheduler.max_running_requests, a.max_running);
    EXPECT_EQ(c.scheduler.chunk_size, a.chunk_size);
    EXPECT_EQ(c.scheduler.max_prefill_tokens, a.max_prefill_tokens);
    EXPECT_EQ(c.scheduler.policy, a.policy == "lpm" ? SchedulePolicy::kLongestPrefixMatch
                                                    : SchedulePolicy::kFcfs);
    EXPECT_EQ(c.dtype, dtype);
    EXPECT_EQ(c.kv_dtype, kv_dtype);
    EXPECT_EQ(c.cuda_graph, a.cuda_graph);
    EXPECT_EQ(c.overlap, a.overlap);
    EXPECT_EQ(c.radix_cache, a.radix_cache);
    EXPECT_EQ(c.scheduler.mixed_batches, a.mixed_batches);
    EXPECT_EQ(c.max_context_len, a.max_context_len);
    EXPECT_EQ(c.max_mamba_cache_size, a.max_mamba_cache_size);
    // No backend named: the platform's default; else the one named.
    EXPECT_EQ(c.backend.attention, a.backend.attention.empty() ? default_backend_name(*platform)
                                                               : a.backend.attention);
  }
}

TEST(EngineArgs, EveryBadValueNamesItsFlag) {
  struct Case {
    const char* flag;
    void (*set)(EngineArgs&);
  };
  const Case cases[] = {
      {"--page-size", [](EngineArgs& a) { a.page_size = 0; }},
      {"--pool-tokens", [](EngineArgs& a) { a.pool_tokens = a.page_size - 1; }},
      {"--max-running", [](EngineArgs& a) { a.max_running = 0; }},
      {"--chunk-size", [](EngineArgs& a) { a.chunk_size = a.page_size + 1; }},
      {"--chunk-size", [](EngineArgs& a) { a.chunk_size = -16; }},
      {"--max-prefill-tokens", [](EngineArgs& a) { a.max_prefill_tokens = 0; }},
      {"--policy", [](EngineArgs& a) { a.policy = "lifo"; }},
      {"--dtype", [](EngineArgs& a) { a.dtype = "f99"; }},
      {"--dtype", [](EngineArgs& a) { a.dtype = "i32"; }},
      {"--kv-dtype", [](EngineArgs& a) { a.kv_dtype = "int4"; }},
      {"--max-context-len", [](EngineArgs& a) { a.max_context_len = -1; }},
      {"--max-mamba-cache-size", [](EngineArgs& a) { a.max_mamba_cache_size = -2; }},
      {"--cpu-gemm", [](EngineArgs& a) { a.cpu_gemm = "mkl"; }},
      {"--pool-tokens", [](EngineArgs& a) { a.kv_cache_memory = int64_t{1} << 30; }},
      {"--mem-fraction-static", [](EngineArgs& a) {
         a.pool_tokens = 0;
         a.mem_fraction_static = 1.0;
       }},
      {"--mem-fraction-static", [](EngineArgs& a) {
         a.pool_tokens = 0;
         a.kv_cache_memory = int64_t{1} << 30;
         a.mem_fraction_static = 0.5;
       }},
      {"--kv-cache-memory", [](EngineArgs& a) {
         a.pool_tokens = 0;
         a.kv_cache_memory = -1;
       }},
      {"--swa-full-tokens-ratio", [](EngineArgs& a) { a.swa_full_tokens_ratio = 0; }},
  };
  for (const Case& c : cases) {
    EngineArgs a;
    c.set(a);
    const auto [code, message] = convert_error(a);
    EXPECT_EQ(code, ErrorCode::kInvalidArgument) << c.flag << ": " << message;
    EXPECT_NE(message.find(c.flag), std::string::npos) << message;
  }
  EngineArgs a;
  a.backend.decode = "nosuch";
  const auto [code, message] = convert_error(a);
  EXPECT_EQ(code, ErrorCode::kUnsupported);
  EXPECT_NE(message.find("'nosuch'"), std::string::npos) << message;
  a = EngineArgs{};
  a.hicache.host.ratio = 2;
  a.radix_cache = false;  // the hierarchical cache needs the radix cache
  EXPECT_EQ(convert_error(a).first, ErrorCode::kInvalidArgument);
}

// --cpu-gemm: each mode lands in the config where it can run and is refused (kUnsupported,
// naming the flag and the reason) where it cannot; auto follows oneDNN's native bf16. On the
// CPU platform (the reference backend's) also in a CUDA build on a GPU machine, whose default
// platform refuses every mode but openblas (the Xeon run at add2600 failed here).
TEST(EngineArgs, CpuGemmModes) {
  for (model::CpuGemm g :
       {model::CpuGemm::kOpenBlas, model::CpuGemm::kOnednn, model::CpuGemm::kOnednnF32,
        model::CpuGemm::kAmx}) {
    EngineArgs a;
    a.backend.attention = "reference";
    a.cpu_gemm = std::string(model::cpu_gemm_name(g));
    const std::string why = model::cpu_gemm_unavailable(g);
    if (why.empty()) {
      auto platform = make_platform(a);
      EXPECT_EQ(make_engine_config(a, *platform).cpu_gemm, g) << a.cpu_gemm;
    } else {
      const auto [code, message] = convert_error(a);
      EXPECT_EQ(code, ErrorCode::kUnsupported) << message;
      EXPECT_NE(message.find("--cpu-gemm " + a.cpu_gemm), std::string::npos) << message;
      EXPECT_NE(message.find(why), std::string::npos) << message;
    }
    // A bf16 checkpoint stays bf16 for the modes whose GEMMs read bf16, on one rank.
    auto platform = make_platform(a);
    EXPECT_EQ(load_options(a, *platform, false).keep_bf16,
              g == model::CpuGemm::kOnednn || g == model::CpuGemm::kAmx)
        << a.cpu_gemm;
    EXPECT_FALSE(load_options(a, *platform, true).keep_bf16) << a.cpu_gemm;
  }
  EngineArgs a;
  a.backend.attention = "reference";
  a.cpu_gemm = "auto";
  auto platform = make_platform(a);
  EXPECT_EQ(make_engine_config(a, *platform).cpu_gemm, model::auto_cpu_gemm());
}

}  // namespace
}  // namespace pagoda::engine
