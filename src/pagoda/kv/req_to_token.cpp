#include "pagoda/kv/req_to_token.h"

#include <algorithm>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"

namespace pagoda::kv {

ReqToTokenTable::ReqToTokenTable(int32_t max_reqs, int32_t max_context_len)
    : max_reqs_(max_reqs), max_context_len_(max_context_len) {
  PAGODA_REQUIRE(max_reqs >= 0, kInvalidArgument, "max_reqs {} < 0", max_reqs);
  PAGODA_REQUIRE(max_context_len >= 1, kInvalidArgument, "max_context_len {} < 1",
                 max_context_len);
  table_.assign(static_cast<size_t>(max_reqs + 1) * static_cast<size_t>(max_context_len), 0);
  in_use_.assign(static_cast<size_t>(max_reqs) + 1, 0);
  dirty_.assign((static_cast<size_t>(max_reqs) + 1) * kNumMirrors, DirtyRange{});
  for (int32_t r = 1; r <= max_reqs; ++r) free_rows_.push_back(r);
}

void ReqToTokenTable::require_row(ReqSlot row) const {
  PAGODA_REQUIRE(row.value() >= 0 && row.value() <= max_reqs_, kOutOfRange,
                 "request row {} outside [0, {}]", row.value(), max_reqs_);
}

std::optional<ReqSlot> ReqToTokenTable::alloc() {
  if (free_rows_.empty()) return std::nullopt;
  const int32_t r = free_rows_.front();
  free_rows_.pop_front();
  in_use_[r] = 1;
  return ReqSlot(r);
}

bool ReqToTokenTable::in_use(ReqSlot row) const {
  require_row(row);
  return in_use_[row.value()] != 0;
}

void ReqToTokenTable::free(ReqSlot row) {
  require_row(row);
  PAGODA_REQUIRE(row.value() != 0, kOutOfRange, "request row 0 is reserved");
  PAGODA_REQUIRE(in_use_[row.value()], kFailedPrecondition, "request row {} is not in use",
                 row.value());
  in_use_[row.value()] = 0;
  free_rows_.push_back(row.value());
}

void ReqToTokenTable::write(ReqSlot row, int64_t begin, std::span<const SlotIndex> slots) {
  require_row(row);
  PAGODA_REQUIRE(in_use_[row.value()], kFailedPrecondition,
                 "write to request row {}, which is not in use", row.value());
  const int64_t end = begin + static_cast<int64_t>(slots.size());
  PAGODA_REQUIRE(begin >= 0 && end <= max_context_len_, kOutOfRange,
                 "write of positions [{}, {}) beyond the context length {}", begin, end,
                 max_context_len_);
  std::copy(slots.begin(), slots.end(),
            table_.begin() + static_cast<int64_t>(row.value()) * max_context_len_ + begin);
  if (slots.empty()) return;
  for (int m = 0; m < kNumMirrors; ++m) {
    DirtyRange& d = dirty_[static_cast<size_t>(row.value()) * kNumMirrors + m];
    if (d.begin == d.end) {
      d = {begin, end};
    } else {
      d = {std::min(d.begin, begin), std::max(d.end, end)};
    }
  }
}

ReqToTokenTable::DirtyRange ReqToTokenTable::dirty(ReqSlot row, Mirror mirror) const {
  require_row(row);
  return dirty_[static_cast<size_t>(row.value()) * kNumMirrors + static_cast<size_t>(mirror)];
}

void ReqToTokenTable::mark_clean(ReqSlot row, int64_t upto, Mirror mirror) {
  require_row(row);
  DirtyRange& d =
      dirty_[static_cast<size_t>(row.value()) * kNumMirrors + static_cast<size_t>(mirror)];
  if (d.end <= upto) {
    d = {};
  } else {
    d.begin = std::max(d.begin, upto);
  }
}

std::span<const SlotIndex> ReqToTokenTable::row(ReqSlot row) const {
  require_row(row);
  return {table_.data() + static_cast<size_t>(row.value()) * max_context_len_,
          static_cast<size_t>(max_context_len_)};
}

std::span<const SlotIndex> ReqToTokenTable::read(ReqSlot row, int64_t begin, int64_t len) const {
  PAGODA_REQUIRE(begin >= 0 && len >= 0 && begin + len <= max_context_len_, kOutOfRange,
                 "read of positions [{}, {}) beyond the context length {}", begin, begin + len,
                 max_context_len_);
  return this->row(row).subspan(static_cast<size_t>(begin), static_cast<size_t>(len));
}

void ReqToTokenTable::check_integrity() const {
  PAGODA_CHECK_EQ(in_use_[0], 0);
  int32_t in_use = 0;
  for (int32_t r = 1; r <= max_reqs_; ++r) in_use += in_use_[r] ? 1 : 0;
  PAGODA_CHECK_EQ(in_use + static_cast<int32_t>(free_rows_.size()), max_reqs_);
  for (int32_t r : free_rows_) PAGODA_CHECK(!in_use_[r], "free row {} marked in use", r);
  for (int32_t i = 0; i < max_context_len_; ++i) PAGODA_CHECK_EQ(table_[i], 0);
}

}  // namespace pagoda::kv
