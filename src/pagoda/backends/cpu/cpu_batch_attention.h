#pragma once
/// CpuBatchAttention: the SIMD + OpenMP BatchAttention for host memory (kernels/cpu). Every
/// feature of attention/batch_attention.h: paged decode with split-KV and LSE merge, GQA head
/// grouping, tiled extend/prefill, custom (tree) mask, bottom-right causal / non-causal, sliding
/// window, soft cap, sinks, fp8 / bf16 / f16 / f32 KV with scales, any page size, strided V
/// views (MLA), LSE base 2.
///
///   auto attn = make_cpu_batch_attention({.num_threads = 2});
///   attn->plan(input, shape);                      // once per step: builds the work partition
///   for each layer: attn->run(q, k_cache, v_cache, out, lse, params);   // no allocation
///
/// Not thread-safe (one caller at a time); run() itself uses num_threads OpenMP threads.

#include <memory>

#include "pagoda/attention/batch_attention.h"

namespace pagoda::backends {

/// Tuning knobs of the CPU implementation; the defaults fit most machines.
struct CpuAttentionOptions {
  int num_threads = 0;          ///< OpenMP threads for run(); 0 = omp_get_max_threads()
  int kv_block = 64;            ///< keys per inner block (multiple of 16, 16..256)
  int rows_per_item = 64;       ///< target query rows (tokens x heads) per work item
  int min_split_tokens = 256;   ///< smallest key chunk of a split-KV work item
  int items_per_thread = 4;     ///< split KV until there are this many items per thread
  bool bf16_tiles = true;       ///< CpuAttentionParams::bf16_tiles (AVX512-BF16 extend tile)
  bool bf16_decode = false;     ///< CpuAttentionParams::bf16_decode (AVX512-BF16 decode)
  bool amx_decode = false;      ///< CpuAttentionParams::amx_decode (the amx backend's decode)
};

/// Creates the CPU BatchAttention. Throws Error(kInvalidArgument) for bad options.
std::unique_ptr<attention::BatchAttention> make_cpu_batch_attention(CpuAttentionOptions options = {});

/// Largest head dimension (Dqk and Dv) the CPU kernels accept.
int cpu_max_head_dim();

}  // namespace pagoda::backends
