#include "pagoda/backends/cuda/cuda_schedule.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <queue>
#include <utility>

#include "pagoda/kernels/cuda/attention_params.h"

namespace pagoda::backends::cuda {

std::string_view kernel_path_name(KernelPath p) {
  switch (p) {
    case KernelPath::kDecode: return "decode";
    case KernelPath::kPrefill: return "prefill";
    case KernelPath::kGeneric: return "generic";
    case KernelPath::kMlaDecode: return "mla_decode";
  }
  return "?";
}

std::vector<int32_t> kv_lengths(const attention::PagedPlanInput& in) {
  const int bs = in.batch_size();
  std::vector<int32_t> len(static_cast<size_t>(std::max(bs, 0)));
  for (int b = 0; b < bs; ++b) {
    const int pages = in.kv_indptr[b + 1] - in.kv_indptr[b];
    len[b] = pages == 0 ? 0 : (pages - 1) * in.page_size + in.kv_last_page_len[b];
  }
  return len;
}

namespace {

/// The sm90 prefill kernel's key tile at DQK <= 192 (the other prefill tiles, 64 and 32 keys,
/// divide it): the unit of split-KV chunks and of the work items' weights.
constexpr int kKeyTile = 128;

/// Number of consecutive 1 bits of `bits` starting at bit `start`, stopping at `limit`.
int64_t leading_ones(const uint8_t* bits, int64_t start, int64_t limit) {
  int64_t n = 0;
  // Unaligned head, bit by bit.
  while (n < limit && ((start + n) & 7) != 0) {
    const int64_t bit = start + n;
    if (((bits[bit >> 3] >> (bit & 7)) & 1) == 0) return n;
    ++n;
  }
  // Whole bytes (8 at a time, then 1 at a time).
  while (n + 64 <= limit) {
    uint64_t w;
    std::memcpy(&w, bits + ((start + n) >> 3), 8);
    if (w != ~uint64_t{0}) break;
    n += 64;
  }
  while (n + 8 <= limit && bits[(start + n) >> 3] == 0xFF) n += 8;
  // Tail (or the first byte holding a 0), bit by bit.
  while (n < limit) {
    const int64_t bit = start + n;
    if (((bits[bit >> 3] >> (bit & 7)) & 1) == 0) return n;
    ++n;
  }
  return n;
}

}  // namespace

std::vector<int32_t> mask_free_columns(const attention::PagedPlanInput& in) {
  if (in.custom_mask.empty()) return {};
  const int bs = in.batch_size();
  const std::vector<int32_t> len = kv_lengths(in);
  std::vector<int32_t> free(static_cast<size_t>(std::max(bs, 0)), 0);
  for (int b = 0; b < bs; ++b) {
    const int qo = in.qo_indptr[b + 1] - in.qo_indptr[b];
    const int64_t kv = len[b];
    const uint8_t* seg = in.custom_mask.data() + in.mask_indptr[b];
    int64_t c = kv;
    for (int i = 0; i < qo && c > 0; ++i) c = leading_ones(seg, int64_t(i) * kv, c);
    free[b] = static_cast<int32_t>(c);
  }
  return free;
}

std::vector<int32_t> mask_positions(const attention::PagedPlanInput& in,
                                    std::span<const int32_t> free) {
  if (in.custom_mask.empty()) return {};
  const int bs = in.batch_size();
  const std::vector<int32_t> len = kv_lengths(in);
  std::vector<int32_t> pos;
  pos.reserve(static_cast<size_t>(in.qo_indptr[bs]));
  for (int b = 0; b < bs; ++b) {
    const uint8_t* seg = in.custom_mask.data() + in.mask_indptr[b];
    const int64_t kv = len[b];
    const int32_t c = free[static_cast<size_t>(b)];
    for (int i = 0; i < in.qo_indptr[b + 1] - in.qo_indptr[b]; ++i) {
      int32_t seen = c;
      for (int64_t bit = int64_t(i) * kv + c; bit < int64_t(i + 1) * kv; ++bit) {
        seen += (seg[bit >> 3] >> (bit & 7)) & 1;
      }
      pos.push_back(seen - 1);
    }
  }
  return pos;
}

namespace {

constexpr int kMaxGroupPerBlock = kernels::cuda::kDecodeMaxGroup;  // q heads per decode block

int64_t items_for(const std::vector<int32_t>& len, int chunk) {
  int64_t n = 0;
  for (int32_t l : len) n += std::max<int64_t>(1, (l + chunk - 1) / chunk);
  return n;
}

/// The prefill split-KV chunk (keys, a multiple of 128) for a step of `tiles` row tiles, or 0.
int prefill_split_chunk(const attention::PagedPlanInput& in, const attention::AttentionShape& shape,
                        const ScheduleConfig& config, const std::vector<int32_t>& len,
                        int64_t tiles) {
  const int bs = in.batch_size();
  const int nnz = bs > 0 ? in.qo_indptr[bs] : 0;
  const int64_t wave = int64_t(config.sm_count) * std::max(config.prefill_blocks_per_sm, 1);
  const int64_t blocks = tiles * shape.num_kv_heads;
  const int32_t longest = len.empty() ? 0 : *std::max_element(len.begin(), len.end());
  if (!config.allow_split || nnz == 0 || nnz > config.prefill_split_max_tokens || blocks == 0 ||
      2 * blocks > wave || longest < 2 * std::max(config.prefill_min_chunk_tokens, kKeyTile)) {
    return 0;
  }
  const int tile_rows =
      kernels::cuda::prefill_rows_per_tile(shape.head_dim_qk, config.sm90_prefill);
  auto cost = [&](int chunk, int64_t& items, int64_t& partials) {
    items = partials = 0;
    for (int b = 0; b < bs; ++b) {
      const int qo = in.qo_indptr[b + 1] - in.qo_indptr[b];
      if (qo == 0) continue;
      const int n = std::max(1, (len[b] + chunk - 1) / chunk);
      const int rows = qo * (shape.num_qo_heads / shape.num_kv_heads);
      const int row_tiles = (rows + tile_rows - 1) / tile_rows;
      items += int64_t(row_tiles) * n;
      if (n > 1) partials += int64_t(qo) * n;
    }
  };
  // The smallest aligned chunk whose blocks fit one wave, then within the capacities.
  const int64_t per_tile = std::max<int64_t>(1, wave / blocks);
  int chunk = static_cast<int>((longest + per_tile - 1) / per_tile);
  chunk = std::max(chunk, config.prefill_min_chunk_tokens);
  chunk = (chunk + kKeyTile - 1) / kKeyTile * kKeyTile;
  for (; chunk < longest; chunk += kKeyTile) {
    int64_t items = 0, partials = 0;
    cost(chunk, items, partials);
    const bool fits_items = config.max_items <= 0 || items <= config.max_items;
    const bool fits_ws = config.max_partial_floats <= 0 ||
                         partials * shape.num_qo_heads * shape.head_dim_v <=
                             config.max_partial_floats;
    if (fits_items && fits_ws) return chunk;
    if (chunk > longest / 2) break;  // two chunks at most: no longer worth splitting
  }
  return 0;
}

/// Schedule::unit_list by LPT over `blocks` blocks (at most one per unit): units in order of
/// weight, heaviest first (stable: item order, then kv head), each to the least loaded block
/// (the lowest index among equals).
void build_unit_lists(Schedule& s, const std::vector<int64_t>& item_weight, int hkv, int blocks) {
  const int64_t units = int64_t(item_weight.size()) * hkv;
  const int g = static_cast<int>(std::min<int64_t>(blocks, units));
  if (g <= 0) return;
  std::vector<int32_t> order(item_weight.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t x, int32_t y) { return item_weight[x] > item_weight[y]; });
  using Slot = std::pair<int64_t, int>;  // (load, block)
  std::priority_queue<Slot, std::vector<Slot>, std::greater<>> least;
  for (int k = 0; k < g; ++k) least.push({0, k});
  std::vector<std::vector<int32_t>> lists(static_cast<size_t>(g));
  for (int32_t item : order) {
    for (int h = 0; h < hkv; ++h) {
      auto [load, k] = least.top();
      least.pop();
      lists[k].push_back(item * hkv + h);
      least.push({load + item_weight[item], k});
    }
  }
  s.unit_begin.assign(1, 0);
  s.unit_list.reserve(static_cast<size_t>(units));
  for (const auto& l : lists) {
    s.unit_list.insert(s.unit_list.end(), l.begin(), l.end());
    s.unit_begin.push_back(static_cast<int32_t>(s.unit_list.size()));
  }
}

}  // namespace

