#pragma once
/// Whether this process may run AMX bf16 tile instructions (Sapphire Rapids and later): the CPU
/// reports amx_tile and amx_bf16 and, on Linux, the kernel grants the tile-data state
/// (arch_prctl ARCH_REQ_XCOMP_PERM, asked once, on the first call). Shared by the amx attention
/// kernels (amx_tile.h, amx_decode.h) and the AMX GEMM (amx_linear.h).

#include <cstdint>

namespace pagoda::kernels::cpu::detail {

/// LDTILECFG's 64-byte operand, palette 1: tiles 0-7 of 16 rows × 64 bytes unless a kernel sets
/// other shapes (rows[t], colsb[t] in bytes).
struct alignas(64) AmxTileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

/// True when the CPU has AMX tiles with bf16 and the OS lets this process use them. Evaluated
/// once; false on every other CPU, OS or compiler.
bool amx_tiles_available();

}  // namespace pagoda::kernels::cpu::detail
