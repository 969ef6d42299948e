#pragma once
/// EngineArgs: the engine settings a user gives, one struct for every front end: the flags of
/// `pagoda serve`, `bench` and `generate` (cli/engine_options.h registers them, with the same
/// names: --page-size → page_size) and pagoda.LLM / pagoda.serve (python/engine_bindings.cpp).
/// make_engine_config is the one conversion to an EngineConfig; it validates everything and
/// names the flag of a bad value. Front ends set their own defaults before parsing (serve: a
/// 65,536-token pool; bench: 12,288 and lpm; generate: a pool sized to its prompts).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "pagoda/backends/builtin.h"
#include "pagoda/core/dtype.h"
#include "pagoda/engine/engine.h"
#include "pagoda/model/safetensors.h"
#include "pagoda/platform/platform.h"
#include "pagoda/tier/config.h"

namespace pagoda::engine {

struct EngineArgs {
  /// --backend / --prefill-backend / --decode-backend (empty: the platform's default),
  /// --linear-backend (a hybrid model's Mamba2 layers; empty: --backend's) and --kernel-option
  /// (backends/kernel_options.h).
  backends::BackendSelection backend{};
  int32_t page_size = 16;          ///< --page-size
  /// --pool-tokens: KV pool capacity; 0 when the pool is sized from memory (the next two).
  int64_t pool_tokens = 32768;
  int64_t kv_cache_memory = 0;       ///< --kv-cache-memory: the KV pools' bytes (0: not given)
  double mem_fraction_static = 0;    ///< --mem-fraction-static (0: not given)
  double swa_full_tokens_ratio = 0.8;  ///< --swa-full-tokens-ratio
  int32_t max_running = 64;        ///< --max-running: running requests at most
  int32_t chunk_size = 0;          ///< --chunk-size: chunked prefill budget (0 = off)
  int32_t max_prefill_tokens = 8192;  ///< --max-prefill-tokens: one prefill batch without chunks
  std::string policy = "fcfs";     ///< --policy: fcfs | lpm (longest prefix match)
  std::string dtype = "auto";      ///< --dtype: auto | f32 | f16 | bf16 ("" = auto)
  std::string kv_dtype = "auto";   ///< --kv-dtype: auto | f32 | f16 | bf16 | fp8_e4m3 | fp8_e5m2
  /// --cpu-gemm: openblas | onednn | onednn-f32 | amx | auto (amx where the CPU has AMX, else
  /// onednn where oneDNN reports native bf16, else openblas). model_ops.h CpuGemm.
  std::string cpu_gemm = "openblas";
  bool cuda_graph = true;          ///< --cuda-graph on|off
  std::string mla_prefill = "auto";  ///< --mla-prefill: auto | absorbed (model::MlaPrefill)
  int64_t mla_window_keys = 0;       ///< --mla-window-keys (EngineConfig::mla_window_keys)
  bool overlap = false;            ///< --overlap on|off (EngineConfig::overlap)
  bool radix_cache = true;         ///< --no-radix turns it off
  bool mixed_batches = true;       ///< --no-mixed turns it off
  int32_t max_context_len = 0;     ///< --max-context-len (0 = the model's)
  std::string swa_pool = "auto";   ///< --swa-pool: auto | on | off (engine.md §13)
  int64_t swa_pool_tokens = 0;     ///< --swa-pool-tokens (0 = as many as --pool-tokens)
  /// --max-mamba-cache-size: a hybrid model's state slots, requests', radix snapshots' and
  /// draft nodes' (0: EngineConfig::max_mamba_cache_size's default)
  int32_t max_mamba_cache_size = 0;
  tier::HiCacheConfig hicache{};   ///< --hicache-* (cli/hicache_options.h parses them)
};

/// "auto" or "" → nullopt; else a float dtype name (f32, f16, bf16, fp8_e4m3, fp8_e5m2).
/// Throws Error(kInvalidArgument) naming `flag` and the value.
std::optional<DType> parse_dtype_arg(const std::string& value, std::string_view flag);

/// The platform `args`' backends run on (make_platform_for).
std::unique_ptr<platform::Platform> make_platform(const EngineArgs& args);

/// The EngineConfig of `args` on `platform` (the default backend filled in when none is named),
/// validated: Error(kInvalidArgument) naming the flag of a bad value (policy, dtype, sizes),
/// kUnsupported for a backend this build lacks (EngineConfig::validate). Cheap: call it before
/// loading a model.
EngineConfig make_engine_config(const EngineArgs& args, const platform::Platform& platform);

/// The GEMM mode `args` asks for on `platform` (--cpu-gemm; "auto": model::auto_cpu_gemm on the
/// CPU, openblas elsewhere), as make_engine_config sets it; throws as that does for a bad name.
model::CpuGemm cpu_gemm_of(const EngineArgs& args, const platform::Platform& platform);

/// How to load the checkpoint an engine of `args` on `platform` serves: a bf16 checkpoint's
/// dense GEMM matrices stay bf16 (model::LoadOptions::keep_bf16) where the model ops read bf16
/// weights (the CPU's onednn and amx GEMMs; the CUDA ops, which copy them as they are into a bf16
/// model and widen them for another dtype) and one rank holds them (no `tensor_parallel`).
model::LoadOptions load_options(const EngineArgs& args, const platform::Platform& platform,
                                bool tensor_parallel);

}  // namespace pagoda::engine
