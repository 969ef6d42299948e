#pragma once
/// KeyArena: the radix tree's node buffers (int32 cells: a node's tokens, then its slots when it
/// stores them), carved from slabs of equal-sized blocks, one slab list per size class.
///
/// Why: evicting half of a large tree frees thousands of 4 KB buffers in random order; through
/// malloc each free walks the neighbouring chunks' headers (cache misses). Here a release only
/// pushes the block's index on its slab's free stack (dense metadata, no access to the block).
///
/// Size classes: even cell counts up to 16, then four per power of two (a block is at most 25 %
/// larger than asked, plus one cell; 1,024 and 2,048 cells are exact; blocks start 8-byte
/// aligned). Under AddressSanitizer free blocks and block tails are poisoned. A slab holds 64 KiB of blocks (between
/// 1 and 64 blocks). Memory: a slab goes back to the system heap as soon as its last block is
/// released, so an empty tree holds no slab; a partly used slab keeps its whole size.
///
/// Thread rules: not thread-safe (owned by one RadixCache). Blocks are uninitialised.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pagoda::cache {

class KeyArena {
 public:
  /// A block: `data` has at least the requested cells; (slab, slot) name it for release().
  struct Block {
    int32_t* data = nullptr;
    uint32_t slab = 0;
    uint32_t slot = 0;
  };

  KeyArena() = default;
  ~KeyArena();
  KeyArena(const KeyArena&) = delete;
  KeyArena& operator=(const KeyArena&) = delete;

  /// A block of at least `cells` (>= 1) cells. Throws std::bad_alloc when the heap is exhausted.
  Block allocate(size_t cells);
  /// Gives a block back (exactly once; a block from this arena).
  void release(const Block& block);

  /// Bytes of slabs held (blocks in use or free inside a used slab).
  size_t bytes_reserved() const { return bytes_reserved_; }
  /// Blocks handed out and not released.
  size_t blocks_in_use() const { return blocks_in_use_; }
  /// Cells of a block of the class that serves `cells` (for tests).
  static size_t block_cells(size_t cells) { return class_cells(class_of(cells)); }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  struct Slab {
    int32_t* mem = nullptr;           ///< null when the slab id is unused
    uint32_t cls = 0;
    uint32_t partial_pos = kNone;     ///< position in partial_[cls], kNone when full
    std::vector<uint32_t> free_slots;  ///< stack of free block indices
    uint32_t blocks = 0;
  };
  static uint32_t class_of(size_t cells);
  static size_t class_cells(uint32_t cls);
  static uint32_t blocks_per_slab(size_t block_cells);
  uint32_t new_slab(uint32_t cls);
  void drop_partial(Slab& slab);

  std::vector<Slab> slabs_;
  std::vector<uint32_t> unused_slab_ids_;
  std::vector<std::vector<uint32_t>> partial_;  ///< per class: slabs with a free block
  size_t bytes_reserved_ = 0;
  size_t blocks_in_use_ = 0;
};

}  // namespace pagoda::cache
