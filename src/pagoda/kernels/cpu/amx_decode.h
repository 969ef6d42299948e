#pragma once
/// Internal: the amx backend's decode kernel. One CPU work item (attention_params.h) whose query
/// rows all see every key of its chunk — a decode step's request, or a split-KV part of one —
/// runs here instead of the SIMD kernels of paged_attention.cpp when CpuAttentionParams::amx_decode
/// is set and amx_decode_eligible() holds:
///   - per block of 16 keys and KV head, Sᵀ = K · Qᵀ on AMX tiles: A = the block's 16 bf16 K rows
///     straight from the page (one strided tile load per 32 dims; keys gathered into scratch where
///     the 16 keys do not sit in one page, or the chunk ends inside the block), B = the head's
///     query rows packed once per item as bf16 pairs; C = 16 keys × (rows per head ≤ 16) f32, so
///     the online softmax runs with the rows in SIMD lanes (base 2);
///   - P·V with AVX512-BF16 dot products (vdpbf16ps): probabilities rounded to bf16 pairs, V rows
///     of a key pair interleaved in registers (vpunpck{l,h}wd), accumulators in a fixed
///     permutation of the dims that the epilogue undoes.
/// The K/V bytes are read once per item and KV head group (token-major within a page), and every
/// query head of a group is served by that one read (GQA).
///
/// Eligible: AMX tiles available, bf16 q/K/V, Dqk == Dv a multiple of 32, at most 16 rows per KV
/// head, no custom mask, window or soft cap, contiguous last dimensions, and every key of the
/// item's chunk visible to every row (causal: the item's first query row sits at or past the
/// chunk's last key). Sinks and k/v scales are applied by the caller / here as in ProcessItem.

#include <cstdint>

#include "pagoda/kernels/cpu/attention_params.h"

namespace pagoda::kernels::cpu::detail {

/// Whether amx_decode_item can run `it` (see the header comment); false on CPUs without AMX.
bool amx_decode_eligible(const CpuAttentionParams& p, const CpuWorkItem& it);

/// Per-thread buffers of amx_decode_item (floats / words from the thread's scratch; regions of
/// ScratchLayout): q ≥ rows · Dqk / 2 words, k ≥ 16 · Dqk / 2 words, s ≥ 384 words, acc ≥ rows ·
/// Dv floats, ml ≥ 32 · KV heads of the item floats.
struct AmxDecodeScratch {
  uint32_t* q = nullptr;
  uint32_t* k = nullptr;
  float* s = nullptr;
  float* acc = nullptr;
  float* ml = nullptr;
};

/// Runs item `it` (amx_decode_eligible). On return, row r (CpuSchedule's row order; Dv floats at
/// acc + r · Dv) holds the normalised output with v_scale applied, in natural dim order, and
/// lse_nat[r] its natural log-sum-exp over the chunk (-inf for an empty chunk, output 0).
void amx_decode_item(const CpuAttentionParams& p, const CpuWorkItem& it, const AmxDecodeScratch& s,
                     float* lse_nat);

}  // namespace pagoda::kernels::cpu::detail
