#pragma once
/// Internal: AMX (`amx_tile` + `amx_bf16`, Sapphire Rapids and later) micro-kernels of the amx
/// backend's extend: a query tile's two bf16 products per key block, with f32 results. Written
/// with intrinsics in functions compiled for that ISA; call them only where
/// amx_tiles_available(). Each call configures the tile registers (eight 16 × 64-byte tiles) and
/// releases them on return; no allocation; one thread per call.
///
/// Layouts ("pair" = u32 holding two bf16, the lower-addressed element in the low half):
///   q   [rows][dk]   bf16 query rows, row-major
///   kb  K in groups of 16 keys, each [dk/2][16] pairs (one B tile = 1 KB of contiguous memory):
///       kb[(g · dk/2 + d2) · 16 + i] = (k_{16 g + i}[2 d2], k_{16 g + i}[2 d2 + 1])
///   s   [rows][n]    f32 scores, row-major
///   p   [rows][n]    bf16 probabilities, row-major
///   vb  V in blocks of 16 columns, ldv pairs apart, each [key pairs][16]:
///       vb[c · ldv + j2 · 16 + i] = (v_{2 j2}[16 c + i], v_{2 j2 + 1}[16 c + i])
///   acc [rows][dv]   f32 accumulators, row-major
/// rows, n, dk and dv are multiples of 32 (callers zero-pad: zero rows and columns change no
/// product).

#include <cstdint>

#include "pagoda/kernels/cpu/amx_blocks.h"  // amx_pack_k_group makes kb
#include "pagoda/kernels/cpu/amx_support.h"

namespace pagoda::kernels::cpu::detail {

/// s[r][j] = Σ_d q[r][d] k_j[d] for rows r < rows and keys j < n; kb points at the block's first
/// group of 16 keys.
void amx_scores(const uint16_t* q, int rows, int dk, const uint32_t* kb, int n, float* s);

/// acc[r][x] += Σ_j p[r][j] v_j[x] for rows r < rows, x < dv and keys j < n; vb points at the
/// block's first key pair in the first 16-column block.
void amx_pv_accumulate(const uint16_t* p, int rows, int n, const uint32_t* vb, int64_t ldv, int dv,
                       float* acc);

/// Key pair j2 of vb from the bf16 V rows of keys 2 j2 (a) and 2 j2 + 1 (b), dv values each:
/// vb[c · ldv + i] = (a[16 c + i], b[16 c + i]) for c < dv / 16, vb pointing at pair j2 of block 0.
void amx_pack_v_pair(const uint16_t* a, const uint16_t* b, int dv, uint32_t* vb, int64_t ldv);

}  // namespace pagoda::kernels::cpu::detail
