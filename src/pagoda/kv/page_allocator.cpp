#include "pagoda/kv/page_allocator.h"

#include <algorithm>
#include <limits>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"

namespace pagoda::kv {

namespace {

/// The slots of whole pages `runs` (the PageRefs defaults' expansion).
std::vector<SlotIndex> run_slots(std::span<const PageRun> runs, int32_t page_size) {
  std::vector<SlotIndex> slots;
  for (const PageRun& run : runs) {
    PAGODA_REQUIRE(run.count >= 1 && run.first >= 0, kInvalidArgument,
                   "page run [{}, +{}): needs first >= 0 and count >= 1", run.first, run.count);
    const int64_t begin = int64_t{run.first} * page_size;
    const int64_t end = (int64_t{run.first} + run.count) * page_size;
    PAGODA_REQUIRE(end <= std::numeric_limits<SlotIndex>::max(), kOutOfRange,
                   "page run [{}, +{}) beyond the slot range", run.first, run.count);
    for (int64_t s = begin; s < end; ++s) slots.push_back(static_cast<SlotIndex>(s));
  }
  return slots;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

void PageRefs::retain_pages(std::span<const PageRun> runs) {
  retain(run_slots(runs, page_size()));
}
void PageRefs::free_pages(std::span<const PageRun> runs) { free(run_slots(runs, page_size())); }
void PageRefs::require_held_pages(std::span<const PageRun> runs) const {
  require_held_runs(run_slots(runs, page_size()));
}

PageAllocator::PageAllocator(int32_t num_pages, int32_t page_size)
    : num_pages_(num_pages), page_size_(page_size) {
  PAGODA_REQUIRE(num_pages >= 0, kInvalidArgument, "num_pages {} < 0", num_pages);
  PAGODA_REQUIRE(page_size >= 1, kInvalidArgument, "page_size {} < 1", page_size);
  PAGODA_REQUIRE((int64_t{num_pages} + 1) * page_size < (int64_t{1} << 31), kInvalidArgument,
                 "{} pages of {} slots exceed the int32 slot range", num_pages, page_size);
  free_stack_.resize(static_cast<size_t>(num_pages));
  refcount_.assign(static_cast<size_t>(num_pages) + 1, 0);
  pending_.reserve(static_cast<size_t>(num_pages));
  if ((page_size & (page_size - 1)) == 0) {
    while ((1 << page_shift_) < page_size) ++page_shift_;
  } else {
    page_shift_ = -1;
  }
  clear();
}

void PageAllocator::clear() {
  // Page 1 on top: free_stack_ = [N, N-1, ..., 1].
  for (int32_t i = 0; i < num_pages_; ++i) free_stack_[i] = num_pages_ - i;
  std::fill(refcount_.begin(), refcount_.end(), 0);
  free_top_ = num_pages_;
  num_referenced_ = 0;
  pending_.clear();
  in_free_group_ = false;
  ++mutation_epoch_;
}

int32_t PageAllocator::refcount(PageId page) const {
  PAGODA_REQUIRE(page.value() >= 0 && page.value() <= num_pages_, kOutOfRange,
                 "page {} outside [0, {}]", page.value(), num_pages_);
  if (page.value() == 0) return 0;
  return held_refcount(page.value());
}

void PageAllocator::push_free_page(int32_t page) {
  free_stack_[free_top_] = page;
  ++free_top_;
}

std::optional<std::vector<SlotIndex>> PageAllocator::alloc(int64_t num_tokens) {
  PAGODA_REQUIRE(num_tokens >= 0 && num_tokens % page_size_ == 0, kInvalidArgument,
                 "alloc({}) needs a non-negative multiple of page_size {}", num_tokens, page_size_);
  const int64_t pages = num_tokens / page_size_;
  if (pages > free_top_) return std::nullopt;
  std::vector<SlotIndex> out(static_cast<size_t>(num_tokens));
  size_t k = 0;
  for (int64_t i = 0; i < pages; ++i) {
    const SlotIndex base = pop_free_page() * page_size_;
    for (int32_t j = 0; j < page_size_; ++j) out[k++] = base + j;
  }
  return out;
}

void PageAllocator::validate_last_loc(int64_t b, int32_t pre, SlotIndex last_loc) const {
  if (pre == 0) {
    PAGODA_REQUIRE(last_loc == -1, kInvalidArgument,
                   "request {}: empty prefix needs last_loc -1, got {}", b, last_loc);
    return;
  }
  PAGODA_REQUIRE(last_loc >= page_size_ && last_loc < num_slots_total(), kOutOfRange,
                 "request {}: last_loc {} outside the pool's slots [{}, {})", b, last_loc,
                 page_size_, num_slots_total());
  PAGODA_REQUIRE(held_refcount(last_loc / page_size_) > 0, kFailedPrecondition,
                 "request {}: last_loc {} is in page {}, which is not allocated", b, last_loc,
                 last_loc / page_size_);
  PAGODA_REQUIRE((last_loc + 1) % page_size_ == pre % page_size_, kInvalidArgument,
                 "request {}: last_loc {} misaligned with prefix length {} (page_size {})", b,
                 last_loc, pre, page_size_);
}

bool PageAllocator::alloc_extend(std::span<const int32_t> prefix_lens,
                                 std::span<const int32_t> seq_lens,
                                 std::span<const SlotIndex> last_loc, std::span<SlotIndex> out) {
  const size_t bs = prefix_lens.size();
  PAGODA_REQUIRE(seq_lens.size() == bs && last_loc.size() == bs, kInvalidArgument,
                 "alloc_extend: {} prefix_lens, {} seq_lens, {} last_loc", bs, seq_lens.size(),
                 last_loc.size());
  // Check everything (and count the fresh pages) before taking any page.
  int64_t total_tokens = 0;
  int64_t new_pages = 0;
  for (size_t b = 0; b < bs; ++b) {
    const int32_t pre = prefix_lens[b];
    const int32_t seq = seq_lens[b];
    PAGODA_REQUIRE(pre >= 0 && seq >= pre, kInvalidArgument,
                   "request {}: need 0 <= prefix_len {} <= seq_len {}", b, pre, seq);
    validate_last_loc(static_cast<int64_t>(b), pre, last_loc[b]);
    total_tokens += seq - pre;
    new_pages += ceil_div(seq, page_size_) - ceil_div(pre, page_size_);
  }
  PAGODA_REQUIRE(static_cast<int64_t>(out.size()) == total_tokens, kInvalidArgument,
                 "alloc_extend: out has {} slots, the batch extends {} tokens", out.size(),
                 total_tokens);
  if (new_pages > free_top_) return false;
  size_t k = 0;
  for (size_t b = 0; b < bs; ++b) {
    const int64_t pre = prefix_lens[b];
    const int64_t seq = seq_lens[b];
    const int64_t pre_ceil = ceil_div(pre, page_size_) * page_size_;
    // Part 1: the tail of the current partial page.
    const int64_t n1 = std::min(seq, pre_ceil) - pre;
    for (int64_t i = 0; i < n1; ++i) out[k++] = last_loc[b] + 1 + static_cast<SlotIndex>(i);
    // Parts 2 and 3: fresh pages, the last one possibly partial.
    for (int64_t pos = pre_ceil; pos < seq; pos += page_size_) {
      const SlotIndex base = pop_free_page() * page_size_;
      const int64_t n = std::min<int64_t>(page_size_, seq - pos);
      for (int64_t j = 0; j < n; ++j) out[k++] = base + static_cast<SlotIndex>(j);
    }
  }
  PAGODA_CHECK_EQ(static_cast<int64_t>(k), total_tokens);
  return true;
}

std::optional<std::vector<SlotIndex>> PageAllocator::alloc_extend(
    std::span<const int32_t> prefix_lens, std::span<const int32_t> seq_lens,
    std::span<const SlotIndex> last_loc) {
  int64_t total = 0;
  for (size_t b = 0; b < prefix_lens.size() && b < seq_lens.size(); ++b) {
    total += std::max(0, seq_lens[b] - prefix_lens[b]);
  }
  std::vector<SlotIndex> out(static_cast<size_t>(total));
  if (!alloc_extend(prefix_lens, seq_lens, last_loc, out)) return std::nullopt;
  return out;
}

bool PageAllocator::alloc_decode(std::span<const int32_t> seq_lens,
                                 std::span<const SlotIndex> last_loc, std::span<SlotIndex> out) {
  const size_t bs = seq_lens.size();
  PAGODA_REQUIRE(last_loc.size() == bs && out.size() == bs, kInvalidArgument,
                 "alloc_decode: {} seq_lens, {} last_loc, out of {}", bs, last_loc.size(),
                 out.size());
  int64_t new_pages = 0;
  for (size_t b = 0; b < bs; ++b) {
    PAGODA_REQUIRE(seq_lens[b] >= 1, kInvalidArgument, "request {}: new seq_len {} < 1", b,
                   seq_lens[b]);
    validate_last_loc(static_cast<int64_t>(b), seq_lens[b] - 1, last_loc[b]);
    if ((seq_lens[b] - 1) % page_size_ == 0) ++new_pages;
  }
  if (new_pages > free_top_) return false;
  for (size_t b = 0; b < bs; ++b) {
    out[b] = (seq_lens[b] - 1) % page_size_ != 0 ? last_loc[b] + 1 : pop_free_page() * page_size_;
  }
  return true;
}

std::optional<std::vector<SlotIndex>> PageAllocator::alloc_decode(
    std::span<const int32_t> seq_lens, std::span<const SlotIndex> last_loc) {
  std::vector<SlotIndex> out(seq_lens.size());
  if (!alloc_decode(seq_lens, last_loc, out)) return std::nullopt;
  return out;
}

void PageAllocator::throw_bad_run(std::span<const SlotIndex> slots, size_t i) const {
  const int64_t limit = num_slots_total();
  const SlotIndex first = slots[i];
  PAGODA_REQUIRE(first >= 0 && first < limit, kOutOfRange, "slot {} (entry {}) outside [0, {})",
                 first, i, limit);
  const int32_t page = page_of(first);
  PAGODA_REQUIRE(page != 0, kOutOfRange, "slot {} is in reserved page 0", first);
  PAGODA_REQUIRE(first - page * page_size_ == 0, kInvalidArgument,
                 "partial page: slot {} (entry {}) starts page {} at offset {}, not at its "
                 "first slot {}",
                 first, i, page, first - page * page_size_, page * page_size_);
  PAGODA_REQUIRE(held_refcount(page) > 0, kFailedPrecondition,
                 "page {} (slot {}) is not allocated: double or foreign free", page, first);
  PAGODA_CHECK(false, "throw_bad_run: entry {} (slot {}) is valid", i, first);
}

void PageAllocator::collect_pages(std::span<const SlotIndex> slots) const {
  // One pass over the runs: O(slots) comparisons, O(pages) refcount reads, no sort, no heap
  // allocation once the scratch buffer has grown. Slot lists are ascending page runs by
  // construction (allocation pops ascending pages), so duplicates can only exist when the page
  // sequence is not strictly ascending; only then a marking pass runs.
  const size_t n = slots.size();
  if (scratch_pages_.size() < n) scratch_pages_.resize(n);
  int32_t* out = scratch_pages_.data();
  const SlotIndex* in = slots.data();
  // Slots of usable pages are [page_size, limit); a slot starts its page iff offset 0.
  const auto limit = static_cast<SlotIndex>(num_slots_total());
  bool ascending = true;
  int32_t prev_page = 0;
  size_t count = 0;
  // The counts through a local pointer: the stores to `out` cannot alias it.
  const int32_t* rc = refcount_.data();
  const auto held = [=](int32_t page) { return rc[page] > 0; };
  if (page_size_ == 1) {
    for (size_t i = 0; i < n; ++i) {
      const SlotIndex page = in[i];
      if (page < 1 || page >= limit || !held(page)) [[unlikely]] throw_bad_run(slots, i);
      out[count++] = page;
      ascending = ascending && page > prev_page;
      prev_page = page;
    }
  } else {
    const auto p = static_cast<size_t>(page_size_);
    const int32_t shift = page_shift_;
    const int32_t psize = page_size_;
    size_t i = 0;
    while (i < n) {
      const SlotIndex first = in[i];
      const int32_t page =
          first >= psize && first < limit ? (shift >= 0 ? first >> shift : first / psize) : 0;
      if (page == 0 || first != page * psize || !held(page)) [[unlikely]] {
        throw_bad_run(slots, i);
      }
      // The run continues while the slots stay consecutive inside the page.
      const size_t end = std::min(n, i + p);
      size_t j = i + 1;
      while (j < end && in[j] == first + static_cast<SlotIndex>(j - i)) ++j;
      out[count++] = page;
      ascending = ascending && page > prev_page;
      prev_page = page;
      i = j;
    }
  }
  scratch_count_ = count;
  scratch_ascending_ = ascending;
  if (ascending) return;
  // Out of order: mark each page by negating its (positive) refcount; a page met twice is
  // already negative. Every mark is undone before returning or throwing.
  int32_t dup = 0;
  size_t marked = 0;
  for (; marked < count; ++marked) {
    const int32_t page = out[marked];
    if (refcount_[page] < 0) {
      dup = page;
      break;
    }
    refcount_[page] = -refcount_[page];
  }
  for (size_t k = 0; k < marked; ++k) refcount_[out[k]] = -refcount_[out[k]];
  PAGODA_REQUIRE(dup == 0, kInvalidArgument,
                 "page {} is named by two separate runs (duplicate or out-of-order slots)", dup);
}

void PageAllocator::require_held_runs(std::span<const SlotIndex> slots) const {
  collect_pages(slots);
}

void PageAllocator::free(std::span<const SlotIndex> slots) {
  collect_pages(slots);
  const size_t count = scratch_count_;
  if (count == 0) return;
  ++mutation_epoch_;
  int32_t* pages = scratch_pages_.data();
  if (!scratch_ascending_) {
    // Free-list order needs the freed pages ascending; only this (rare) path sorts.
    std::sort(pages, pages + count);
  }
  release_sorted_pages(pages, count);
}

void PageAllocator::release_sorted_pages(const int32_t* pages, size_t count) {
  // Descending push leaves the smallest freed page on top (SGLang prepends sorted pages).
  // Members in locals: the int32 stores below cannot alias them.
  int32_t released = 0;
  int32_t* rc = refcount_.data();
  int32_t* stack = free_stack_.data();
  int32_t top = free_top_;
  const bool group = in_free_group_;
  for (size_t k = count; k-- > 0;) {
    const int32_t page = pages[k];
    if (--rc[page] > 0) continue;
    ++released;
    if (group) {
      pending_.push_back(page);
    } else {
      stack[top++] = page;
    }
  }
  free_top_ = top;
  num_referenced_ -= released;
}

void PageAllocator::retain(std::span<const SlotIndex> slots) {
  collect_pages(slots);
  const size_t count = scratch_count_;
  if (count == 0) return;
  ++mutation_epoch_;
  const int32_t* pages = scratch_pages_.data();
  for (size_t k = 0; k < count; ++k) ++refcount_[pages[k]];
}

bool PageAllocator::check_page_runs(std::span<const PageRun> runs) const {
  const int32_t* rc = refcount_.data();
  bool ascending = true;
  int64_t prev_end = 1;  // one past the previous run's last page
  for (size_t r = 0; r < runs.size(); ++r) {
    const PageRun run = runs[r];
    PAGODA_REQUIRE(run.count >= 1, kInvalidArgument, "page run {}: count {} < 1", r, run.count);
    PAGODA_REQUIRE(run.first >= 1 && int64_t{run.first} + run.count - 1 <= num_pages_,
                   kOutOfRange, "page run {}: pages [{}, {}) outside the usable pages [1, {}]", r,
                   run.first, int64_t{run.first} + run.count, num_pages_);
    // Every page held: the smallest refcount of the run is positive (a vectorisable loop).
    int32_t lowest = std::numeric_limits<int32_t>::max();
    const int32_t* c = rc + run.first;
    for (int32_t k = 0; k < run.count; ++k) lowest = std::min(lowest, c[k]);
    if (lowest <= 0) [[unlikely]] {
      for (int32_t k = 0; k < run.count; ++k) {
        PAGODA_REQUIRE(held_refcount(run.first + k) > 0, kFailedPrecondition,
                       "page run {}: page {} is not allocated: double or foreign free", r,
                       run.first + k);
      }
    }
    ascending = ascending && run.first >= prev_end;
    prev_end = int64_t{run.first} + run.count;
  }
  if (ascending) return true;
  // Out of order: mark each page by negating its (positive) refcount; a page met twice is
  // already negative. Every mark is undone before returning or throwing.
  int32_t dup = 0;
  size_t marked_runs = 0;
  int32_t marked_in_last = 0;
  for (; marked_runs < runs.size() && dup == 0; ++marked_runs) {
    const PageRun run = runs[marked_runs];
    for (marked_in_last = 0; marked_in_last < run.count; ++marked_in_last) {
      const int32_t page = run.first + marked_in_last;
      if (refcount_[page] < 0) {
        dup = page;
        break;
      }
      refcount_[page] = -refcount_[page];
    }
  }
  for (size_t r = 0; r < marked_runs; ++r) {
    const int32_t n = r + 1 == marked_runs ? marked_in_last : runs[r].count;
    for (int32_t k = 0; k < n; ++k) refcount_[runs[r].first + k] = -refcount_[runs[r].first + k];
  }
  PAGODA_REQUIRE(dup == 0, kInvalidArgument, "page {} is named by two page runs", dup);
  return false;
}

void PageAllocator::require_held_pages(std::span<const PageRun> runs) const {
  check_page_runs(runs);
}

void PageAllocator::retain_pages(std::span<const PageRun> runs) {
  check_page_runs(runs);
  if (runs.empty()) return;
  ++mutation_epoch_;
  int32_t* rc = refcount_.data();
  for (const PageRun& run : runs) {
    int32_t* c = rc + run.first;
    for (int32_t k = 0; k < run.count; ++k) ++c[k];
  }
}

void PageAllocator::free_pages(std::span<const PageRun> runs) {
  const bool ascending = check_page_runs(runs);
  if (runs.empty()) return;
  ++mutation_epoch_;
  if (!ascending) {
    size_t count = 0;
    for (const PageRun& run : runs) count += static_cast<size_t>(run.count);
    if (scratch_pages_.size() < count) scratch_pages_.resize(count);
    int32_t* pages = scratch_pages_.data();
    size_t k = 0;
    for (const PageRun& run : runs) {
      for (int32_t i = 0; i < run.count; ++i) pages[k++] = run.first + i;
    }
    std::sort(pages, pages + count);
    release_sorted_pages(pages, count);
    return;
  }
  // Runs ascending and disjoint: the pages are already in free-list order. Per run, drop every
  // count in one loop; when all reach 0 (the tree usually holds the only reference) the run goes
  // onto the free list with one more loop (its stack entries), else page by page.
  int32_t* rc = refcount_.data();
  int32_t* stack = free_stack_.data();
  int32_t top = free_top_;
  int32_t released = 0;
  const bool group = in_free_group_;
  for (size_t r = runs.size(); r-- > 0;) {
    const int32_t first = runs[r].first;
    const int32_t n = runs[r].count;
    int32_t* c = rc + first;
    int32_t highest = 0;
    for (int32_t k = 0; k < n; ++k) highest = std::max(highest, --c[k]);
    if (highest == 0 && !group) {
      int32_t* s = stack + top;
      for (int32_t k = 0; k < n; ++k) s[k] = first + n - 1 - k;
      top += n;
      released += n;
      continue;
    }
    for (int32_t k = n; k-- > 0;) {
      if (c[k] != 0) continue;
      ++released;
      if (group) {
        pending_.push_back(first + k);
      } else {
        stack[top++] = first + k;
      }
    }
  }
  free_top_ = top;
  num_referenced_ -= released;
}

void PageAllocator::free_group_begin() {
  PAGODA_REQUIRE(!in_free_group_, kFailedPrecondition, "free_group_begin inside a free group");
  in_free_group_ = true;
  ++mutation_epoch_;
}

void PageAllocator::free_group_end() {
  PAGODA_REQUIRE(in_free_group_, kFailedPrecondition, "free_group_end without free_group_begin");
  std::sort(pending_.begin(), pending_.end(), std::greater<>());
  for (int32_t page : pending_) push_free_page(page);
  pending_.clear();
  in_free_group_ = false;
  ++mutation_epoch_;
}

AllocatorState PageAllocator::backup_state() const {
  return AllocatorState{.free_top = free_top_, .mutation_epoch = mutation_epoch_, .owner = this};
}

void PageAllocator::restore_state(const AllocatorState& state) {
  PAGODA_REQUIRE(state.owner == this, kInvalidArgument,
                 "restore_state: the state was taken from another allocator");
  PAGODA_REQUIRE(state.mutation_epoch == mutation_epoch_ && state.free_top >= free_top_,
                 kFailedPrecondition,
                 "restore_state: the allocator was freed, retained, grouped or cleared since the "
                 "backup (only allocations may happen between backup_state and restore_state)");
  num_referenced_ -= state.free_top - free_top_;
  // Pages at positions [free_top_, state.free_top) were popped since the backup (count 1, set by
  // the pop); they are free again in the same positions.
  for (int32_t i = free_top_; i < state.free_top; ++i) refcount_[free_stack_[i]] = 0;
  free_top_ = state.free_top;
}

void PageAllocator::check_integrity() const {
  PAGODA_CHECK(free_top_ >= 0 && free_top_ <= num_pages_);
  // 1: on the free list, 2: pending. Every page is on the free list at most once, with count 0;
  // a page with count 0 is free or pending; pending pages are not on the free list.
  std::vector<uint8_t> state(static_cast<size_t>(num_pages_) + 1, 0);
  for (int32_t i = 0; i < free_top_; ++i) {
    const int32_t page = free_stack_[i];
    PAGODA_CHECK(page >= 1 && page <= num_pages_, "free list entry {} holds page {}", i, page);
    PAGODA_CHECK(state[page] == 0, "page {} is on the free list twice", page);
    PAGODA_CHECK(refcount_[page] == 0, "free page {} has refcount {}", page, refcount_[page]);
    state[page] = 1;
  }
  PAGODA_CHECK(in_free_group_ || pending_.empty(), "pending pages outside a free group");
  for (int32_t page : pending_) {
    PAGODA_CHECK(page >= 1 && page <= num_pages_ && state[page] == 0 && refcount_[page] == 0,
                 "pending page {} state", page);
    state[page] = 2;
  }
  PAGODA_CHECK(refcount_[0] == 0, "page 0 refcount {}", refcount_[0]);
  int32_t referenced = 0;
  for (int32_t page = 1; page <= num_pages_; ++page) {
    PAGODA_CHECK(refcount_[page] >= 0, "page {} refcount {}", page, refcount_[page]);
    if (refcount_[page] > 0) {
      ++referenced;
    } else {
      PAGODA_CHECK(state[page] != 0, "page {} has refcount 0 but is neither free nor pending",
                   page);
    }
  }
  PAGODA_CHECK_EQ(referenced, num_referenced_);
  PAGODA_CHECK_EQ(free_top_ + referenced + static_cast<int32_t>(pending_.size()), num_pages_);
}

}  // namespace pagoda::kv
