#pragma once
/// Internal to the AMX kernels (the amx backend's tiles, amx_tile.cpp, and the AMX GEMM,
/// amx_linear.cpp): the 32 × 32 output block they both compute and the K-group packer that
/// makes B tiles from bf16 rows. Tiles: tmm0-3 the block's four f32 16 × 16 accumulators (rows
/// 0-15 | 16-31 × columns 0-15 | 16-31), tmm4-5 two A tiles (16 rows × 32 bf16), tmm6-7 two B
/// tiles (16 pairs × 16 columns), under the palette-1 configuration of 16 × 64-byte tiles
/// (amx_support.h AmxTileConfig). Call only where amx_tiles_available(), after LDTILECFG.

#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__linux__)
#define PAGODA_AMX_BLOCKS_X86 1
#include <immintrin.h>
#else
#define PAGODA_AMX_BLOCKS_X86 0
#endif

namespace pagoda::kernels::cpu::detail {

/// kb group of 16 keys (or output columns) from their bf16 rows (dk values each, rows[i] of
/// key 16 g + i; dk a multiple of 32): kb[d2 · 16 + i] = (rows[i][2 d2], rows[i][2 d2 + 1]) for
/// d2 < dk / 2 (a 16 × dk/2 transpose) — dk/32 B tiles of 1 KB, contiguous. Needs AVX-512.
void amx_pack_k_group(const uint16_t* const* rows, int dk, uint32_t* kb);

#if PAGODA_AMX_BLOCKS_X86

#define PAGODA_AMX_BLOCK_INLINE \
  __attribute__((target("amx-tile,amx-bf16"), always_inline)) inline

/// One step of 32 along the reduction: A tiles of 16 rows at a0 and a1 (rows `as` bytes apart),
/// B tiles at b0 and b1 (rows `bs` bytes apart); each product right after the loads it needs,
/// so the next loads overlap it.
PAGODA_AMX_BLOCK_INLINE void amx_block_step(const void* a0, const void* a1, int64_t as,
                                            const void* b0, const void* b1, int64_t bs) {
  _tile_loadd(4, a0, as);
  _tile_loadd(6, b0, bs);
  _tile_dpbf16ps(0, 4, 6);
  _tile_loadd(7, b1, bs);
  _tile_dpbf16ps(1, 4, 7);
  _tile_loadd(5, a1, as);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}

/// tmm0-3 from the 32 × 32 f32 block at c (rows `cs` bytes apart).
PAGODA_AMX_BLOCK_INLINE void amx_load_block(const float* c, int64_t cs) {
  const float* c1 = reinterpret_cast<const float*>(reinterpret_cast<const char*>(c) + 16 * cs);
  _tile_loadd(0, c, cs);
  _tile_loadd(1, c + 16, cs);
  _tile_loadd(2, c1, cs);
  _tile_loadd(3, c1 + 16, cs);
}

/// tmm0-3 to the 32 × 32 f32 block at c (rows `cs` bytes apart).
PAGODA_AMX_BLOCK_INLINE void amx_store_block(float* c, int64_t cs) {
  float* c1 = reinterpret_cast<float*>(reinterpret_cast<char*>(c) + 16 * cs);
  _tile_stored(0, c, cs);
  _tile_stored(1, c + 16, cs);
  _tile_stored(2, c1, cs);
  _tile_stored(3, c1 + 16, cs);
}

#endif

}  // namespace pagoda::kernels::cpu::detail
