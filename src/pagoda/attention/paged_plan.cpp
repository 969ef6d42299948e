#include "pagoda/attention/paged_plan.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"
#include "pagoda/kv/req_to_token.h"

namespace pagoda::attention {

PagedPlanInput PagedPlan::input() const {
  return PagedPlanInput{.qo_indptr = qo_indptr,
                        .kv_indptr = kv_indptr,
                        .kv_indices = kv_indices,
                        .kv_last_page_len = kv_last_page_len,
                        .page_size = page_size,
                        .custom_mask = custom_mask,
                        .mask_indptr = mask_indptr};
}

PagedPlan PagedPlan::copy_of(const PagedPlanInput& in) {
  PagedPlan p;
  p.qo_indptr.assign(in.qo_indptr.begin(), in.qo_indptr.end());
  p.kv_indptr.assign(in.kv_indptr.begin(), in.kv_indptr.end());
  p.kv_indices.assign(in.kv_indices.begin(), in.kv_indices.end());
  p.kv_last_page_len.assign(in.kv_last_page_len.begin(), in.kv_last_page_len.end());
  p.custom_mask.assign(in.custom_mask.begin(), in.custom_mask.end());
  p.mask_indptr.assign(in.mask_indptr.begin(), in.mask_indptr.end());
  p.page_size = in.page_size;
  return p;
}

namespace {

/// Token-granular rows: row r has qo_lens[r] queries and keys slots[tok_indptr[r], tok_indptr[r+1]).
struct TokenRows {
  std::vector<int32_t> qo_lens;
  std::vector<int64_t> tok_indptr{0};
  std::vector<int32_t> slots;
};

class TableReader {
 public:
  TableReader(const kv::ReqToTokenTable& table, const ForwardBatch& batch)
      : table_(table), batch_(batch) {}

  /// Appends positions [kv_start(b), len) of request b's row to `out`.
  void append_prefix(int b, int len, std::vector<int32_t>& out) const {
    append_range(b, kv_start(b), len, out);
  }

  /// Appends positions [lo, hi) of request b's row to `out` (lo <= hi checked by the caller).
  void append_range(int b, int lo, int hi, std::vector<int32_t>& out) const {
    const int32_t row = batch_.req_pool_indices[b];
    PAGODA_REQUIRE(row >= 0 && row < table_.max_reqs() + 1, kOutOfRange,
                   "request {}: req_pool_index {} outside the table's rows [0, {})", b, row,
                   table_.max_reqs() + 1);
    PAGODA_REQUIRE(hi >= 0 && hi <= table_.max_context_len(), kOutOfRange,
                   "request {}: kv length {} outside [0, {}] (the table's max_context_len)", b, hi,
                   table_.max_context_len());
    const auto slots = table_.row(ReqSlot(row));
    for (int i = lo; i < hi; ++i) {
      PAGODA_REQUIRE(slots[i] >= 0, kInvalidArgument,
                     "request {}: position {} of table row {} holds no slot ({})", b, i, row,
                     slots[i]);
      out.push_back(slots[i]);
    }
  }

  /// Request b's first key position (ForwardBatch::kv_start), validated by check_kv_start.
  int kv_start(int b) const { return batch_.kv_start.empty() ? 0 : batch_.kv_start[b]; }

