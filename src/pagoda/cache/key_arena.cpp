#include "pagoda/cache/key_arena.h"

#include <algorithm>
#include <bit>
#include <new>

#include "pagoda/core/check.h"

namespace pagoda::cache {

namespace {

constexpr size_t kExactCells = 16;
constexpr size_t kSlabBytes = size_t{64} << 10;
constexpr uint32_t kMaxBlocksPerSlab = 64;

}  // namespace

KeyArena::~KeyArena() {
  for (Slab& s : slabs_) {
    if (s.mem != nullptr) ::operator delete(s.mem);
  }
}

uint32_t KeyArena::class_of(size_t cells) {
  if (cells <= kExactCells) return static_cast<uint32_t>(cells == 0 ? 0 : cells - 1);
  // 2^e <= cells - 1 < 2^(e + 1), e >= 4; four classes per power of two.
  const auto e = static_cast<uint32_t>(std::bit_width(cells - 1) - 1);
  const size_t k = (cells - 1) >> (e - 2);  // 4..7
  return static_cast<uint32_t>(kExactCells + (e - 4) * 4 + (k - 4));
}

size_t KeyArena::class_cells(uint32_t cls) {
  if (cls < kExactCells) return cls + 1;
  const uint32_t e = 4 + (cls - kExactCells) / 4;
  const size_t k = 4 + (cls - kExactCells) % 4;
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
  return Block{s.mem + class_cells(cls) * slot, id, slot};
}

void KeyArena::release(const Block& block) {
  Slab& s = slabs_[block.slab];
  PAGODA_DCHECK(s.mem != nullptr && block.slot < s.blocks);
  s.free_slots.push_back(block.slot);
  --blocks_in_use_;
  if (s.free_slots.size() == s.blocks) {
    // The last block came back: the slab returns to the system heap.
    if (s.partial_pos != kNone) drop_partial(s);
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