int decode_wave_items(const attention::AttentionShape& shape, const ScheduleConfig& config) {
  const int group = shape.num_qo_heads / std::max(shape.num_kv_heads, 1);
  const int per_block =
      std::max(1, config.mla_decode ? config.decode_heads_per_block : kMaxGroupPerBlock);
  const int units = std::max(1, shape.num_kv_heads * ((group + per_block - 1) / per_block));
  const int wave = config.sm_count * config.decode_blocks_per_sm;
  return (wave + units - 1) / units;
}

int schedule_items_bound(int bs, int tokens, int group, int wave_items) {
  return std::max({bs, wave_items, (tokens * std::max(group, 1) + 63) / 64 + bs, 1});
}

Schedule build_schedule(const attention::PagedPlanInput& in, const attention::AttentionShape& shape,
                        const ScheduleConfig& config) {
  Schedule s;
  const int bs = in.batch_size();
  const std::vector<int32_t> len = kv_lengths(in);
  s.nnz_qo = bs > 0 ? in.qo_indptr[bs] : 0;
  bool all_single = true;
  for (int b = 0; b < bs; ++b) all_single &= (in.qo_indptr[b + 1] - in.qo_indptr[b]) <= 1;
  const bool has_mask = !in.custom_mask.empty();
  const bool mla = config.mla_decode && all_single && !has_mask && !config.force_prefill;
  // The sm90 prefill kernel also serves head dims the mma.sync kernels lack (DQK 192 / DV 128):
  // such steps take the prefill path, single-token ones included.
  if (!config.fast_path && !mla && !config.sm90_prefill) {
    s.path = KernelPath::kGeneric;
    return s;
  }
  const int group = shape.num_qo_heads / std::max(shape.num_kv_heads, 1);
  if (all_single && !has_mask && !config.force_prefill && (config.fast_path || mla)) {
    s.path = mla ? KernelPath::kMlaDecode : KernelPath::kDecode;
    const int per_block = std::max(1, mla ? config.decode_heads_per_block : kMaxGroupPerBlock);
    const int units = shape.num_kv_heads * ((group + per_block - 1) / per_block);
    const int64_t max_grid = int64_t(config.sm_count) * config.decode_blocks_per_sm;
    int chunk = 0;
    const int32_t longest = len.empty() ? 0 : *std::max_element(len.begin(), len.end());
    if (config.allow_split && int64_t(bs) * units < max_grid && longest > config.min_chunk_tokens) {
      int lo = config.min_chunk_tokens, hi = longest;  // smallest chunk that fits one wave
      while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (items_for(len, mid) * units <= max_grid) hi = mid; else lo = mid + 1;
      }
      chunk = (lo + 15) / 16 * 16;
      if (chunk >= longest) chunk = 0;
    }
    s.chunk_tokens = chunk;
    for (int b = 0; b < bs; ++b) {
      if (in.qo_indptr[b + 1] == in.qo_indptr[b]) continue;
      const int n = chunk > 0 ? std::max(1, (len[b] + chunk - 1) / chunk) : 1;
      if (n == 1) {
        s.item_req.push_back(b);
        s.item_a.push_back(0);
        s.item_b.push_back(len[b]);
        s.item_partial.push_back(-1);
        continue;
      }
      s.merge_req.push_back(b);
      s.merge_begin.push_back(s.num_partials);
      s.merge_count.push_back(n);
      s.merge_tok.push_back(0);
      for (int c = 0; c < n; ++c) {
        s.item_req.push_back(b);
        s.item_a.push_back(c * chunk);
        s.item_b.push_back(std::min(len[b], (c + 1) * chunk));
        s.item_partial.push_back(s.num_partials++);
      }
    }
    return s;
  }
  s.path = KernelPath::kPrefill;
  s.sm90_prefill = config.sm90_prefill;
  const int kRowsPerTile = kernels::cuda::prefill_rows_per_tile(shape.head_dim_qk, config.sm90_prefill);
  // Heaviest tiles first (causal: the last rows of long requests see the most keys), so the
  // tail of the grid is made of short blocks. Weight = 128-key tiles (the kernels' key tile);
  // tiles of equal weight stay together by request, so the blocks running at one time read
  // the keys of a few requests (the order of units over items and heads is the kernel's).
  struct Tile {
    int64_t work;
    int32_t b, t;
  };
  std::vector<Tile> tiles;
  for (int b = 0; b < bs; ++b) {
    const int qo = in.qo_indptr[b + 1] - in.qo_indptr[b];
    const int rows = qo * group;
    for (int t = 0; t * kRowsPerTile < rows; ++t) {
      const int last_tok = (std::min(rows, (t + 1) * kRowsPerTile) - 1) / std::max(group, 1);
      const int64_t keys = has_mask ? len[b] : std::min<int64_t>(len[b], len[b] - qo + last_tok + 1);
      tiles.push_back({keys, b, t});
    }
  }
  std::stable_sort(tiles.begin(), tiles.end(), [](const Tile& x, const Tile& y) {
    const int64_t wx = (x.work + kKeyTile - 1) / kKeyTile, wy = (y.work + kKeyTile - 1) / kKeyTile;
    if (wx != wy) return wx > wy;
    if (x.b != y.b) return x.b < y.b;
    return x.work > y.work;
  });
  const int chunk = prefill_split_chunk(in, shape, config, len, static_cast<int64_t>(tiles.size()));
  // Unit weights for the unit lists: the 128-key tiles an item sees, plus one for its fixed cost.
  const bool lists = config.unit_lists && config.sm90_prefill;
  std::vector<int64_t> weight;
  const int list_blocks = config.sm_count * std::max(config.prefill_blocks_per_sm, 1);
  if (chunk == 0) {
    for (const Tile& t : tiles) {
      s.item_req.push_back(t.b);
      s.item_a.push_back(t.t);
      s.item_b.push_back(0);
      s.item_partial.push_back(-1);
      if (lists) weight.push_back((t.work + kKeyTile - 1) / kKeyTile + 1);
    }
    if (lists) build_unit_lists(s, weight, shape.num_kv_heads, list_blocks);
    return s;
  }
  s.chunk_tokens = chunk;
  std::vector<int32_t> base(static_cast<size_t>(bs), -1);
  for (int b = 0; b < bs; ++b) {
    const int qo = in.qo_indptr[b + 1] - in.qo_indptr[b];
    const int n = std::max(1, (len[b] + chunk - 1) / chunk);
    if (qo == 0 || n == 1) continue;
    base[b] = s.num_partials;
    for (int t = 0; t < qo; ++t) {
      s.merge_req.push_back(b);
      s.merge_begin.push_back(s.num_partials + t * n);
      s.merge_count.push_back(n);
      s.merge_tok.push_back(t);
    }
    s.num_partials += qo * n;
  }
  // Chunk-major over the heaviest-first tiles: every chunk of a tile runs about as long.
  for (const Tile& t : tiles) {
    const int n = std::max(1, (len[t.b] + chunk - 1) / chunk);
    for (int c = 0; c < n; ++c) {
      s.item_req.push_back(t.b);
      s.item_a.push_back(t.t);
      s.item_b.push_back(c);
      s.item_partial.push_back(base[t.b] < 0 ? -1 : base[t.b] + c);
      if (lists) {
        const int64_t seen = std::clamp<int64_t>(t.work - int64_t(c) * chunk, 0, chunk);
        weight.push_back((seen + kKeyTile - 1) / kKeyTile + 1);
      }
    }
  }
  if (lists) build_unit_lists(s, weight, shape.num_kv_heads, list_blocks);
  return s;
}

}  // namespace pagoda::backends::cuda
