// KeyArena: blocks never overlap, keep their contents until released, are at most 25 % larger
// than asked, and every slab goes back once its blocks are released. Random sizes and orders;
// PAGODA_TEST_SEED=<n> replays a run.
#include "pagoda/cache/key_arena.h"
#include "test_seed.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace pagoda::cache {
namespace {

TEST(KeyArena, ClassesFitAndWasteAtMostAQuarter) {
  for (size_t cells = 1; cells <= 70000; ++cells) {
    const size_t got = KeyArena::block_cells(cells);
    ASSERT_GE(got, cells);
    ASSERT_LE(got * 4, cells * 5 + 12) << cells;
  }
  EXPECT_EQ(KeyArena::block_cells(1024), 1024u);
  EXPECT_EQ(KeyArena::block_cells(2048), 2048u);
}

TEST(KeyArena, RandomBlocksKeepContentsAndSlabsReturn) {
  const pagoda::testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  KeyArena arena;
  struct Live {
    KeyArena::Block block;
    size_t cells;
    int32_t stamp;
  };
  std::vector<Live> live;
  auto verify = [](const Live& l) {
    for (size_t i = 0; i < l.cells; ++i) {
      ASSERT_EQ(l.block.data[i], l.stamp + static_cast<int32_t>(i)) << "block overwritten";
    }
  };
  int32_t stamp = 0;
  for (int round = 0; round < 3; ++round) {
    for (int op = 0; op < 6000; ++op) {
      if (live.empty() || rng() % 100 < 55) {
        const size_t cells = rng() % 4 == 0 ? 1 + rng() % 20000 : 1 + rng() % 1100;
        Live l{arena.allocate(cells), cells, stamp += 100003};
        for (size_t i = 0; i < cells; ++i) l.block.data[i] = l.stamp + static_cast<int32_t>(i);
        live.push_back(l);
      } else {
        const size_t k = rng() % live.size();
        verify(live[k]);
        arena.release(live[k].block);
        live[k] = live.back();
        live.pop_back();
      }
      ASSERT_EQ(arena.blocks_in_use(), live.size());
    }
    for (const Live& l : live) verify(l);
    // Release everything in random order: no slab may stay behind.
    std::shuffle(live.begin(), live.end(), rng);
    for (const Live& l : live) arena.release(l.block);
    live.clear();
    EXPECT_EQ(arena.blocks_in_use(), 0u);
    EXPECT_EQ(arena.bytes_reserved(), 0u);
  }
}

}  // namespace
}  // namespace pagoda::cache
