#pragma once
/// ReqToTokenTable: the [max_reqs + 1, max_context_len] int32 table mapping (request row,
/// token position) -> KV slot (sglang_spec §3.1). Row 0 is reserved as the padding row of
/// CUDA-graph batches: it is never handed out, never written, and reads as all zeros (slot 0).
///
/// Storage is host memory today; data() / device() / row_stride() are the shape a device mirror
/// will keep (a CUDA engine copies or mirrors the same layout). A copy kept elsewhere (the
/// tensor-parallel followers' tables, the SWA pool's table of kv::SwaTable) follows through dirty
/// ranges: every write widens its row's range of every mirror (Mirror), and each mirror marks
/// what it took clean in its own ranges, so a step costs what changed, not the rows' lengths.
/// Thread rules: not thread-safe.

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <vector>

#include "pagoda/core/device.h"
#include "pagoda/core/ids.h"

namespace pagoda::kv {

class ReqToTokenTable {
 public:
  /// A table of `max_reqs` usable rows (1..max_reqs) of `max_context_len` slots, zero-filled.
  /// Requires max_reqs >= 0 and max_context_len >= 1.
  ReqToTokenTable(int32_t max_reqs, int32_t max_context_len);

  int32_t max_reqs() const { return max_reqs_; }
  int32_t max_context_len() const { return max_context_len_; }
  /// Rows not in use.
  int32_t num_free_rows() const { return static_cast<int32_t>(free_rows_.size()); }

  /// Takes the lowest-numbered row that has been free longest (FIFO reuse, like SGLang's list).
  /// Empty optional when all rows are in use. The row keeps whatever it held before.
  std::optional<ReqSlot> alloc();
  /// Returns `row` to the free list. Throws kOutOfRange for row 0 or outside [1, max_reqs],
  /// kFailedPrecondition when the row is not in use (double free). Unchanged on throw.
  void free(ReqSlot row);
  bool in_use(ReqSlot row) const;

  /// Writes slots into positions [begin, begin + slots.size()) of `row`. Throws (unchanged) when
  /// the row is not in use or the range leaves [0, max_context_len).
  void write(ReqSlot row, int64_t begin, std::span<const SlotIndex> slots);
  /// The whole row (max_context_len entries), read-only. Row 0 allowed. Throws when out of range.
  std::span<const SlotIndex> row(ReqSlot row) const;
  /// Positions [begin, begin + len) of `row`; throws when the range leaves the row.
  std::span<const SlotIndex> read(ReqSlot row, int64_t begin, int64_t len) const;

  /// The copies that follow the table, each with its own dirty ranges.
  enum class Mirror : uint8_t {
    kFollowers,  ///< the tensor-parallel followers' tables (engine/tp.h)
    kSwaTable,   ///< the SWA pool's request table (kv/swa_table.h)
  };
  static constexpr int kNumMirrors = 2;
  /// Positions of `row` written since `mirror` last marked them clean, as one covering range
  /// [begin, end) (begin == end: nothing). Throws when the row is out of range.
  struct DirtyRange {
    int64_t begin = 0, end = 0;
  };
  DirtyRange dirty(ReqSlot row, Mirror mirror = Mirror::kFollowers) const;
  /// Marks positions [0, upto) of `row` clean for `mirror`; dirty positions at or past `upto`
  /// stay dirty.
  void mark_clean(ReqSlot row, int64_t upto, Mirror mirror = Mirror::kFollowers);

  /// Raw table, row-major [max_reqs + 1, max_context_len] int32.
  const SlotIndex* data() const { return table_.data(); }
  int64_t row_stride() const { return max_context_len_; }
  Device device() const { return Device::cpu(); }

  /// Aborts when the free list and the in-use flags disagree or row 0 is not all zeros.
  void check_integrity() const;

 private:
  void require_row(ReqSlot row) const;

  int32_t max_reqs_;
  int32_t max_context_len_;
  std::vector<SlotIndex> table_;
  std::vector<uint8_t> in_use_;
  std::vector<DirtyRange> dirty_;  // per row, kNumMirrors each
  std::deque<int32_t> free_rows_;
};

}  // namespace pagoda::kv
