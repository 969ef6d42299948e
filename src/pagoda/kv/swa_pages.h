#pragma once
/// SwaPages: the sliding-window side of a hybrid KV pool (SGLang's SWAKVPool / SWA allocator,
/// paged; docs/design/kv.md §SWA). A model with sliding-window layers keeps their K/V in a second,
/// smaller pool: every full page (the full-attention layers' pool, a PageAllocator) may have one
/// SWA page (the SWA pool, another PageAllocator of the same page size) holding the same token
/// positions at the same in-page offsets. The SWA slot of full slot s is
/// swa_page(page(s)) * P + s % P.
///
/// Holders. A full page's SWA page has its own reference count (the SWA allocator's): a request
/// or the radix tree that holds a full page also holds its SWA page until it lets the window
/// side go (release_swa) — a request whose window has slid past the page, or the tree evicting
/// a node's window KV while keeping its full KV (a tombstone). When the SWA count of a page
/// reaches 0 its SWA page is free and the full page has none any more (has_swa() false): the
/// positions it holds can no longer be read by a sliding layer. Dropping a full page's last
/// reference (free) also drops the SWA references its holder still had.
///
/// Window arithmetic (FlashInfer convention: a query at position p reads keys
/// [p - window_left, p]). After kv_len tokens are cached, every later query has p >= kv_len, so
/// positions below kv_len - window_left are dead for the sliding layers: swa_dead_pages() leading
/// pages of a request can be released, and a running request holds at most
/// swa_live_pages_bound() SWA pages.
///
/// Pages are named by id (1..num_pages, as in PageRun). Errors: bad input throws pagoda::Error
/// before anything changes (as PageAllocator). Thread rules: not thread-safe; one scheduler
/// thread owns it with the two allocators.

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "pagoda/core/ids.h"
#include "pagoda/kv/page_allocator.h"

namespace pagoda::kv {

class SwaPages {
 public:
  /// Both allocators must have the same page size and outlive this; `full` must be unused (no
  /// page referenced) so every held full page is known here.
  SwaPages(PageAllocator& full, PageAllocator& swa);

  int32_t page_size() const { return full_->page_size(); }
  PageAllocator& full() const { return *full_; }
  PageAllocator& swa() const { return *swa_; }

  /// Takes `num_pages` full pages and one SWA page for each (refcount 1 on both sides); returns
  /// the full page ids, or an empty optional (nothing changed) when either pool is short.
  std::optional<std::vector<int32_t>> alloc_pages(int32_t num_pages);
  /// Gives each named full page (referenced by one holder, without an SWA page; e.g. just taken
  /// by PageAllocator::alloc_extend) an SWA page held by that holder. Returns false (nothing
  /// changed) when the SWA pool has fewer free pages than named. Throws on a page that is not
  /// referenced once, already has an SWA page, or is named twice.
  [[nodiscard]] bool attach_swa(std::span<const int32_t> full_pages);
  /// Moves the SWA page of full page `from` to full page `to` (which has none): the radix tree
  /// reviving a tombstone with the window KV of a duplicate page holding the same tokens. Both
  /// pages must have exactly one holder. Throws (unchanged) otherwise.
  void move_swa(int32_t from, int32_t to);
  /// Adds a holder to each page named: the full page, and its SWA page when it has one and
  /// `with_swa` (the radix tree retaining what a request inserted).
  void retain(std::span<const int32_t> full_pages, bool with_swa);
  /// Drops one holder's SWA reference for each page named (which must have an SWA page); the
  /// full pages are untouched.
  void release_swa(std::span<const int32_t> full_pages);
  /// Drops one holder of each page named: its full reference, and its SWA reference when
  /// `with_swa` (it had not released it). Pages reaching 0 return to their pools.
  void free(std::span<const int32_t> full_pages, bool with_swa);

  /// Whether full page `p` (referenced) still has an SWA page.
  bool has_swa(int32_t p) const { return map_[static_cast<size_t>(p)] != 0; }
  /// The SWA page of full page `p`, or 0 when it has none.
  int32_t swa_page(int32_t p) const { return map_[static_cast<size_t>(p)]; }
  /// The SWA slot of full slot `s`, or -1 when its page has no SWA page.
  SlotIndex swa_slot(SlotIndex s) const;

  /// Leading pages of a request with kv_len cached tokens that no later query of a layer with
  /// `window_left` can read: max(0, (kv_len - window_left) / page_size).
  static int64_t swa_dead_pages(int64_t kv_len, int window_left, int32_t page_size);
  /// The most SWA pages a running request still needs after its dead ones are released: the
  /// pages overlapping the window_left + 1 positions [kv_len - window_left, kv_len], i.e.
  /// ceil((window_left + 1) / P) + 1 (a window straddles one more page than it fills).
  static int64_t swa_live_pages_bound(int window_left, int32_t page_size);

  /// Aborts (PAGODA_CHECK) unless every SWA page's holders are exactly its full page's (the
  /// SwaPageRefs rule: a page's SWA refcount is 0 or its full refcount). O(num_pages).
  void check_holders_share() const;
  /// Aborts (PAGODA_CHECK) when the map and the two allocators disagree: every full page with
  /// an SWA page is referenced, SWA pages are referenced, no SWA page is mapped twice, and the
  /// mapped SWA pages are exactly the referenced ones. O(num_pages).
  void check_integrity() const;

 private:
  void require_referenced(std::span<const int32_t> full_pages, const char* what) const;
  /// Drops one SWA reference from page `p`'s SWA page; unmaps it when it reaches 0.
  void drop_swa(int32_t p);

  PageAllocator* full_;
  PageAllocator* swa_;
  std::vector<int32_t> map_;  ///< full page -> SWA page (0 = none), size full.num_pages() + 1
};

/// The PageRefs view of a SwaPages under one rule: every holder of a full page also holds its SWA
/// page while it has one (a page's SWA refcount is 0 or equal to its full refcount). retain()
/// adds a holder to both sides (the SWA side when present); free() drops one from both. A holder
/// that lets a page's window side go (SwaPages::release_swa) must be its only holder, which the
/// engine guarantees: a request releases only its private pages, the radix tree only pages it
/// alone holds. Lets a RadixCache (which knows one pool) keep both pools consistent.
class SwaPageRefs final : public PageRefs {
 public:
  explicit SwaPageRefs(SwaPages& pages) : pages_(&pages) {}
  SwaPages& pages() const { return *pages_; }

  int32_t page_size() const override { return pages_->page_size(); }
  int32_t num_pages() const override { return pages_->full().num_pages(); }
  int32_t refcount(PageId page) const override { return pages_->full().refcount(page); }
  void retain(std::span<const SlotIndex> slots) override;
  void free(std::span<const SlotIndex> slots) override;
  void require_held_runs(std::span<const SlotIndex> slots) const override {
    pages_->full().require_held_runs(slots);
  }
  void retain_pages(std::span<const PageRun> runs) override;
  void free_pages(std::span<const PageRun> runs) override;
  void require_held_pages(std::span<const PageRun> runs) const override {
    pages_->full().require_held_pages(runs);
  }

 private:
  /// The pages named by slot runs (validated as PageAllocator::free would).
  std::vector<PageRun> page_runs(std::span<const SlotIndex> slots) const;
  /// Splits the distinct pages of `runs` into those with and without an SWA page.
  void split(std::span<const PageRun> runs);

  SwaPages* pages_;
  std::vector<int32_t> with_;
  std::vector<int32_t> without_;
};

}  // namespace pagoda::kv
