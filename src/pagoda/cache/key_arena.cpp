#include "pagoda/cache/key_arena.h"

#include <algorithm>
#include <bit>
#include <new>

#include "pagoda/core/check.h"

// Under AddressSanitizer the free blocks and the unused tail of each block are poisoned, so an
// overrun inside a slab is still reported.
#if defined(__SANITIZE_ADDRESS__)
#define PAGODA_KEY_ARENA_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PAGODA_KEY_ARENA_ASAN 1
#endif
#endif
#ifdef PAGODA_KEY_ARENA_ASAN
#include <sanitizer/asan_interface.h>
#define PAGODA_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define PAGODA_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define PAGODA_POISON(p, n) ((void)(p), (void)(n))
#define PAGODA_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace pagoda::cache {

namespace {

/// Up to 16 cells, classes of 2, 4, ..., 16 cells (every block starts 8-byte aligned).
constexpr size_t kSmallCells = 16;
constexpr uint32_t kSmallClasses = kSmallCells / 2;
constexpr size_t kSlabBytes = size_t{64} << 10;
constexpr uint32_t kMaxBlocksPerSlab = 64;

}  // namespace

KeyArena::~KeyArena() {
  for (Slab& s : slabs_) {
    if (s.mem == nullptr) continue;
    PAGODA_UNPOISON(s.mem, class_cells(s.cls) * s.blocks * sizeof(int32_t));
    ::operator delete(s.mem);
  }
}

uint32_t KeyArena::class_of(size_t cells) {
  if (cells <= kSmallCells) return static_cast<uint32_t>(cells == 0 ? 0 : (cells - 1) / 2);
  // 2^e <= cells - 1 < 2^(e + 1), e >= 4; four classes per power of two.
  const auto e = static_cast<uint32_t>(std::bit_width(cells - 1) - 1);
  const size_t k = (cells - 1) >> (e - 2);  // 4..7
  return static_cast<uint32_t>(kSmallClasses + (e - 4) * 4 + (k - 4));
}

size_t KeyArena::class_cells(uint32_t cls) {
  if (cls < kSmallClasses) return 2 * (size_t{cls} + 1);
  const uint32_t e = 4 + (cls - kSmallClasses) / 4;
  const size_t k = 4 + (cls - kSmallClasses) % 4;
  return (k + 1) << (e - 2);
}

uint32_t KeyArena::blocks_per_slab(size_t block_cells) {
  const size_t n = kSlabBytes / (block_cells * sizeof(int32_t));
  return static_cast<uint32_t>(std::clamp<size_t>(n, 1, kMaxBlocksPerSlab));
}

uint32_t KeyArena::new_slab(uint32_t cls) {
  const size_t cells = class_cells(cls);
  const uint32_t blocks = blocks_per_slab(cells);
  const size_t bytes = cells * blocks * sizeof(int32_t);
  uint32_t id;
  if (!unused_slab_ids_.empty()) {
    id = unused_slab_ids_.back();
    unused_slab_ids_.pop_back();
  } else {
    id = static_cast<uint32_t>(slabs_.size());
    slabs_.emplace_back();
  }
  Slab& s = slabs_[id];
  try {
    s.mem = static_cast<int32_t*>(::operator new(bytes));
    s.free_slots.resize(blocks);
  } catch (...) {
    if (s.mem != nullptr) ::operator delete(s.mem);
    s.mem = nullptr;
    unused_slab_ids_.push_back(id);
    throw;
  }
  PAGODA_POISON(s.mem, bytes);
  s.cls = cls;
  s.blocks = blocks;
  // Block 0 on top of the stack: a fresh slab fills front to back.
  for (uint32_t i = 0; i < blocks; ++i) s.free_slots[i] = blocks - 1 - i;
  s.partial_pos = static_cast<uint32_t>(partial_[cls].size());
  partial_[cls].push_back(id);
  bytes_reserved_ += bytes;
  return id;
}

void KeyArena::drop_partial(Slab& slab) {
  std::vector<uint32_t>& list = partial_[slab.cls];
  const uint32_t moved = list.back();
  list[slab.partial_pos] = moved;
  slabs_[moved].partial_pos = slab.partial_pos;
  list.pop_back();
  slab.partial_pos = kNone;
}

KeyArena::Block KeyArena::allocate(size_t cells) {
  PAGODA_CHECK(cells >= 1, "KeyArena::allocate(0)");
  const uint32_t cls = class_of(cells);
  if (partial_.size() <= cls) partial_.resize(cls + 1);
  const uint32_t id = partial_[cls].empty() ? new_slab(cls) : partial_[cls].back();
  Slab& s = slabs_[id];
  const uint32_t slot = s.free_slots.back();
  s.free_slots.pop_back();
  if (s.free_slots.empty()) drop_partial(s);
  ++blocks_in_use_;
  int32_t* data = s.mem + class_cells(cls) * slot;
  PAGODA_UNPOISON(data, cells * sizeof(int32_t));
  return Block{data, id, slot};
}

void KeyArena::release(const Block& block) {
  Slab& s = slabs_[block.slab];
  PAGODA_DCHECK(s.mem != nullptr && block.slot < s.blocks);
  PAGODA_POISON(block.data, class_cells(s.cls) * sizeof(int32_t));
  s.free_slots.push_back(block.slot);
  --blocks_in_use_;
  if (s.free_slots.size() == s.blocks) {
    // The last block came back: the slab returns to the system heap.
    if (s.partial_pos != kNone) drop_partial(s);
    PAGODA_UNPOISON(s.mem, class_cells(s.cls) * s.blocks * sizeof(int32_t));
    ::operator delete(s.mem);
    s.mem = nullptr;
    bytes_reserved_ -= class_cells(s.cls) * s.blocks * sizeof(int32_t);
    s.free_slots.clear();
    s.free_slots.shrink_to_fit();
    unused_slab_ids_.push_back(block.slab);
    return;
  }
  if (s.partial_pos == kNone) {  // it was full
    s.partial_pos = static_cast<uint32_t>(partial_[s.cls].size());
    partial_[s.cls].push_back(block.slab);
  }
}

}  // namespace pagoda::cache
