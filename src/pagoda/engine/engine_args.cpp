#include "pagoda/engine/engine_args.h"

#include "pagoda/core/error.h"

namespace pagoda::engine {

std::optional<DType> parse_dtype_arg(const std::string& value, std::string_view flag) {
  if (value.empty() || value == "auto") return std::nullopt;
  const std::optional<DType> t = parse_dtype(value);
  PAGODA_REQUIRE(t.has_value() && dtype_is_float(*t), kInvalidArgument,
                 "{} must be auto, f32, f16, bf16, fp8_e4m3 or fp8_e5m2 (got '{}')", flag, value);
  return t;
}

std::unique_ptr<platform::Platform> make_platform(const EngineArgs& args) {
  return make_platform_for(args.backend);
}

EngineConfig make_engine_config(const EngineArgs& a, const platform::Platform& platform) {
  PAGODA_REQUIRE(a.policy == "fcfs" || a.policy == "lpm", kInvalidArgument,
                 "--policy must be fcfs or lpm (got '{}')", a.policy);
  PAGODA_REQUIRE(a.page_size >= 1, kInvalidArgument, "--page-size must be >= 1 (got {})",
                 a.page_size);
  const bool from_memory = a.kv_cache_memory != 0 || a.mem_fraction_static != 0;
  PAGODA_REQUIRE(!from_memory || a.pool_tokens == 0, kInvalidArgument,
                 "--pool-tokens {} with --kv-cache-memory / --mem-fraction-static: give one KV "
                 "pool size",
                 a.pool_tokens);
  PAGODA_REQUIRE(a.kv_cache_memory == 0 || a.mem_fraction_static == 0, kInvalidArgument,
                 "--kv-cache-memory and --mem-fraction-static both given: give one");
  PAGODA_REQUIRE(from_memory || a.pool_tokens >= a.page_size, kInvalidArgument,
                 "--pool-tokens must hold at least one page of {} tokens (got {})", a.page_size,
                 a.pool_tokens);
  PAGODA_REQUIRE(a.kv_cache_memory >= 0, kInvalidArgument,
                 "--kv-cache-memory must be >= 0 bytes (got {})", a.kv_cache_memory);
  PAGODA_REQUIRE(a.mem_fraction_static >= 0 && a.mem_fraction_static < 1, kInvalidArgument,
                 "--mem-fraction-static must be in (0, 1) (got {})", a.mem_fraction_static);
  PAGODA_REQUIRE(a.swa_full_tokens_ratio > 0 && a.swa_full_tokens_ratio <= 1, kInvalidArgument,
                 "--swa-full-tokens-ratio must be in (0, 1] (got {})", a.swa_full_tokens_ratio);
  PAGODA_REQUIRE(a.max_running >= 1, kInvalidArgument, "--max-running must be >= 1 (got {})",
                 a.max_running);
  PAGODA_REQUIRE(a.chunk_size >= 0 && a.chunk_size % a.page_size == 0, kInvalidArgument,
                 "--chunk-size must be 0 (off) or a multiple of --page-size {} (got {})",
                 a.page_size, a.chunk_size);
  PAGODA_REQUIRE(a.max_prefill_tokens >= 1, kInvalidArgument,
                 "--max-prefill-tokens must be >= 1 (got {})", a.max_prefill_tokens);
  PAGODA_REQUIRE(a.max_context_len >= 0, kInvalidArgument,
                 "--max-context-len must be >= 0 (got {})", a.max_context_len);
  PAGODA_REQUIRE(a.swa_pool == "auto" || a.swa_pool == "on" || a.swa_pool == "off",
                 kInvalidArgument, "--swa-pool must be auto, on or off (got '{}')", a.swa_pool);
  PAGODA_REQUIRE(a.swa_pool_tokens >= 0, kInvalidArgument,
                 "--swa-pool-tokens must be >= 0 (got {})", a.swa_pool_tokens);
  PAGODA_REQUIRE(a.max_mamba_cache_size >= 0, kInvalidArgument,
                 "--max-mamba-cache-size must be >= 0 (got {})", a.max_mamba_cache_size);
  EngineConfig cfg;
  cfg.page_size = a.page_size;
  cfg.pool_tokens = a.pool_tokens;
  cfg.kv_cache_memory = a.kv_cache_memory;
  cfg.mem_fraction_static = a.mem_fraction_static;
  cfg.swa_full_tokens_ratio = a.swa_full_tokens_ratio;
  cfg.max_context_len = a.max_context_len;
  cfg.radix_cache = a.radix_cache;
  cfg.swa_pool = a.swa_pool == "on"    ? SwaPoolMode::kOn
                 : a.swa_pool == "off" ? SwaPoolMode::kOff
                                       : SwaPoolMode::kAuto;
  cfg.swa_pool_tokens = a.swa_pool_tokens;
  cfg.max_mamba_cache_size = a.max_mamba_cache_size;
  cfg.cuda_graph = a.cuda_graph;
  PAGODA_REQUIRE(a.mla_prefill == "auto" || a.mla_prefill == "absorbed", kInvalidArgument,
                 "--mla-prefill '{}': use auto or absorbed", a.mla_prefill);
  cfg.mla_prefill =
      a.mla_prefill == "absorbed" ? model::MlaPrefill::kAbsorbed : model::MlaPrefill::kAuto;
  PAGODA_REQUIRE(a.mla_window_keys >= 0, kInvalidArgument,
                 "--mla-window-keys {}: a key count (0: what 1 GiB of key scratch holds)",
                 a.mla_window_keys);
  cfg.mla_window_keys = a.mla_window_keys;
  cfg.overlap = a.overlap;
  cfg.dtype = parse_dtype_arg(a.dtype, "--dtype");
  cfg.kv_dtype = parse_dtype_arg(a.kv_dtype, "--kv-dtype");
  cfg.cpu_gemm = cpu_gemm_of(a, platform);
  cfg.scheduler.max_running_requests = a.max_running;
  cfg.scheduler.chunk_size = a.chunk_size;
  cfg.scheduler.max_prefill_tokens = a.max_prefill_tokens;
  cfg.scheduler.mixed_batches = a.mixed_batches;
  cfg.scheduler.policy =
      a.policy == "lpm" ? SchedulePolicy::kLongestPrefixMatch : SchedulePolicy::kFcfs;
  cfg.backend = a.backend;
  if (a.backend.attention.empty() && a.backend.prefill.empty() && a.backend.decode.empty())
    cfg.backend.attention = default_backend_name(platform);
  cfg.hicache = a.hicache;
  cfg.validate();
  return cfg;
}

model::CpuGemm cpu_gemm_of(const EngineArgs& a, const platform::Platform& platform) {
  const bool on_cpu = platform.kind() == platform::PlatformKind::kCpu;
  if (a.cpu_gemm == "auto") return on_cpu ? model::auto_cpu_gemm() : model::CpuGemm::kOpenBlas;
  const std::optional<model::CpuGemm> g = model::parse_cpu_gemm(a.cpu_gemm);
  PAGODA_REQUIRE(g.has_value(), kInvalidArgument,
                 "--cpu-gemm must be openblas, onednn, onednn-f32, amx or auto (got '{}')",
                 a.cpu_gemm);
  PAGODA_REQUIRE(on_cpu || *g == model::CpuGemm::kOpenBlas, kInvalidArgument,
                 "--cpu-gemm {} is for the CPU model; this engine runs on platform '{}'",
                 a.cpu_gemm, platform.name());
  return *g;
}

model::LoadOptions load_options(const EngineArgs& args, const platform::Platform& platform,
                                bool tensor_parallel) {
  const bool cuda = platform.kind() == platform::PlatformKind::kCuda;
  return {.keep_bf16 = !tensor_parallel &&
                       (cuda || model::cpu_gemm_reads_bf16(cpu_gemm_of(args, platform)))};
}

}  // namespace pagoda::engine
