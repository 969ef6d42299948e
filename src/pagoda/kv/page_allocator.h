#pragma once
/// PageAllocator: SGLang's paged token-slot allocator (sglang_spec §3.7) with reference-counted
/// pages. Normative contract: docs/design/kv.md.
///
/// Slots and pages. Pages are numbered 1..num_pages; page 0 is reserved (the dummy target of
/// padded batches) and is never handed out. Slot s lives in page s / page_size at offset
/// s % page_size. page_size 1 is the token allocator.
///
/// Reference counts. Every page is either free (refcount 0, on the free list), pending (refcount
/// 0 inside a free group, not yet allocatable) or referenced (refcount >= 1). An allocation hands
/// out pages with refcount 1 owned by the caller. retain() adds a holder (the radix tree retains
/// the pages it stores); free() drops one holder; a page returns to the free list when its count
/// reaches 0. Outside a free group `num_free_pages() + num_referenced_pages() == num_pages()`.
///
/// Slot runs. free() and retain() name pages through slots. For every page named, the slots
/// named must be exactly the run [page * P, page * P + k) for some 1 <= k <= P, each slot once:
/// a holder always names the used prefix of a page it holds. Freeing [9, 10, 11] of page 2
/// (slot 8 omitted) is a "partial free" and an error: that is the §3.7 hazard.
///
/// Errors. Bad input throws pagoda::Error before anything changes (kOutOfRange for a slot
/// outside the pool, kFailedPrecondition for a page that is not referenced, kInvalidArgument for
/// malformed runs or lengths). "Does not fit" returns an empty optional / false, unchanged.
///
/// Thread rules: not thread-safe; one scheduler thread owns it. Host only (ids, no device memory).

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "pagoda/core/check.h"
#include "pagoda/core/ids.h"

namespace pagoda::kv {

/// A run of consecutive whole pages: ids [first, first + count), count >= 1.
struct PageRun {
  int32_t first = 0;
  int32_t count = 0;
};

/// The page-reference operations a prefix cache needs: the radix tree holds one reference per
/// page it stores and names pages through slot runs (the slot-run rule above). PageAllocator is
/// the implementation; a test or benchmark may supply another (for example one that only counts).
/// Every method validates its whole input before changing anything and throws pagoda::Error.
class PageRefs {
 public:
  virtual ~PageRefs() = default;
  virtual int32_t page_size() const = 0;
  /// Usable pages; page ids are 1..num_pages().
  virtual int32_t num_pages() const = 0;
  /// Holders of `page` (0 when free).
  virtual int32_t refcount(PageId page) const = 0;
  /// Adds one reference to every distinct page named.
  virtual void retain(std::span<const SlotIndex> slots) = 0;
  /// Drops one reference from every distinct page named.
  virtual void free(std::span<const SlotIndex> slots) = 0;
  /// Validates `slots` as free()/retain() would, without changing anything.
  virtual void require_held_runs(std::span<const SlotIndex> slots) const = 0;

  /// Page-run forms of the three above: each run names whole pages [first, first + count), and no
  /// page may be named twice over all runs. Same validation (whole input before any change) and
  /// errors. The defaults expand the runs into slot lists (one heap allocation per call);
  /// PageAllocator overrides them with O(pages) loops that read no slots.
  virtual void retain_pages(std::span<const PageRun> runs);
  virtual void free_pages(std::span<const PageRun> runs);
  virtual void require_held_pages(std::span<const PageRun> runs) const;

 protected:
  PageRefs() = default;
  PageRefs(const PageRefs&) = default;
  PageRefs& operator=(const PageRefs&) = default;
};

/// An O(1) snapshot of the allocator for speculative scratch allocations (backup_state()).
struct AllocatorState {
  int32_t free_top = 0;          ///< free-list height at backup time
  uint64_t mutation_epoch = 0;   ///< count of non-allocating mutations at backup time
  const void* owner = nullptr;   ///< the allocator that produced it
};

class PageAllocator final : public PageRefs {
 public:
  /// A pool of `num_pages` usable pages (ids 1..num_pages) of `page_size` slots each.
  /// Requires num_pages >= 0, page_size >= 1 and (num_pages + 1) * page_size < 2^31.
  PageAllocator(int32_t num_pages, int32_t page_size);

