#include "pagoda/attention/dsa.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>

#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/kv/req_to_token.h"

namespace pagoda::attention {

IndexerMetadata build_indexer_metadata(const ForwardBatch& batch,
                                       const kv::ReqToTokenTable& req_to_token, bool slots) {
  const bool decode = batch.mode == ForwardMode::kDecode;
  const bool verify = batch.mode == ForwardMode::kTargetVerify;
  PAGODA_REQUIRE(batch.mode == ForwardMode::kIdle || batch.mode == ForwardMode::kExtend ||
                     batch.mode == ForwardMode::kMixed || verify ||
                     (decode && !batch.is_draft_step()),
                 kUnsupported,
                 "DeepSeek sparse attention (DSA) does not support {} steps{} (multi-step "
                 "draft batches: EAGLE heads do not draft for DSA targets)",
                 forward_mode_name(batch.mode), batch.is_draft_step() ? " (multi-step draft)" : "");
  PAGODA_REQUIRE(batch.kv_start.empty(), kUnsupported,
                 "DeepSeek sparse attention (DSA) with ForwardBatch.kv_start (its positions "
                 "index every key from 0)");
  IndexerMetadata m;
  if (slots) m.slot_indptr.push_back(0);
  const int32_t tree = verify ? batch.spec.num_draft_tokens : 0;
  m.tree_size = tree;
  size_t mask0 = 0;  // request b's block of spec.tree_mask
  for (int b = 0; b < batch.batch_size; ++b) {
    const int32_t kv_len = batch.seq_lens[b] + tree;
    const int32_t qo_len = decode ? 1 : batch.extend_seq_lens[b];
    if (verify) {
      const size_t cols = static_cast<size_t>(kv_len);
      PAGODA_REQUIRE(qo_len == tree && batch.spec.tree_mask.size() >= mask0 + cols * tree,
                     kInvalidArgument,
                     "indexer metadata: verify request {} has {} rows and a tree mask of {} "
                     "bytes for a tree of {}",
                     b, qo_len, batch.spec.tree_mask.size(), tree);
      for (int32_t i = 0; i < tree; ++i) {
        m.row_tree_begin.push_back(batch.seq_lens[b]);
        const uint8_t* row = batch.spec.tree_mask.data() + mask0 + static_cast<size_t>(i) * cols;
        m.row_tree_bits.insert(m.row_tree_bits.end(), row + batch.seq_lens[b], row + cols);
      }
      mask0 += cols * static_cast<size_t>(tree);
    }
    PAGODA_REQUIRE(qo_len >= 1 && qo_len <= kv_len, kOutOfRange,
                   "indexer metadata: request {} has {} query tokens over {} keys", b, qo_len,
                   kv_len);
    if (slots) {
      const auto row = req_to_token.read(ReqSlot(batch.req_pool_indices[b]), 0, kv_len);
      m.slots.insert(m.slots.end(), row.begin(), row.end());
      m.slot_indptr.push_back(static_cast<int32_t>(m.slots.size()));
    }
    for (int32_t i = 0; i < qo_len; ++i) {
      m.row_request.push_back(b);
      m.row_visible.push_back(kv_len - qo_len + i + 1);
    }
    m.max_visible = std::max(m.max_visible, kv_len);
  }
  PAGODA_REQUIRE(static_cast<int>(m.row_request.size()) == batch.num_tokens(), kInvalidArgument,
                 "indexer metadata: {} query rows but {} tokens", m.row_request.size(),
                 batch.num_tokens());
  return m;
}

namespace {

/// Checks the selection's size, then calls fn(t, positions) for every row t with its selected
/// positions sorted ascending, each checked against the row's visible range and for repeats.
/// The positions go through a bitmap of the row's visible range (set, then read in order), not
/// a sort: a decode row at 128k keeping 2,048 costs a 2,048-word scan instead of a 2,048-entry
/// sort (16 such rows took ~2 ms of host time per layer with the sort).
template <typename Fn>
void for_each_selection(const IndexerMetadata& meta, std::span<const int32_t> topk, int k,
                        const char* who, Fn&& fn) {
  const auto rows = static_cast<int64_t>(meta.row_request.size());
  PAGODA_REQUIRE(k >= 1 && static_cast<int64_t>(topk.size()) == rows * k, kInvalidArgument,
                 "{}: {} top-k entries for {} rows of k {}", who, topk.size(), rows, k);
  std::vector<int32_t> sel;
  sel.reserve(static_cast<size_t>(k));
  std::vector<uint64_t> bits;
  for (int64_t t = 0; t < rows; ++t) {
    const int32_t visible = meta.row_visible[static_cast<size_t>(t)];
    bits.assign(static_cast<size_t>(visible + 63) / 64, 0);
    for (const int32_t pos : topk.subspan(static_cast<size_t>(t * k), static_cast<size_t>(k))) {
      if (pos == -1) continue;
      PAGODA_REQUIRE(meta.sees(t, pos), kOutOfRange,
                     "{}: row {} selects position {}, which it does not see (its range is [0, "
                     "{}){}; -1: unused)",
                     who, t, pos, visible,
                     meta.tree_size > 0 ? ", draft nodes on its path only" : "");
      uint64_t& word = bits[static_cast<size_t>(pos) / 64];
      const uint64_t bit = uint64_t{1} << (pos % 64);
      PAGODA_REQUIRE((word & bit) == 0, kInvalidArgument, "{}: row {} selects position {} twice",
                     who, t, pos);
      word |= bit;
    }
    sel.clear();
    for (size_t w = 0; w < bits.size(); ++w) {
      for (uint64_t word = bits[w]; word != 0; word &= word - 1)
        sel.push_back(static_cast<int32_t>(w * 64 + static_cast<size_t>(std::countr_zero(word))));
    }
    fn(t, std::span<const int32_t>(sel));
  }
}

}  // namespace

void apply_sparse_mask(PagedPlan& plan, const IndexerMetadata& meta,
                       std::span<const int32_t> topk, int k) {
  PAGODA_REQUIRE(plan.batch_size() + 1 == static_cast<int>(meta.slot_indptr.size()),
                 kInvalidArgument, "sparse mask: {} requests planned, {} in the metadata",
                 plan.batch_size(), meta.slot_indptr.size() - 1);
  std::vector<int64_t> indptr{0};
  for (int b = 0; b < plan.batch_size(); ++b) {
    const int64_t qo = plan.qo_indptr[b + 1] - plan.qo_indptr[b];
    indptr.push_back(indptr.back() + (qo * plan.kv_len(b) + 7) / 8);
  }
  std::vector<uint8_t> mask(static_cast<size_t>(indptr.back()), 0);
  for_each_selection(meta, topk, k, "sparse mask", [&](int64_t t, std::span<const int32_t> sel) {
    const int b = meta.row_request[t];
    const int64_t i = t - plan.qo_indptr[b], kv = plan.kv_len(b);
    for (const int32_t pos : sel) {
      const int64_t bit = i * kv + pos;
      mask[indptr[b] + bit / 8] |= static_cast<uint8_t>(1u << (bit % 8));
    }
  });
  plan.custom_mask = std::move(mask);
  plan.mask_indptr = std::move(indptr);
}

namespace {

/// An empty page-size-1 plan for `rows` query rows of at most k keys each (the sparse gather
/// plans'); kInvalidArgument past the int32 index range.
PagedPlan token_granular_plan(size_t rows, int k) {
  PAGODA_REQUIRE(k >= 1 && static_cast<int64_t>(rows) * k <= INT32_MAX, kInvalidArgument,
                 "sparse gather: {} rows of k {} exceed the int32 index range", rows, k);
  PagedPlan p;
  p.page_size = 1;
  return p;
}

}  // namespace

PagedPlan sparse_gather_plan(const IndexerMetadata& meta, std::span<const int32_t> topk, int k) {
  const size_t rows = meta.row_request.size();
  PagedPlan p = token_granular_plan(rows, k);
  p.qo_indptr.reserve(rows + 1);
  p.kv_indptr.reserve(rows + 1);
  p.kv_last_page_len.reserve(rows);
  p.kv_indices.reserve(rows * static_cast<size_t>(k));
  p.qo_indptr.push_back(0);
  p.kv_indptr.push_back(0);
  for_each_selection(meta, topk, k, "sparse gather", [&](int64_t t, std::span<const int32_t> sel) {
    const int32_t* slots = meta.slots.data() + meta.slot_indptr[meta.row_request[t]];
    for (const int32_t pos : sel) p.kv_indices.push_back(slots[pos]);
    p.qo_indptr.push_back(static_cast<int32_t>(t + 1));
    p.kv_indptr.push_back(static_cast<int32_t>(p.kv_indices.size()));
    p.kv_last_page_len.push_back(sel.empty() ? 0 : 1);
  });
  return p;
}

int32_t row_seen(const IndexerMetadata& meta, int64_t t) {
  const int32_t visible = meta.row_visible[static_cast<size_t>(t)];
  if (meta.tree_size == 0) return visible;
  int32_t n = 0;
  for (int32_t p = 0; p < visible; ++p) n += meta.sees(t, p) ? 1 : 0;
  return n;
}

PagedPlan sparse_gather_shape(const IndexerMetadata& meta, int k) {
  const size_t rows = meta.row_request.size();
  PagedPlan p = token_granular_plan(rows, k);
  p.qo_indptr.resize(rows + 1);
  p.kv_indptr.resize(rows + 1);
  p.kv_last_page_len.resize(rows);
  for (size_t t = 0; t < rows; ++t) {
    const int32_t keep = std::min(k, row_seen(meta, static_cast<int64_t>(t)));
    p.qo_indptr[t + 1] = static_cast<int32_t>(t + 1);
    p.kv_indptr[t + 1] = p.kv_indptr[t] + keep;
    p.kv_last_page_len[t] = keep == 0 ? 0 : 1;
  }
  p.kv_indices.assign(static_cast<size_t>(p.kv_indptr[rows]), 0);
  return p;
}

void check_index_query(const kv::KvPool& pool, const IndexerMetadata& meta, const IndexerQuery& q,
                       int k, size_t topk_size, size_t scores_size, Device accepted) {
  PAGODA_REQUIRE(q.device.is_cpu() || q.device == accepted, kInvalidArgument,
                 "indexer: the queries are in {} memory, which this backend does not read "
                 "(host memory{})",
                 q.device.to_string(), accepted.is_cpu() ? "" : " or " + accepted.to_string());
  const int64_t d = pool.config().index_head_dim;
  PAGODA_REQUIRE(pool.index_row_bytes() > 0, kInvalidArgument,
                 "the DSA indexer needs a pool with index keys (index_head_dim 0)");
  const auto rows = static_cast<int64_t>(meta.row_request.size());
  PAGODA_REQUIRE(
      k >= 1 && q.heads >= 1 && q.dim == d && q.q != nullptr && q.w != nullptr, kInvalidArgument,
      "indexer: k {} and {} heads must be >= 1, dim {} must be the pool's index_head_dim "
      "{}, q and w given",
      k, q.heads, q.dim, d);
  const auto want = static_cast<size_t>(rows * k);
  PAGODA_REQUIRE(topk_size == want && (scores_size == 0 || scores_size == want), kInvalidArgument,
                 "indexer: topk has {} entries and scores {} for {} rows x k {} (scores may be "
                 "empty)",
                 topk_size, scores_size, rows, k);
}

void index_topk_host(const kv::KvPool& pool, LayerId layer, const IndexerMetadata& meta,
                     const IndexerQuery& q, int k, std::span<int32_t> topk, std::span<float> scores,
                     const IndexerFaults& faults) {
  PAGODA_REQUIRE(pool.device().is_cpu(), kUnsupported,
                 "index_topk_host reads a host pool (this one is on {})",
                 pool.device().to_string());
  check_index_query(pool, meta, q, k, topk.size(), scores.size());
  const int64_t d = pool.config().index_head_dim;
  const auto rows = static_cast<int64_t>(meta.row_request.size());
  const uint8_t* base = pool.index_rows(layer);
  const int64_t row_bytes = pool.index_row_bytes(), slots_total = pool.num_slots();
  const int64_t shift = faults.key_page_shift ? pool.page_size() : 0;
  // The dequantised keys of the current request's positions, decoded once for all of its rows
  // (a prefill chunk's rows share them); rows of one request are consecutive.
  std::vector<float> keys;
  int32_t keyed_request = -1;
  int64_t keyed = 0;  // positions of keyed_request decoded so far
  std::vector<double> score;
  std::vector<int32_t> order;
  std::vector<float> qt(static_cast<size_t>(q.heads * d));  // row t's queries on the key grid
  for (int64_t t = 0; t < rows; ++t) {
    const int32_t b = meta.row_request[static_cast<size_t>(t)];
    const int32_t visible = meta.row_visible[static_cast<size_t>(t)];
    const int32_t* slots = meta.slots.data() + meta.slot_indptr[static_cast<size_t>(b)];
    for (int32_t h = 0; h < q.heads; ++h)
      kv::round_to_index_grid(q.q + (t * q.heads + h) * d, d, qt.data() + int64_t{h} * d);
    const float* wt = q.w + t * q.heads;
    if (b != keyed_request) {
      keyed_request = b;
      keyed = 0;
    }
    if (keyed < visible) {
      keys.resize(static_cast<size_t>(visible * d));
      for (; keyed < visible; ++keyed) {
        const uint8_t* row = base + (slots[keyed] + shift) % slots_total * row_bytes;
        float scale = 1.f;
        if (!faults.ignore_scale) std::memcpy(&scale, row + d, sizeof(float));
        for (int64_t j = 0; j < d; ++j)
          keys[static_cast<size_t>(keyed * d + j)] = e4m3_to_f32(row[j]) * scale;
      }
    }
    score.assign(static_cast<size_t>(visible), 0.0);
    order.clear();
    for (int32_t p = 0; p < visible; ++p) {
      if (!meta.sees(t, p)) continue;  // a tree verify: a draft node off the row's path
      order.push_back(p);
      const float* key = keys.data() + int64_t{p} * d;
      double s = 0;
      for (int32_t h = 0; h < q.heads; ++h) {
        const float* qh = qt.data() + int64_t{h} * d;
        double dot = 0;
        for (int64_t j = 0; j < d; ++j) dot += static_cast<double>(qh[j]) * key[j];
        s += static_cast<double>(wt[h]) * std::max(dot, 0.0);
      }
      score[static_cast<size_t>(p)] = s;
    }
    const auto keep = std::min(order.size(), static_cast<size_t>(k));
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(),
                      [&](int32_t a, int32_t c) {
                        const double sa = score[static_cast<size_t>(a)];
                        const double sc = score[static_cast<size_t>(c)];
                        return sa != sc ? sa > sc : a < c;
                      });
    const size_t drop = faults.drop_best && keep > 0 ? 1 : 0;
    for (size_t i = 0; i < static_cast<size_t>(k); ++i) {
      const size_t at = static_cast<size_t>(t * k) + i;
      const bool kept = i + drop < keep;
      const int32_t p = kept ? order[i + drop] : -1;
      topk[at] = p;
      if (!scores.empty()) {
        scores[at] = kept ? static_cast<float>(score[static_cast<size_t>(p)])
                          : -std::numeric_limits<float>::infinity();
      }
    }
  }
}

}  // namespace pagoda::attention
