#pragma once
/// KernelOptions: the typed configuration of the attention kernels' variants (ARCHITECTURE §2:
/// variants are chosen by a backend's plan from device capabilities and this configuration,
/// never by environment variables). It travels in BackendSelection::kernels (EngineConfig,
/// WorkerConfig, the TP settings) to register_builtin_backends, whose factories give it to the
/// backends they build; the CUDA plan combines it with what the device runs
/// (CudaBatchAttention::plan) and passes the launch variants down in AttentionArgs.
///
/// The defaults are the measured choices (each field names its measurement); the others exist
/// for tests (code paths a default run does not reach on a given shape) and A/B runs. Every value
/// computes the same result. Set from the CLI with `--kernel-option NAME=VALUE` (repeatable;
/// names = the field names below) and printed by `pagoda bench --json` ("kernel_options").
///
///   KernelOptions o;
///   set_kernel_option(o, "sm90_max_blocks=3");  // Error(kInvalidArgument) naming a bad one
///   o.validate();

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pagoda/kernels/cuda/attention_params.h"

namespace pagoda::backends {

struct KernelOptions {
  // ---- CUDA backend (docs/design/cuda_backend.md "Kernel options") ----
  /// The absorbed-MLA decode kernels where they serve the shape (else the generic kernel).
  bool mla_decode = true;
  /// The Hopper (sm_90a) prefill / extend kernel where it runs (else the mma.sync kernel).
  bool sm90_prefill = true;
  /// The shortest split-KV chunk of a decode step (keys, a multiple of 16, >= 16): a request is
  /// split only into chunks at least this long (ScheduleConfig::min_chunk_tokens); a long context
  /// takes the chunk that fills one wave, so this only spreads short contexts of small batches
  /// over more blocks. 64 (was 256): the 1B decode step at batch 1 0.7 % shorter, batch 64
  /// within noise (H100, 24566f7, record h100_ab_min_chunk_24566f7.json).
  int decode_min_chunk = 64;
  /// Launch variants of the tuned kernels (attention_params.h); only where their kernel runs.
  kernels::cuda::CudaLaunchVariants cuda{};
  // ---- CPU backend (docs/design/cpu_backend.md) ----
  /// The AVX512-BF16 extend tile micro-kernels where the CPU has them (else the f32 kernels).
  bool cpu_bf16 = true;
  /// The AVX512-BF16 decode micro-kernels (opt-in: no faster on the local Zen 4).
  bool cpu_bf16_decode = false;
  // ---- amx backend (docs/design/cpu_backend.md "amx backend") ----
  /// pagoda's AMX tile micro-kernels for the extend products where the CPU has AMX (else
  /// oneDNN's matmul). Against oneDNN on the 2-core Xeon dev VM at 86401c2 (min of 15 samples,
  /// 2 threads, a shared machine): prefill 2,048 B1 44.0 vs 47.5 ms, extend 512 on 4,096 B4
  /// 164–167 vs 171–176 ms (docs/design/cpu_backend.md "amx backend").
  bool amx_tiles = true;
  /// The amx backend's AMX decode kernel (kernels/cpu/amx_decode.h) for decode steps where the CPU
  /// has AMX (else the cpu backend's decode kernels). B16 × 8,192 keys, 32/8 heads, D 128, page
  /// 16, 2 threads on the Xeon dev VM: see docs/design/cpu_backend.md "amx backend".
  bool amx_decode = true;

  /// Throws Error(kInvalidArgument) naming the first out-of-range field (decode_min_chunk not a
  /// multiple of 16 >= 16, sm90_max_blocks < 0, sm90_pingpong outside -1..1, merge_threads not
  /// 0 or 32..512 in steps of 32).
  void validate() const;
};

/// Sets one option from "NAME=VALUE" (booleans: 1/0, true/false, on/off; integers in base 10),
/// then checks the whole struct (validate). Error(kInvalidArgument) naming an unknown NAME (and
/// listing the known ones), a missing '=' or a VALUE that is not valid for NAME.
void set_kernel_option(KernelOptions& options, std::string_view assignment);

/// Every option as (name, value) in a fixed order, values as set_kernel_option reads them
/// (booleans "true"/"false"): for printing (bench --json) and for the TP settings' wire form.
std::vector<std::pair<std::string, std::string>> kernel_option_values(const KernelOptions& options);

}  // namespace pagoda::backends
