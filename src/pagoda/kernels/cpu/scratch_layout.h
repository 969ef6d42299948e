#pragma once
/// Internal: where each buffer of a thread's scratch lives (floats from the thread's base).
/// Shared by the per-target kernels and cpu_attention_scratch_floats so both agree.

#include <cstdint>

#include "pagoda/kernels/cpu/paged_attention.h"

namespace pagoda::kernels::cpu::detail {

struct ScratchLayout {
  int64_t q = 0;       ///< [max_rows, dqk_pad] pre-scaled f32 queries
  int64_t k = 0;       ///< [kv_block, dqk_pad] converted keys of one head
  int64_t v = 0;       ///< [kv_block, dv_pad] converted values of one head
  int64_t s = 0;       ///< [max_rows_per_head, kv_block] scores / probabilities
  int64_t acc = 0;     ///< [max_rows, dv_pad] unnormalised outputs
  int64_t m = 0;       ///< [max_rows] running max (natural units)
  int64_t l = 0;       ///< [max_rows] running sum
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
    total = at;
  }
};

}  // namespace pagoda::kernels::cpu::detail
