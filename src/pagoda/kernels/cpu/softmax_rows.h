#pragma once
/// Row-major online softmax for the amx backend's extend (backends/amx): between its Q·Kᵀ and P·V
/// matmuls, whose score and probability matrices are [rows][keys] with the keys of a row
/// contiguous. Highway code with runtime ISA dispatch (the targets of paged_attention.cpp); no
/// allocation; rows are independent, one thread per call.
///
/// Per row r and key block, in base-2 units, with x_j = scale · log2(e) · s[r][j] over the
/// visible keys j < visible[r]:
///   m' = max(m, max_j x_j), raised only when that exceeds m by more than kSoftmaxLazyRescale
///        (or m was -inf), so p stays <= 2^kSoftmaxLazyRescale and most blocks rescale nothing
///        (and take one pass over the row: a block that raises m is done again);
///   p_j = 2^(x_j − m') (relative error about 2e-7), 0 for the keys past visible[r];
///   l' = l · 2^(m − m') + Σ_j p_j (unrounded p), acc[r] *= 2^(m − m') when m' != m;
///   P[r][j] = p_j rounded to bf16 (nearest even).
/// Then m + log2(l) is the row's base-2 log-sum-exp and acc / l its output, whatever the block
/// order. A row with no visible key in the block, or whose visible scores are all -inf while m is
/// -inf, gets P = 0 and keeps m, l and acc (a -inf score is a key of p = 0).

#include <cstdint>

#include "pagoda/core/dtype.h"

namespace pagoda::kernels::cpu {

/// Base-2 margin of the lazily raised running max (see above).
inline constexpr float kSoftmaxLazyRescale = 8.f;

/// One key block of rows (see the header comment).
struct SoftmaxRowsBlock {
  const float* s = nullptr;  ///< raw scores [rows][n] (q·k before scale), row-major
  int rows = 0;
  int n = 0;                         ///< keys in the block: columns of s and p; a multiple of 16
  const int32_t* visible = nullptr;  ///< [rows]: keys [0, visible[r]) are visible; 0..n
  float scale = 1.f;                 ///< sm_scale
  float* m = nullptr;                ///< [rows] running max (base 2; -inf: none yet)
  float* l = nullptr;                ///< [rows] running sum of unrounded p relative to m
  DType p_dtype = DType::kBF16;      ///< kBF16: p as bf16 bits; kF32: the bf16-rounded values
  void* p = nullptr;                 ///< [rows][n] probabilities out
  float* acc = nullptr;              ///< [rows][dv] f32 accumulators, rescaled with m
  int dv = 0;
};

/// Applies one key block to every row of `b`.
void softmax_rows_block(const SoftmaxRowsBlock& b);

/// dst[0, n) = src[0, n) · factor in `t` (kF32, or kBF16 bits rounded to nearest even; a NaN
/// becomes a quiet NaN).
void scale_row_to(const float* src, int n, float factor, void* dst, DType t);

}  // namespace pagoda::kernels::cpu