  int32_t page_size() const override { return page_size_; }
  /// Usable pages (page 0 excluded).
  int32_t num_pages() const override { return num_pages_; }
  /// Slots addressable in a KV pool serving this allocator: (num_pages + 1) * page_size.
  int64_t num_slots_total() const { return int64_t{num_pages_ + 1} * page_size_; }
  /// Free tokens: num_free_pages() * page_size. Pages pending in a free group are not counted.
  int64_t available_size() const { return int64_t{free_top_} * page_size_; }
  int32_t num_free_pages() const { return free_top_; }
  /// Pages with refcount >= 1.
  int32_t num_referenced_pages() const { return num_referenced_; }
  /// Pages freed inside the current free group and not yet returned (0 outside a group).
  int32_t num_pending_pages() const { return static_cast<int32_t>(pending_.size()); }
  /// Holders of `page` (0 when free or pending). Requires 0 <= page <= num_pages; page 0 reports 0.
  int32_t refcount(PageId page) const override;

  /// Takes `num_tokens / page_size` whole pages (num_tokens a multiple of page_size, >= 0) and
  /// returns their slots, page after page, in free-list order. Empty optional when it does not fit.
  std::optional<std::vector<SlotIndex>> alloc(int64_t num_tokens);

  /// Batch extend (§3.7 alloc_extend). Per request b with prefix length pre = prefix_lens[b] and
  /// new total length seq = seq_lens[b]: fills the tail of the partial last page (slots
  /// last_loc[b] + 1 ...), then whole fresh pages, then one fresh partial page. Fresh pages are
  /// taken in batch order. last_loc[b] is the slot of token pre - 1, or -1 when pre == 0; it must be
  /// in a referenced page and satisfy (last_loc + 1) % P == pre % P. Writes Σ(seq - pre) slots into
  /// `out` in batch order. Returns false (nothing changed) when the fresh pages do not fit.
  /// Throws Error on mismatched span sizes, seq < pre, bad last_loc or a wrong `out` size.
  [[nodiscard]] bool alloc_extend(std::span<const int32_t> prefix_lens,
                                  std::span<const int32_t> seq_lens,
                                  std::span<const SlotIndex> last_loc, std::span<SlotIndex> out);
  /// As above, returning a new vector (empty optional when it does not fit).
  std::optional<std::vector<SlotIndex>> alloc_extend(std::span<const int32_t> prefix_lens,
                                                     std::span<const int32_t> seq_lens,
                                                     std::span<const SlotIndex> last_loc);

  /// Batch decode (§3.7 alloc_decode): seq_lens are the new lengths (old + 1, >= 1) and last_loc
  /// the slot of the last existing token (-1 when seq == 1). Request b gets last_loc + 1 while its
  /// last page has room ((seq - 1) % P != 0), else the first slot of the next fresh page (batch
  /// order). Writes one slot per request into `out`. Returns false (unchanged) when short.
  [[nodiscard]] bool alloc_decode(std::span<const int32_t> seq_lens,
                                  std::span<const SlotIndex> last_loc, std::span<SlotIndex> out);
  std::optional<std::vector<SlotIndex>> alloc_decode(std::span<const int32_t> seq_lens,
                                                     std::span<const SlotIndex> last_loc);

  /// Drops one reference from every distinct page named (slot-run rule above). Pages reaching 0
  /// go to the front of the free list (smallest id first, LIFO reuse), or to the pending list
  /// inside a free group. Throws (unchanged) on out-of-range slots, unreferenced pages, bad runs.
  /// Cost: one pass, O(slots) compares and O(pages) refcount updates; no sort when the pages
  /// are named in ascending order (allocations hand them out that way), no heap allocation.
  void free(std::span<const SlotIndex> slots) override;
  /// Adds one reference to every distinct page named (same rules and costs as free()).
  void retain(std::span<const SlotIndex> slots) override;
  /// Validates `slots` as free()/retain() would, without changing anything; throws on bad input.
  void require_held_runs(std::span<const SlotIndex> slots) const override;
  /// Page-run forms (PageRefs): the same rules and results as naming every slot of every page,
  /// in O(pages) tight loops over the refcounts (no slot is read, no sort when the runs are
  /// ascending, no heap allocation outside a free group).
  void retain_pages(std::span<const PageRun> runs) override;
  void free_pages(std::span<const PageRun> runs) override;
  void require_held_pages(std::span<const PageRun> runs) const override;

