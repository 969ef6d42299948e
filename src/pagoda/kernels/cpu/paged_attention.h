#pragma once
/// CPU paged attention (decode, extend/prefill, tree verify, MLA) over the structs of
/// attention_params.h. SIMD is written once with Highway and dispatched at run time to the best
/// ISA of the machine (SSE4 / AVX2 / AVX-512); threads come from OpenMP.
///
/// The kernels never allocate: the caller plans a CpuSchedule (work items, merge items, partial
/// slots and per-thread scratch sized by cpu_attention_scratch_floats) once per step and reuses
/// it for every layer. Numerics: f32 accumulation, online softmax in natural exp, KV converted
/// to f32 in registers/L1 (fp8 by exponent re-biasing), LSE reported in base 2.

#include <cstdint>

#include "pagoda/kernels/cpu/attention_params.h"

namespace pagoda::kernels::cpu {

/// Largest number of rows (query tokens x query heads) a single work item may hold.
inline constexpr int kCpuMaxRows = 256;
/// Largest supported head dimension (Dqk and Dv).
inline constexpr int kCpuMaxHeadDim = 1024;

/// Rounds a head dimension up to the padded row length used in scratch (multiple of 16 floats).
constexpr int cpu_padded_dim(int d) { return (d + 15) / 16 * 16; }

/// Floats of per-thread scratch one thread needs for items of at most `max_rows` rows, of which
/// at most `max_rows_per_head` belong to one KV head, with keys processed `kv_block` at a time.
int64_t cpu_attention_scratch_floats(int max_rows, int max_rows_per_head, int head_dim_qk,
                                     int head_dim_v, int kv_block);

/// Runs every work item of `schedule` and then every merge item (OpenMP parallel over
/// schedule.num_threads threads). Writes params.out (all rows of the step that appear in some
/// item) and params.lse when non-null. Does not allocate; thread-safe only with distinct
/// schedules/workspaces.
void run_cpu_paged_attention(const CpuAttentionParams& params, const CpuSchedule& schedule);

/// Name of the SIMD target the dispatcher picks on this machine ("AVX3", "AVX2", ...).
const char* cpu_simd_target_name();

/// Sums `n` floats with `num_threads` threads using SIMD loads (a streaming-read bandwidth probe;
/// the result only defeats dead-code elimination).
double cpu_stream_read_sum(const float* data, int64_t n, int num_threads);

}  // namespace pagoda::kernels::cpu
