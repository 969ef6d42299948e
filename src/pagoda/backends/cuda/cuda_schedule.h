#pragma once
/// Host-side work schedule of one CUDA attention step: which kernel runs (decode / prefill /
/// generic) and its work items. Pure host code (unit-testable without a GPU); a plan is a value.

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "pagoda/attention/batch_attention.h"

namespace pagoda::backends::cuda {

/// kMlaDecode: the absorbed-MLA decode kernel (kernels/cuda/mla_decode_kernel.cuh); its work
/// items and merge rows have the decode layout.
enum class KernelPath : uint8_t { kDecode, kPrefill, kGeneric, kMlaDecode };
std::string_view kernel_path_name(KernelPath p);

/// Inputs of the split-KV planner.
struct ScheduleConfig {
  int sm_count = 132;
  int decode_blocks_per_sm = 2;   ///< resident decode blocks per SM
  bool fast_path = true;          ///< a tuned instantiation exists for the shape
  /// The MLA decode kernel serves the shape: decode-shaped batches (qo_len <= 1, no custom mask)
  /// take kMlaDecode with the decode split-KV items; anything else follows fast_path.
  bool mla_decode = false;
  /// q heads per decode block (units per work item = Hkv * ceil(G / this)): 16 for the decode
  /// kernel, kernels::cuda::mla_decode_heads_per_block(Hq) for kMlaDecode.
  int decode_heads_per_block = 16;
  bool allow_split = true;
  int min_chunk_tokens = 256;     ///< never split a request into chunks smaller than this
  /// Prefill split-KV (short extends and tree verify over long contexts): only for steps of at
  /// most this many query tokens whose blocks fill less than half the GPU.
  int prefill_split_max_tokens = 128;
  /// Smallest prefill split chunk (keys; one 128-key tile): a verify of a few tokens over a few
  /// hundred keys otherwise runs one block per kv head through every tile.
  int prefill_min_chunk_tokens = 128;
  int prefill_blocks_per_sm = 1;  ///< resident prefill blocks per SM
  /// Prefill items for the sm90 kernel (kernels::cuda::prefill_sm90_serves): 128 packed rows at
  /// every head dim (kernels::cuda::prefill_rows_per_tile). Without fast_path (DQK 192 / DV 128:
  /// no decode or mma.sync instantiation) every step of such a shape takes the prefill path,
  /// decode-shaped ones included.
  bool sm90_prefill = false;
  /// Capacities a split must respect (0 = unbounded): work items and partial-state floats
  /// (partials × Hq × Dv) — a CUDA-graph arena's frozen sizes.
  int max_items = 0;
  int64_t max_partial_floats = int64_t{16} << 20;
  /// Take the prefill path even when every request has one query (a captured draft-extend
  /// graph must keep its kernel whatever the accepted counts of the replayed batch).
  bool force_prefill = false;
  /// sm90 prefill plans: per-block unit lists (Schedule::unit_begin / unit_list) for
  /// sm_count * prefill_blocks_per_sm blocks instead of the kernel's own round-robin order
  /// (KernelOptions' sm90_unit_lists; the backend sets it for eager plans only).
  bool unit_lists = false;
};

/// The schedule: work items (request, a, b, partial) and merge rows (request, first partial,
/// count), in the layout the kernels read (kernels/cuda/attention_params.h DevicePlan).
struct Schedule {
  KernelPath path = KernelPath::kGeneric;
  std::vector<int32_t> item_req, item_a, item_b, item_partial;
  std::vector<int32_t> merge_req, merge_begin, merge_count, merge_tok;
  int num_partials = 0;
  int chunk_tokens = 0;           ///< split size in keys (0 = no split; decode or prefill path)
  bool sm90_prefill = false;      ///< kPrefill items sized for the sm90 kernel (config.sm90_prefill)
  int nnz_qo = 0;
  /// With config.unit_lists on a kPrefill plan for the sm90 kernel: block k of
  /// unit_begin.size() - 1 runs the units unit_list[unit_begin[k] .. unit_begin[k + 1]) in that
  /// order, unit = work item · Hkv + kv head. Built by LPT: units heaviest first (128-key tiles
  /// the item's rows see in its chunk, plus one for the unit's fixed cost), each to the block
  /// with the least load so far. Empty: the kernel walks its own order (kItemSnake), which leaves
  /// the busiest block ~3 % over the mean at B16 S1024 (tools/sm90_schedule_sim.py).
  std::vector<int32_t> unit_begin, unit_list;
  int num_items() const { return static_cast<int>(item_req.size()); }
  int num_merges() const { return static_cast<int>(merge_req.size()); }
};

/// Decode work items of one wave for `shape` under `config` (its sm_count, decode_blocks_per_sm,
/// decode_heads_per_block and mla_decode): a split keeps items × units within the wave, so a
/// decode step never has more than this many items unless it has more requests.
int decode_wave_items(const attention::AttentionShape& shape, const ScheduleConfig& config);

/// The most work items build_schedule gives a batch of `bs` requests and `tokens` query rows
/// with config.max_items set to this bound (CUDA-graph launches are sized by it):
/// max(bs, wave_items, ceil(tokens · group / 64) + bs) — decode items are one per request or
/// fit one wave, prefill row tiles hold >= 64 packed rows, and a prefill split respects
/// max_items. Monotone in bs and tokens.
int schedule_items_bound(int bs, int tokens, int group, int wave_items);

/// kv_len of every request of a validated plan input.
std::vector<int32_t> kv_lengths(const attention::PagedPlanInput& in);

/// Per request of a validated input with a custom mask: the largest c <= kv_len such that every
/// row's bits in columns [0, c) are 1 (a tree verify's cached prefix). The prefill kernel runs key
/// tiles inside [0, c) without per-logit mask tests. Empty when there is no custom mask.
std::vector<int32_t> mask_free_columns(const attention::PagedPlanInput& in);

/// Per query row of a validated input with a custom mask (nnz entries, in row order): its
/// position in the mask, (keys the row sees) - 1 — a tree node's prefix + depth, from which the
/// kernels measure the sliding window (DevicePlan::mask_qpos). Empty without a custom mask.
/// `free` is mask_free_columns(in): those columns are 1 in every row, so only the bits after
/// them are counted (a tree verify's draft tokens, not its whole cached prefix).
std::vector<int32_t> mask_positions(const attention::PagedPlanInput& in,
                                    std::span<const int32_t> free);

/// Builds the schedule. Decode path (and kMlaDecode when config.mla_decode): every request has qo_len <= 1 and there is no custom mask;
/// requests are cut into equal token chunks (smallest chunk with
/// sum(ceil(len / chunk)) * units <= sm_count * blocks_per_sm, units = Hkv * ceil(G / 16)), so
/// skewed lengths still fill the GPU. Prefill path: one item per (request,
/// kernels::cuda::prefill_rows_per_tile(Dqk, config.sm90_prefill) packed rows), heaviest (most visible keys) first;
/// a step of few query tokens (<= prefill_split_max_tokens) whose blocks fill under half the GPU
/// cuts every request's keys into chunks of chunk_tokens (a multiple of 128) so about one wave
/// of blocks runs: items (request, tile, chunk) for every chunk of the request (an empty one
/// still writes its partial), partial slots token-major (token t, chunk c of request b at
/// base_b + t · n_b + c), one merge row per (request, token) with n_b > 1.
Schedule build_schedule(const attention::PagedPlanInput& in, const attention::AttentionShape& shape,
                        const ScheduleConfig& config);

}  // namespace pagoda::backends::cuda