 private:
  const kv::ReqToTokenTable& table_;
  const ForwardBatch& batch_;
};

void require_size(size_t got, int64_t want, const char* what) {
  PAGODA_REQUIRE(static_cast<int64_t>(got) == want, kInvalidArgument,
                 "ForwardBatch.{} has {} entries, expected {}", what, got, want);
}

/// ForwardBatch::kv_start: empty, or per request a multiple of the page size at or before the
/// request's first query position (so every query keeps its own key); not under a tree mask.
void check_kv_start(const ForwardBatch& batch, int page_size) {
  if (batch.kv_start.empty()) return;
  require_size(batch.kv_start.size(), batch.batch_size, "kv_start");
  PAGODA_REQUIRE(batch.mode != ForwardMode::kTargetVerify, kUnsupported,
                 "ForwardBatch.kv_start with target verify (its tree mask spans every key)");
  if (batch.mode != ForwardMode::kDecode)
    require_size(batch.extend_prefix_lens.size(), batch.batch_size, "extend_prefix_lens");
  for (int b = 0; b < batch.batch_size; ++b) {
    const int64_t first_query = batch.mode == ForwardMode::kDecode
                                    ? int64_t{batch.seq_lens[b]} - (batch.is_draft_step() ? 0 : 1)
                                    : int64_t{batch.extend_prefix_lens[b]};
    const int32_t s = batch.kv_start[b];
    PAGODA_REQUIRE(s >= 0 && s <= std::max<int64_t>(first_query, 0) && s % page_size == 0,
                   kInvalidArgument,
                   "request {}: kv_start {} must be a multiple of the page size {} in [0, {}] "
                   "(its first query position)",
                   b, s, page_size, std::max<int64_t>(first_query, 0));
  }
}

TokenRows rows_for_decode(const ForwardBatch& batch, const TableReader& table) {
  TokenRows rows;
  const int bs = batch.batch_size;
  require_size(batch.out_cache_loc.size(), bs, "out_cache_loc (one per request in decode)");
  for (int b = 0; b < bs; ++b) {
    PAGODA_REQUIRE(batch.seq_lens[b] >= 1, kInvalidArgument,
                   "decode request {}: seq_len {} must include the decoded token (>= 1)", b,
                   batch.seq_lens[b]);
    rows.qo_lens.push_back(1);
    table.append_prefix(b, batch.seq_lens[b], rows.slots);
    rows.tok_indptr.push_back(static_cast<int64_t>(rows.slots.size()));
  }
  return rows;
}

TokenRows rows_for_draft_step(const ForwardBatch& batch, const TableReader& table) {
  TokenRows rows;
  const SpecInfo& spec = batch.spec;
  const int bs = batch.batch_size;
  PAGODA_REQUIRE(spec.topk >= 1 && spec.num_steps >= 1, kInvalidArgument,
                 "draft step needs topk >= 1 and num_steps >= 1 (got {}, {})", spec.topk,
                 spec.num_steps);
  PAGODA_REQUIRE(spec.draft_step < spec.num_steps, kOutOfRange,
                 "draft_step {} outside [0, num_steps {})", spec.draft_step, spec.num_steps);
  require_size(spec.draft_slots.size(), int64_t{bs} * spec.topk * spec.num_steps,
               "spec.draft_slots ([bs][topk][num_steps])");
  require_size(batch.out_cache_loc.size(), int64_t{bs} * spec.topk,
               "out_cache_loc (bs * topk in a draft step)");
  for (int b = 0; b < bs; ++b) {
    PAGODA_REQUIRE(batch.seq_lens[b] >= 0, kInvalidArgument, "draft request {}: seq_len {} < 0",
                   b, batch.seq_lens[b]);
    for (int t = 0; t < spec.topk; ++t) {
      rows.qo_lens.push_back(1);
      table.append_prefix(b, batch.seq_lens[b], rows.slots);
      const int64_t base = (int64_t{b} * spec.topk + t) * spec.num_steps;
      for (int j = 0; j <= spec.draft_step; ++j) {
        const int32_t s = spec.draft_slots[base + j];
        PAGODA_REQUIRE(s >= 0, kInvalidArgument, "draft slot [{}][{}][{}] is {}", b, t, j, s);
        rows.slots.push_back(s);
      }
      rows.tok_indptr.push_back(static_cast<int64_t>(rows.slots.size()));
    }
  }
  return rows;
}

/// `windows` (ragged plans): each request's keys are its window's positions instead.
TokenRows rows_for_extend(const ForwardBatch& batch, const TableReader& table,
                          const KeyWindows& windows = {}) {
  TokenRows rows;
  const int bs = batch.batch_size;
  require_size(batch.extend_seq_lens.size(), bs, "extend_seq_lens");
  require_size(batch.extend_prefix_lens.size(), bs, "extend_prefix_lens");
  int64_t total = 0;
  for (int b = 0; b < bs; ++b) {
    const int ext = batch.extend_seq_lens[b], pre = batch.extend_prefix_lens[b];
    PAGODA_REQUIRE(ext >= 0 && pre >= 0 && pre + ext == batch.seq_lens[b], kInvalidArgument,
                   "{} request {}: prefix {} + extend {} != seq_len {}",
                   forward_mode_name(batch.mode), b, pre, ext, batch.seq_lens[b]);
    if (batch.mode == ForwardMode::kDraftExtend) {
      // At least the bonus token; at most every draft step's token plus it.
      const int most = batch.spec.num_steps > 0 ? batch.spec.num_steps + 1 : ext;
      PAGODA_REQUIRE(ext >= 1 && ext <= most, kInvalidArgument,
                     "draft_extend request {}: extend_seq_lens {} accepted tokens outside [1, {}]",
                     b, ext, std::max(most, 1));
    }
    total += ext;
    rows.qo_lens.push_back(ext);
    if (windows.all())
      table.append_prefix(b, batch.seq_lens[b], rows.slots);
    else
      table.append_range(b, windows.begin[b], windows.end[b], rows.slots);
    rows.tok_indptr.push_back(static_cast<int64_t>(rows.slots.size()));
  }
  require_size(batch.out_cache_loc.size(), total, "out_cache_loc (sum of extend_seq_lens)");
  return rows;
}

/// Verify rows plus the packed tree mask (SGLang FULL_MASK bytes -> little-endian bits).
TokenRows rows_for_verify(const ForwardBatch& batch, const TableReader& table, PagedPlan& plan) {
  TokenRows rows;
  const int bs = batch.batch_size;
  const int d = batch.spec.num_draft_tokens;
  PAGODA_REQUIRE(d >= 1, kInvalidArgument, "target verify needs spec.num_draft_tokens >= 1");
  require_size(batch.out_cache_loc.size(), int64_t{bs} * d,
               "out_cache_loc (bs * num_draft_tokens in target verify)");
  int64_t mask_bytes = 0;
  for (int b = 0; b < bs; ++b) {
    PAGODA_REQUIRE(batch.seq_lens[b] >= 0, kInvalidArgument, "verify request {}: seq_len {} < 0",
                   b, batch.seq_lens[b]);
    if (!batch.extend_seq_lens.empty()) {
      PAGODA_REQUIRE(batch.extend_seq_lens[b] == d, kInvalidArgument,
                     "verify request {}: extend_seq_len {} != num_draft_tokens {}", b,
                     batch.extend_seq_lens[b], d);
    }
    rows.qo_lens.push_back(d);
    table.append_prefix(b, batch.seq_lens[b] + d, rows.slots);
    rows.tok_indptr.push_back(static_cast<int64_t>(rows.slots.size()));
    mask_bytes += int64_t{d} * (batch.seq_lens[b] + d);
  }
  const auto& full = batch.spec.tree_mask;
  if (full.empty()) return rows;  // a chain (topk 1): plain bottom-right causal
  require_size(full.size(), mask_bytes, "spec.tree_mask (sum of D * (seq_len + D) bytes)");
  plan.mask_indptr.assign(1, 0);
  int64_t src = 0;
  for (int b = 0; b < bs; ++b) {
    const int64_t kv_len = batch.seq_lens[b] + d;
    const int64_t bits = int64_t{d} * kv_len;
    const int64_t begin = plan.mask_indptr.back();
    plan.custom_mask.resize(static_cast<size_t>(begin + (bits + 7) / 8), 0);
    for (int64_t i = 0; i < bits; ++i) {
      const uint8_t byte = full[static_cast<size_t>(src + i)];
      PAGODA_REQUIRE(byte <= 1, kInvalidArgument,
                     "tree_mask byte {} of request {} is {} (expected 0 or 1)", i, b, byte);
      if (byte) plan.custom_mask[static_cast<size_t>(begin + i / 8)] |= uint8_t(1u << (i % 8));
    }
    for (int q = 0; q < d; ++q) {
      PAGODA_REQUIRE(full[static_cast<size_t>(src + q * kv_len + batch.seq_lens[b] + q)] == 1,
                     kInvalidArgument, "tree_mask of request {}: draft token {} cannot see itself",
                     b, q);
    }
    src += bits;
    plan.mask_indptr.push_back(static_cast<int64_t>(plan.custom_mask.size()));
  }
  return rows;
}

/// True when every token i of the row sits at page_of(i) * P + i % P (sglang invariant 1).
bool page_contiguous(std::span<const int32_t> slots, int page_size) {
  // Token i at page_of(i) * P + i % P: each page's first slot a multiple of P, the rest of the
  // page consecutive after it. Checked per page (one remainder per page, not two divisions per
  // token: a decode step plans every token of its context).
  const size_t n = slots.size(), p = static_cast<size_t>(page_size);
  for (size_t i0 = 0; i0 < n; i0 += p) {
    const int32_t first = slots[i0];
    if (first % page_size != 0) return false;
    const size_t end = std::min(n, i0 + p);
    bool consecutive = true;
    for (size_t i = i0 + 1; i < end; ++i)
      consecutive &= slots[i] == first + static_cast<int32_t>(i - i0);
    if (!consecutive) return false;
  }
  return true;
}

}  // namespace

PagedPlan build_paged_plan(const ForwardBatch& batch, const kv::ReqToTokenTable& req_to_token,
                           int pool_page_size) {
  PAGODA_REQUIRE(pool_page_size >= 1, kInvalidArgument, "page size {} < 1", pool_page_size);
  const int bs = batch.batch_size;
  PAGODA_REQUIRE(bs >= 0, kInvalidArgument, "batch_size {} < 0", bs);
  PagedPlan plan;
  if (batch.mode == ForwardMode::kIdle) {
    PAGODA_REQUIRE(bs == 0, kInvalidArgument, "an idle batch has batch_size 0, got {}", bs);
    plan.qo_indptr = {0};
    plan.kv_indptr = {0};
    plan.page_size = pool_page_size;
    return plan;
  }
  require_size(batch.req_pool_indices.size(), bs, "req_pool_indices");
  require_size(batch.seq_lens.size(), bs, "seq_lens");
  if (!batch.positions.empty()) {
    require_size(batch.positions.size(), batch.num_tokens(), "positions (one per query token)");
  }
  check_kv_start(batch, pool_page_size);
  const TableReader table(req_to_token, batch);
  TokenRows rows;
  switch (batch.mode) {
    case ForwardMode::kDecode:
      rows = batch.is_draft_step() ? rows_for_draft_step(batch, table)
                                   : rows_for_decode(batch, table);
      break;
    case ForwardMode::kExtend:
    case ForwardMode::kMixed:
    case ForwardMode::kDraftExtend:
      rows = rows_for_extend(batch, table);
      break;
    case ForwardMode::kTargetVerify:
      rows = rows_for_verify(batch, table, plan);
      break;
    case ForwardMode::kIdle:
      break;
  }
  const int num_rows = static_cast<int>(rows.qo_lens.size());
  plan.qo_indptr.assign(1, 0);
  for (int r = 0; r < num_rows; ++r) plan.qo_indptr.push_back(plan.qo_indptr.back() + rows.qo_lens[r]);
  PAGODA_CHECK_EQ(plan.qo_indptr.back(), batch.num_tokens());

  auto row_slots = [&](int r) {
    return std::span<const int32_t>(rows.slots).subspan(
        static_cast<size_t>(rows.tok_indptr[r]),
        static_cast<size_t>(rows.tok_indptr[r + 1] - rows.tok_indptr[r]));
  };
  int page = pool_page_size;
  for (int r = 0; r < num_rows && page > 1; ++r) {
    if (page_contiguous(row_slots(r), page)) continue;
    PAGODA_REQUIRE(batch.is_draft_step(), kInvalidArgument,
                   "{} row {}: its slots are not page-contiguous for page size {} (a request's "
                   "token i must sit at page_of(i) * page_size + i % page_size)",
                   forward_mode_name(batch.mode), r, page);
    page = 1;  // a draft branch that does not continue its prefix's last page
  }
  plan.page_size = page;
  plan.kv_indptr.assign(1, 0);
  for (int r = 0; r < num_rows; ++r) {
    const auto slots = row_slots(r);
    for (size_t i = 0; i < slots.size(); i += static_cast<size_t>(page)) {
      plan.kv_indices.push_back(slots[i] / page);
    }
    plan.kv_indptr.push_back(static_cast<int32_t>(plan.kv_indices.size()));
    const int64_t n = static_cast<int64_t>(slots.size());
    plan.kv_last_page_len.push_back(n == 0 ? 0 : static_cast<int32_t>(n - (n - 1) / page * page));
  }
  return plan;
}

RaggedPlan build_ragged_plan(const ForwardBatch& batch, const kv::ReqToTokenTable& req_to_token,
                             const KeyWindows& windows) {
  PAGODA_REQUIRE(batch.mode == ForwardMode::kExtend || batch.mode == ForwardMode::kMixed,
                 kInvalidArgument, "a ragged plan is for extend or mixed steps, not {}",
                 forward_mode_name(batch.mode));
  PAGODA_REQUIRE(batch.kv_start.empty(), kInvalidArgument,
                 "a ragged plan covers every key of a request (ForwardBatch.kv_start is set)");
  const int bs = batch.batch_size;
  PAGODA_REQUIRE(bs >= 0, kInvalidArgument, "batch_size {} < 0", bs);
  require_size(batch.req_pool_indices.size(), bs, "req_pool_indices");
  require_size(batch.seq_lens.size(), bs, "seq_lens");
  RaggedPlan r;
  if (!windows.all()) {
    require_size(windows.begin.size(), bs, "key windows (begin)");
    require_size(windows.end.size(), bs, "key windows (end)");
    require_size(batch.extend_prefix_lens.size(), bs, "extend_prefix_lens");
    bool ends_at_len = false, ends_in_prefix = false;
    for (int b = 0; b < bs; ++b) {
      const int32_t lo = windows.begin[b], hi = windows.end[b], len = batch.seq_lens[b];
      PAGODA_REQUIRE(lo >= 0 && lo <= hi && hi <= len, kInvalidArgument,
                     "key window [{}, {}) of request {} is not inside its {} keys", lo, hi, b, len);
      if (lo == hi) continue;
      ends_at_len |= hi == len;
      ends_in_prefix |= hi <= batch.extend_prefix_lens[b];
      PAGODA_REQUIRE(hi == len || hi <= batch.extend_prefix_lens[b], kInvalidArgument,
                     "key window [{}, {}) of request {} ends inside its new tokens (prefix {}, {} "
                     "keys): a window ends at the request's last key or within its prefix",
                     lo, hi, b, batch.extend_prefix_lens[b], len);
    }
    PAGODA_REQUIRE(!(ends_at_len && ends_in_prefix), kInvalidArgument,
                   "key windows of one ragged call mix causal ones (ending at a request's last "
                   "key) and prefix ones");
    r.mask = ends_at_len || !ends_in_prefix ? MaskKind::kCausal : MaskKind::kNonCausal;
    r.begin.assign(windows.begin.begin(), windows.begin.end());
    r.end.assign(windows.end.begin(), windows.end.end());
  }
  TokenRows rows = rows_for_extend(batch, TableReader(req_to_token, batch), windows);
  PAGODA_REQUIRE(rows.tok_indptr.back() <= std::numeric_limits<int32_t>::max(), kOutOfRange,
                 "a ragged plan of {} keys exceeds int32 indices", rows.tok_indptr.back());
  PagedPlan& p = r.plan;
  p.page_size = 1;
  p.qo_indptr.assign(1, 0);
  p.kv_indptr.assign(1, 0);
  for (int b = 0; b < bs; ++b) {
    const auto keys = static_cast<int32_t>(rows.tok_indptr[b + 1] - rows.tok_indptr[b]);
    p.qo_indptr.push_back(p.qo_indptr.back() + rows.qo_lens[static_cast<size_t>(b)]);
    p.kv_indptr.push_back(static_cast<int32_t>(rows.tok_indptr[b + 1]));
    p.kv_last_page_len.push_back(keys > 0 ? 1 : 0);
  }
  p.kv_indices.resize(rows.slots.size());
  std::iota(p.kv_indices.begin(), p.kv_indices.end(), 0);
  r.slots = std::move(rows.slots);
  return r;
}

size_t RaggedPlans::find_or_build(const ForwardBatch& batch,
                                  const kv::ReqToTokenTable& req_to_token,
                                  const KeyWindows& windows, bool& built) {
  for (size_t i = 0; i < plans_.size(); ++i)
    if (plans_[i].covers(windows)) {
      built = false;
      return i;
    }
  plans_.push_back(build_ragged_plan(batch, req_to_token, windows));
  built = true;
  return plans_.size() - 1;
}

bool RaggedPlan::covers(const KeyWindows& windows) const {
  return std::equal(begin.begin(), begin.end(), windows.begin.begin(), windows.begin.end()) &&
         std::equal(end.begin(), end.end(), windows.end.begin(), windows.end.end());
}

}  // namespace pagoda::attention
