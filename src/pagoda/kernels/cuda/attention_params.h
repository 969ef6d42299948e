#pragma once
/// Plain parameter structs of the CUDA attention kernels (host-includable: no CUDA headers).
/// Everything a kernel reads lives behind these pointers, so a captured CUDA graph replays a new
/// step after the planner has rewritten the arrays in place (ARCHITECTURE §4: fixed addresses).

#include <cstdint>


namespace pagoda::kernels::cuda {

/// Element types the kernels understand (mirror of pagoda::DType without its fmt dependency,
/// which nvcc's host pass cannot compile).
enum class ElemType : uint8_t { kF32, kF16, kBF16, kE4M3, kE5M2 };

/// A paged K or V cache: element (page, token, head, d) lives at
/// data + page * page_stride + token * token_stride + head * head_stride + d (elements).
/// num_pages bounds the page ids (0 = unknown: kernels that need the bound, the Hopper
/// prefill's TMA copies, then do without it).
struct PagedCache {
  const void* data = nullptr;
  int64_t page_stride = 0;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
  int64_t num_pages = 0;
};

/// The step's plan on the device. All int32 unless noted; written by the host planner.
struct DevicePlan {
  /// [0] batch size, [1] work items, [2] merge rows, [3] prefill split-KV chunk (keys; 0 = the
  /// prefill items are not split). In device memory, so a graph replay sees each plan's values.
  const int32_t* counts = nullptr;
  const int32_t* qo_indptr = nullptr;       ///< [bs + 1]
  const int32_t* kv_indptr = nullptr;       ///< [bs + 1] pages
  const int32_t* kv_indices = nullptr;      ///< page ids
  const int32_t* kv_last_page_len = nullptr;///< [bs]
  const uint8_t* custom_mask = nullptr;     ///< packed bits, nullptr = none
  const int64_t* mask_indptr = nullptr;     ///< [bs + 1] byte offsets
  const int32_t* item_req = nullptr;        ///< work item -> request
  const int32_t* item_a = nullptr;          ///< decode: kv begin; prefill: packed-row tile index
  const int32_t* item_b = nullptr;          ///< decode: kv end; prefill: kv chunk index (split)
  /// -1 = write the output. Decode: the partial slot. Prefill (split): the request's first slot
  /// plus the chunk index; query token t of the request (0-based) writes slot
  /// item_partial + t · ceil(kv_len / counts[3]).
  const int32_t* item_partial = nullptr;
  const int32_t* merge_req = nullptr;       ///< merge row -> request
  const int32_t* merge_begin = nullptr;     ///< first partial slot of the row (consecutive slots)
  const int32_t* merge_count = nullptr;     ///< number of partial slots
  const int32_t* merge_tok = nullptr;       ///< query token of the row within its request
  /// [bs] per request (read only with custom_mask): the largest c <= kv_len such that every
  /// row's mask bits in columns [0, c) are 1 (a tree verify's cached prefix), so key tiles inside
  /// [0, c) skip the per-logit bit tests. nullptr = 0 for every request.
  const int32_t* mask_free_cols = nullptr;
  /// [nnz] (read only with custom_mask): each query row's position in its request's mask,
  /// (keys the row sees) - 1 (a tree node's prefix + depth); the sliding window keeps the row's
  /// last window + 1 visible keys (attention/batch_attention.h, mask_rows.h). nullptr: a row
  /// sits at its index, kv_len - qo_len + row (CudaBatchAttention always sets it with a mask).
  const int32_t* mask_qpos = nullptr;
};

/// Launch variants of the tuned kernels, chosen by the backend's plan (CudaBatchAttention copies
/// them from backends::KernelOptions; docs/design/cuda_backend.md "Kernel options"). The defaults
/// are the measured choices; each applies only where its kernel runs (sm_90a image on an sm_90
/// device), so on other devices they change nothing. Every value computes the same result.
struct CudaLaunchVariants {
  bool mla_sm90 = true;         ///< MLA decode: the Hopper wgmma kernel where it runs
  bool mla_sm90_small = true;   ///< ... in its transposed 16-head form at Hq <= 16
  bool mla_tma = true;          ///< ... latent tiles by TMA at page sizes >= 16 (else cp.async)
  bool sm90_tma = true;         ///< sm90 prefill: K/V tiles by TMA where the configuration does
  bool sm90_tma_store = true;   ///< sm90 prefill: output rows by TMA stores (overlap schedule)
  bool sm90_persistent = true;  ///< sm90 prefill: at most one block per SM (else one per unit)
  int sm90_max_blocks = 0;      ///< sm90 prefill: cap on the grid's blocks (0 = none)
  bool sm90_head_major = false; ///< sm90 prefill: head-major unit order (else item-major snake)
  int sm90_pingpong = -1;       ///< sm90 prefill ping-pong consumers: -1 at DQK >= 128, 0 off, 1 on
  bool sm90_overlap = true;     ///< sm90 prefill: intra-warpgroup softmax / GEMM overlap (D 128)
  // Prepared sm90 prefill variants, off until measured (issue 53's A/B, bench/device/run.sh
  // ab_kernels); each computes the same result:
  /// fp8 e4m3 K/V at D 128 on the sm90 kernel (overlap schedule; the producer widens the raw
  /// rows in shared memory), else on the mma.sync kernel.
  bool sm90_fp8 = false;
  /// DQK 192 / DV 128 (MLA prefill) at 64-key tiles and three stages, so it takes the overlap
  /// schedule as D 128 does, else 128-key tiles tile by tile.
  bool sm90_mla_k64 = false;
  /// The plan's per-block unit lists (LPT, eager plans) instead of the kernel's snake order.
  bool sm90_unit_lists = false;
  /// Split-KV merge block size: 32..512 in steps of 32, or 0 = sized by Dv and the partials.
  int merge_threads = 0;
};

/// Arguments of one attention launch (one layer of one planned step).
struct AttentionArgs {
  CudaLaunchVariants variants;              ///< the plan's launch variants
  DevicePlan plan;
  int page_size = 1;
  const void* q = nullptr;                  ///< [nnz, Hq, Dqk]
  int64_t q_stride_n = 0, q_stride_h = 0;
  void* out = nullptr;                      ///< [nnz, Hq, Dv]
  int64_t o_stride_n = 0, o_stride_h = 0;
  float* lse = nullptr;                     ///< [nnz, Hq] f32 base 2, nullptr = skip
  int64_t lse_stride_n = 0, lse_stride_h = 0;
  PagedCache k, v;
  int num_qo_heads = 0, num_kv_heads = 0, head_dim_qk = 0, head_dim_v = 0;
  ElemType q_dtype = ElemType::kBF16, kv_dtype = ElemType::kBF16, out_dtype = ElemType::kBF16;
  float sm_scale = 1.f;
  float logit_cap = 0.f;
  int window_left = -1;
  bool causal = true;
  const float* sinks = nullptr;             ///< device [Hq], nullptr = none
  float k_scale = 1.f, v_scale = 1.f;
  float* partial_o = nullptr;               ///< workspace [partials, Hq, Dv] f32
  float* partial_lse = nullptr;             ///< workspace [partials, Hq] f32
  int grid_items = 0;                       ///< blocks launched in x (>= counts[1])
  /// Prefill plans: items were sized for the sm90 kernel (prefill_rows_per_tile(D, true)); the
  /// launcher runs that kernel or fails, never the mma.sync one on a plan it cannot read.
  bool prefill_sm90 = false;
  int grid_rows = 0;                        ///< generic kernel: query-row capacity (>= nnz)
  int grid_merge = 0;                       ///< merge kernel: row capacity (>= counts[2])
  /// Mean partials per merge row the plan has (the merge kernel's block size follows it; any
  /// value is correct, 0 = unknown). A CUDA-graph plan gives its capacity's estimate.
  int merge_parts = 0;
  /// sm90 prefill with per-block unit lists (backends/cuda Schedule::unit_begin / unit_list,
  /// CudaLaunchVariants::sm90_unit_lists): block k runs units unit_list[unit_begin[k] ..
  /// unit_begin[k + 1]), unit = item · Hkv + kv head, and the launch has exactly unit_blocks
  /// blocks. nullptr = the kernel's own order. (Last in the struct: no other field's offset
  /// moves; the kernel parameters after AttentionArgs move by its 24 more bytes.)
  const int32_t* unit_begin = nullptr;
  const int32_t* unit_list = nullptr;
  int unit_blocks = 0;
};

/// KV append (KvPool::set_kv on the device): cache[loc[i]] = src[i] (converted; fp8 divides by
/// `scale` first). Slots < 0 are skipped.
struct AppendArgs {
  const void* src = nullptr;                ///< [n, H, D]
  int64_t src_stride_n = 0, src_stride_h = 0;
  ElemType src_dtype = ElemType::kBF16;
  void* cache = nullptr;
  int64_t page_stride = 0, token_stride = 0, head_stride = 0;
  ElemType cache_dtype = ElemType::kBF16;
  const int32_t* loc = nullptr;             ///< [n] device slot indices
  int n = 0, num_heads = 0, head_dim = 0, page_size = 1;
  float scale = 1.f;
};

/// Decode tile sizes the host planner needs (tokens per block iteration).
inline constexpr int kDecodeMaxGroup = 16;  ///< q heads per kv head handled by one decode block (MMA m)
/// q heads per MLA decode block (mla_decode_kernel.cuh): one 16-head group up to 16 heads, else
/// two (the latent tile then serves 32 heads). The planner's units per work item use it.
constexpr int mla_decode_heads_per_block(int num_qo_heads) { return num_qo_heads > 16 ? 32 : 16; }
/// q heads per block of the Hopper MLA decode kernel (mla_decode_sm90_kernel.cuh).
inline constexpr int kMlaSm90Heads = 64;
/// q heads per block of its transposed form for few heads (mla_decode_sm90_small_kernel.cuh,
/// Hq <= 16).
inline constexpr int kMlaSm90SmallHeads = 16;
inline constexpr int kPrefillRowsPerTile = 64;  ///< smallest prefill tile (capacity bound)
/// Packed query rows of one prefill work item (the planner and kernel agree): 128, except 64 for
/// D = 256 on the mma.sync kernel (prefill_kernel); the sm90 kernel runs 64 per consumer
/// warpgroup, 192 at D 64 (three consumers) and 128 at every other head dim (`sm90`: the plan
/// is for prefill_sm90_kernel, AttentionArgs::prefill_sm90).
constexpr int prefill_rows_per_tile(int head_dim, bool sm90) {
  if (sm90) return head_dim == 64 ? 192 : 128;
  return head_dim <= 128 ? 128 : 64;
}

}  // namespace pagoda::kernels::cuda
