#include "pagoda/kv/swa_table.h"

#include <algorithm>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"

namespace pagoda::kv {

SwaTable::SwaTable(ReqToTokenTable& full, const SwaPages& pages, int window_left)
    : full_(&full),
      pages_(&pages),
      window_left_(window_left),
      table_(full.max_reqs(), full.max_context_len()),
      lo_(static_cast<size_t>(full.max_reqs()) + 1, 0) {
  PAGODA_REQUIRE(window_left >= 0, kInvalidArgument, "SwaTable needs window_left >= 0 (got {})",
                 window_left);
  while (table_.alloc().has_value()) {  // every row usable: they follow the full table's
  }
}

int64_t SwaTable::window_begin(int64_t first_query) const {
  const int64_t p = pages_->page_size();
  return std::max<int64_t>(0, first_query - window_left_) / p * p;
}

void SwaTable::translate(ReqSlot row, int64_t begin, int64_t end, int64_t lo) {
  if (begin >= end) return;
  const int64_t p = pages_->page_size();
  const auto full = full_->read(row, begin, end - begin);
  scratch_.resize(full.size());
  for (int64_t i = begin; i < end; ++i) {
    SlotIndex& s = scratch_[static_cast<size_t>(i - begin)];
    if (i < lo) {
      s = static_cast<SlotIndex>(i % p);
      continue;
    }
    s = pages_->swa_slot(full[static_cast<size_t>(i - begin)]);
    PAGODA_CHECK(s >= 0, "position {} of row {} is read by a window layer but its page has no "
                 "SWA page", i, row.value());
  }
  table_.write(row, begin, scratch_);
}

void SwaTable::update(ReqSlot row, int64_t first_query, int64_t kv_len) {
  PAGODA_REQUIRE(row.value() >= 1 && row.value() <= full_->max_reqs() && full_->in_use(row),
                 kOutOfRange, "SwaTable::update of row {}, which the full table does not use",
                 row.value());
  PAGODA_REQUIRE(first_query >= 0 && first_query < kv_len && kv_len <= full_->max_context_len(),
                 kOutOfRange, "SwaTable::update: first query {} and kv_len {} (context {})",
                 first_query, kv_len, full_->max_context_len());
  const int64_t lo = window_begin(first_query);
  int64_t& last_lo = lo_[static_cast<size_t>(row.value())];
  // Pages that slid below the window since the last update now point at page 0; a window that
  // moved back (a new request in the row) gets its SWA slots again.
  translate(row, std::min(last_lo, lo), std::min(std::max(last_lo, lo), kv_len), lo);
  const ReqToTokenTable::DirtyRange d = full_->dirty(row, ReqToTokenTable::Mirror::kSwaTable);
  translate(row, d.begin, std::min(d.end, kv_len), lo);
  full_->mark_clean(row, kv_len, ReqToTokenTable::Mirror::kSwaTable);
  last_lo = lo;
}

}  // namespace pagoda::kv