  /// Starts a free group: pages reaching refcount 0 are parked until free_group_end(). Requires
  /// no open group. Reference counts still drop immediately, so double frees are still caught.
  void free_group_begin();
  /// Returns all parked pages to the free list at once (smallest id on top). Requires an open group.
  void free_group_end();
  bool in_free_group() const { return in_free_group_; }

  /// O(1) snapshot for speculative scratch. Protocol: backup, allocate, use, restore. Between the
  /// two only alloc / alloc_extend / alloc_decode may run; restore_state() throws
  /// kFailedPrecondition (unchanged) if anything else mutated the allocator since the backup.
  AllocatorState backup_state() const;
  /// Every page allocated since `state` is free again, in its original free-list position.
  /// O(pages allocated since the backup): their counts go back to 0 (the allocations that took
  /// them cost as much); nothing else moves.
  void restore_state(const AllocatorState& state);

  /// Frees everything: free list 1..num_pages, all refcounts 0, no group. O(num_pages).
  void clear();

  /// Aborts (PAGODA_CHECK) when internal invariants are broken: free-list positions, refcounts,
  /// counters, page 0 never free. O(num_pages).
  void check_integrity() const;

 private:
  /// Holders of `page` (refcount_ is exact for every page: restore_state() zeroes the counts of
  /// the pages it gives back).
  int32_t held_refcount(int32_t page) const { return refcount_[page]; }
  /// Pops the page at the top of the free list and gives it refcount 1 (inline: once per page).
  int32_t pop_free_page() {
    PAGODA_DCHECK(free_top_ > 0);
    const int32_t page = free_stack_[--free_top_];
    refcount_[page] = 1;
    ++num_referenced_;
    return page;
  }
  void push_free_page(int32_t page);
  /// Validates `slots` in one pass without sorting (O(slots) compares, O(pages) refcount reads),
  /// then leaves the distinct pages named in scratch_pages_[0, scratch_count_) in the order
  /// named, and scratch_ascending_ = whether that order is strictly ascending.
  void collect_pages(std::span<const SlotIndex> slots) const;
  /// Throws the error collect_pages reports for the run starting at entry i (the cold path).
  [[noreturn, gnu::cold]] void throw_bad_run(std::span<const SlotIndex> slots, size_t i) const;
  /// slot / page_size (a shift when page_size is a power of two).
  int32_t page_of(SlotIndex slot) const {
    return page_shift_ >= 0 ? slot >> page_shift_ : slot / page_size_;
  }
  void validate_last_loc(int64_t b, int32_t pre, SlotIndex last_loc) const;
  /// Validates page runs (range, held, each page once); returns whether they are ascending and
  /// disjoint (the common case, checked without marking).
  bool check_page_runs(std::span<const PageRun> runs) const;
  /// Drops one reference from each of pages[0, count) (ascending, distinct, validated) and puts
  /// the pages reaching 0 on the free list (or the pending list), smallest on top.
  void release_sorted_pages(const int32_t* pages, size_t count);

  int32_t num_pages_;
  int32_t page_size_;
  int32_t page_shift_ = 0;  ///< log2(page_size) when a power of two, else -1
  /// free_stack_[0, free_top_) are the free pages; the top (free_top_ - 1) is handed out first.
  /// Entries above free_top_ are left untouched by pops, which is what makes restore cheap (the
  /// pages come back in their old positions without moving anything). No per-page position is
  /// kept: a free page is one with refcount 0 that is not pending, so freeing a run writes only
  /// its counts and its stack entries (8 bytes a page).
  std::vector<int32_t> free_stack_;
  /// 0 for free and pending pages. Mutable: collect_pages() marks pages by negating their count
  /// during duplicate detection and restores it before returning.
  mutable std::vector<int32_t> refcount_;
  int32_t free_top_ = 0;
  int32_t num_referenced_ = 0;
  uint64_t mutation_epoch_ = 0;
  bool in_free_group_ = false;
  std::vector<int32_t> pending_;
  mutable std::vector<SlotIndex> scratch_slots_;
  mutable std::vector<int32_t> scratch_pages_;  ///< grows to the largest call, never shrinks
  mutable size_t scratch_count_ = 0;
  mutable bool scratch_ascending_ = true;
};

}  // namespace pagoda::kv
