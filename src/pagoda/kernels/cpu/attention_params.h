#pragma once
/// Plain parameter structs of the CPU paged-attention kernels (no attention/kv types: the
/// backend in backends/cpu fills them from a BatchAttention plan and its tensors).
///
/// Conventions are those of attention/batch_attention.h (FlashInfer C0): CSR page table, NHD
/// pages, bottom-right causal, window_left, tanh soft cap, sinks, bit-packed little-endian custom
/// mask, LSE in base 2, empty rows -> out 0 and lse -inf. All strides are in elements; the last
/// dimension of every tensor must be contiguous (stride 1).

#include <cstdint>

#include "pagoda/core/dtype.h"

namespace pagoda::kernels::cpu {

/// How a query row chooses its keys (the sliding window applies on top of every kind; under
/// kCustom it keeps a row's last window_left + 1 visible keys, batch_attention.h).
enum class CpuMask : uint8_t {
  kNone,    ///< every key of the request
  kCausal,  ///< key j visible iff j <= kv_len - qo_len + i
  kCustom,  ///< bit (i, j) of the request's packed mask
};

/// One paged K or V cache: element (page, slot, head, d) is at
/// data + page * stride_page + slot * stride_slot + head * stride_head + d (elements of dtype).
struct CpuKvView {
  const void* data = nullptr;
  DType dtype = DType::kBF16;
  int64_t stride_page = 0;
  int64_t stride_slot = 0;
  int64_t stride_head = 0;
};

/// Everything the kernels read for one layer run. Pointers are host memory owned by the caller
/// and must stay valid for the duration of the call.
struct CpuAttentionParams {
  const void* q = nullptr;  ///< [nnz_qo, Hq, Dqk] of q_dtype
  DType q_dtype = DType::kBF16;
  int64_t q_stride_token = 0;
  int64_t q_stride_head = 0;
  CpuKvView k;  ///< [num_pages, page_size, Hkv, Dqk]
  CpuKvView v;  ///< [num_pages, page_size, Hkv, Dv] (MLA: a strided view of the latent)
  void* out = nullptr;  ///< [nnz_qo, Hq, Dv] of out_dtype
  DType out_dtype = DType::kBF16;
  int64_t out_stride_token = 0;
  int64_t out_stride_head = 0;
  float* lse = nullptr;  ///< [nnz_qo, Hq] f32 base 2, or nullptr
  int64_t lse_stride_token = 0;
  int64_t lse_stride_head = 0;

  int num_qo_heads = 0;
  int num_kv_heads = 0;
  int head_dim_qk = 0;
  int head_dim_v = 0;
  int page_size = 1;

  const int32_t* qo_indptr = nullptr;   ///< [bs + 1]
  const int32_t* kv_indptr = nullptr;   ///< [bs + 1], pages
  const int32_t* kv_indices = nullptr;  ///< page ids
  const int32_t* kv_len = nullptr;      ///< [bs] keys per request (precomputed by the planner)
  const uint8_t* custom_mask = nullptr; ///< packed bits (kCustom)
  const int64_t* mask_indptr = nullptr; ///< [bs + 1] byte offsets (kCustom)

  CpuMask mask = CpuMask::kCausal;
  int window_left = -1;         ///< -1 disables
  float sm_scale = 1.f;
  float logit_cap = 0.f;        ///< 0 disables
  const float* sinks = nullptr; ///< [Hq] natural-log logits, or nullptr
  float k_scale = 1.f;
  float v_scale = 1.f;
  /// The AVX512-BF16 micro-kernels (tile_bf16.h), used only where the CPU has them: the extend
  /// tile (default on) and the decode kernels (default off: on the local Zen 4 they measured no
  /// faster than the f32 direct path, bench/results/cpu_attention.md).
  bool bf16_tiles = true;
  bool bf16_decode = false;
  /// The AMX decode kernel (amx_decode.h) for the items it takes (one query position per row,
  /// at most 16 rows per KV head, bf16, every key of the chunk visible); set by the amx backend.
  bool amx_decode = false;
};

/// One unit of work: request `request`, KV heads [kv_head_begin, kv_head_end), query heads
/// [group_begin, group_end) inside each KV head's group, query rows [q_begin, q_end) of the
/// request, and keys [kv_begin, kv_end). All query heads of a group run against one K/V load.
/// partial < 0: the item covers all keys and writes the final output; otherwise it writes its
/// (normalised output, natural LSE) state into partial slot `partial` for a later merge.
struct CpuWorkItem {
  int32_t request = 0;
  int32_t kv_head_begin = 0;
  int32_t kv_head_end = 0;
  int32_t group_begin = 0;
  int32_t group_end = 0;
  int32_t q_begin = 0;
  int32_t q_end = 0;
  int32_t kv_begin = 0;
  int32_t kv_end = 0;
  int32_t partial = -1;
};

/// Merges the `num_partials` consecutive partial slots starting at `partial_begin` (all with the
/// same request/head/query ranges as the merge item) into the final output.
struct CpuMergeItem {
  int32_t request = 0;
  int32_t kv_head_begin = 0;
  int32_t kv_head_end = 0;
  int32_t group_begin = 0;
  int32_t group_end = 0;
  int32_t q_begin = 0;
  int32_t q_end = 0;
  int32_t partial_begin = 0;
  int32_t num_partials = 0;
};

/// The host-side schedule of one step plus the preallocated workspace (owned by the caller).
/// Row r of an item is ((kv_head - kv_head_begin) * q_rows + (q - q_begin)) * group_rows +
/// (query head in group - group_begin); partial slot p holds max_rows rows.
struct CpuSchedule {
  const CpuWorkItem* items = nullptr;
  int64_t num_items = 0;
  const CpuMergeItem* merges = nullptr;
  int64_t num_merges = 0;
  float* partial_out = nullptr;  ///< [num_partials, max_rows, Dv]
  float* partial_lse = nullptr;  ///< [num_partials, max_rows]
  int max_rows = 0;              ///< upper bound of rows of any item
  int kv_block = 32;             ///< keys per inner block (multiple of 16, <= 256)
  float* scratch = nullptr;      ///< num_threads * scratch_floats
  int64_t scratch_floats = 0;    ///< per thread, from cpu_attention_scratch_floats()
  int num_threads = 1;
};

}  // namespace pagoda::kernels::cpu
