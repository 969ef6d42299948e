#pragma once
/// Internal: where each buffer of a thread's scratch lives (floats from the thread's base).
/// Shared by the per-target kernels and cpu_attention_scratch_floats so both agree.

#include <cstdint>

#include "pagoda/kernels/cpu/paged_attention.h"

namespace pagoda::kernels::cpu::detail {

/// Buffers of the bf16 extend tile path (tile_bf16.h), for one KV head's rows at a time, rows in
/// lanes padded to ld = max_rows rounded up to 16. Offsets in 4-byte words.
struct TileLayout {
  int64_t ld = 0;      ///< row stride of every transposed buffer
  int64_t qt = 0;      ///< [Dqk/2, ld] u32 query pairs
  int64_t st = 0;      ///< [kv_block, ld] f32 scores
  int64_t pt = 0;      ///< [kv_block/2, ld] u32 probability pairs
  int64_t vpk = 0;     ///< [kv_block/2, Dv] u32 value pairs, or [kv_block, Dv] f32 values
  int64_t ot = 0;      ///< [Dv, ld] f32 transposed output accumulator
  int64_t m = 0;       ///< [ld] running max
  int64_t l = 0;       ///< [ld] running sum
  int64_t lo = 0;      ///< [ld] i32 first visible key per row
  int64_t hi = 0;      ///< [ld] i32 one past the last visible key per row
  int64_t qs = 0;      ///< [ld, Dqk/2] u32 query pairs, row-major staging for qt
  int64_t total = 0;

  TileLayout(int max_rows, int dqk, int dv, int kv_block) {
    auto round = [](int64_t x) { return (x + 15) / 16 * 16; };
    ld = round(max_rows);
    int64_t at = 0;
    qt = at;
    at += round((dqk + 1) / 2) * ld;
    st = at;
    at += round(kv_block) * ld;
    pt = at;
    at += round((kv_block + 1) / 2) * ld;
    vpk = at;
    at += round(kv_block) * round(dv);
    ot = at;
    at += round(dv) * ld;
    m = at;
    at += ld;
    l = at;
    at += ld;
    lo = at;
    at += ld;
    hi = at;
    at += ld;
    qs = at;
    at += ld * round((dqk + 1) / 2);
    total = at;
  }
};

struct ScratchLayout {
  int64_t q = 0;       ///< [max_rows, dqk_pad] pre-scaled f32 queries
  int64_t k = 0;       ///< [kv_block, dqk_pad] converted keys of one head
  int64_t v = 0;       ///< [kv_block, dv_pad] converted values of one head
  int64_t s = 0;       ///< [max_rows_per_head, kv_block] scores / probabilities
  int64_t acc = 0;     ///< [max_rows, dv_pad] unnormalised outputs
  int64_t m = 0;       ///< [max_rows] running max (natural units)
  int64_t l = 0;       ///< [max_rows] running sum
  int64_t tile = 0;    ///< the extend tile path's buffers (TileLayout, relative to this)
  int64_t amx_ml = 0;  ///< [2, max_rows, 16] the AMX decode kernel's running max and sum
  int64_t total = 0;   ///< floats in all

  ScratchLayout(int max_rows, int max_rows_per_head, int dqk, int dv, int kv_block) {
    const int64_t dqk_pad = cpu_padded_dim(dqk);
    const int64_t dv_pad = cpu_padded_dim(dv);
    auto round = [](int64_t x) { return (x + 15) / 16 * 16; };  // 64-byte aligned regions
    int64_t at = 0;
    q = at;
    at += round(max_rows * dqk_pad);
    k = at;
    at += round(kv_block * dqk_pad);
    v = at;
    at += round(kv_block * dv_pad);
    s = at;
    at += round(static_cast<int64_t>(max_rows_per_head) * kv_block);
    acc = at;
    at += round(max_rows * dv_pad);
    m = at;
    at += round(max_rows);
    l = at;
    at += round(max_rows);
    tile = at;
    at += round(TileLayout(max_rows, dqk, dv, kv_block).total);
    amx_ml = at;
    at += round(int64_t{32} * max_rows);
    total = at;
  }
};

}  // namespace pagoda::kernels::cpu::detail
