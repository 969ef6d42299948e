#pragma once
/// SwaTable: the request table the window layers read on the SWA pool (docs/design/kv.md §SWA).
/// It has the full ReqToTokenTable's rows; for a step whose request in row r has its first query
/// at position q and kv_len keys, row r must hold, over [0, kv_len):
///   positions [lo, kv_len), lo = max(0, q - window_left) rounded down to a page: the SWA slot of
///     the full slot there (SwaPages::swa_slot), which must exist (PAGODA_CHECK);
///   positions [0, lo): slot i % P, the reserved page 0 — never read (the window masks them), but
///     the planners want every page of a row contiguous.
/// update() brings a row there incrementally: it rewrites the positions the full table wrote in
/// that row since the row's last update (the full table's Mirror::kSwaTable dirty ranges: new
/// tokens, a new request in the row, the radix cache re-pointing a chunk at its own pages) and
/// points the pages that slid below lo since then at page 0. The rest of the row is unchanged:
/// the engine changes the SWA page of a position a window still reads only together with a
/// table write (SwaRadixCache's revive re-points the row), and releases SWA pages only below lo.
/// Cost per update: O(positions written + P x pages slid out), not O(kv_len).
///
/// Only one SwaTable may follow a full table (it owns the kSwaTable ranges). Both tables, the
/// SwaPages and this object are used by one thread.

#include <cstdint>
#include <vector>

#include "pagoda/core/ids.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/kv/swa_pages.h"

namespace pagoda::kv {

class SwaTable {
 public:
  /// Follows `full` (rows 1..full.max_reqs(), all usable here whether or not `full` has them in
  /// use) through `pages`; `window_left` >= 0 is the largest window of the model's layers. All
  /// must outlive this.
  SwaTable(ReqToTokenTable& full, const SwaPages& pages, int window_left);

  /// The table of SWA slots: the window layers' backend reads it; only update() writes it.
  ReqToTokenTable& table() { return table_; }
  const ReqToTokenTable& table() const { return table_; }

  /// Makes row `row` (in use in the full table) right for a step with first query `first_query`
  /// and `kv_len` keys (0 <= first_query < kv_len <= max_context_len), as described above, and
  /// marks [0, kv_len) of the full row clean for Mirror::kSwaTable. Throws kOutOfRange for a bad
  /// row or range (nothing changed).
  void update(ReqSlot row, int64_t first_query, int64_t kv_len);

  /// The first position of the SWA-slot part of a row for `first_query` (lo above).
  int64_t window_begin(int64_t first_query) const;

 private:
  /// Writes row positions [begin, end) from the full table: page 0 below lo, SWA slots above.
  void translate(ReqSlot row, int64_t begin, int64_t end, int64_t lo);

  ReqToTokenTable* full_;
  const SwaPages* pages_;
  int window_left_;
  ReqToTokenTable table_;
  std::vector<int64_t> lo_;  ///< per row: lo of its last update (0 before the first)
  std::vector<SlotIndex> scratch_;
};

}  // namespace pagoda::kv
