#pragma once
/// Internal: AVX512-BF16 (`vdpbf16ps`) micro-kernels of the CPU extend tile path. Highway 1.0.x
/// has no op that emits vdpbf16ps, so these two GEMM inner loops are written with intrinsics in
/// functions compiled for that ISA only and are called only when cpu_avx512bf16_available().
/// Everything else of the tile path (packing, online softmax, epilogue) is Highway code in
/// paged_attention.cpp.
///
/// Layouts ("pair" = u32 holding two bf16, the lower-addressed element in the low half):
///   qt [dq2][ld]    : lane r of pair d2 = (q[r][2 d2], q[r][2 d2 + 1])   (rows in lanes)
///   st [n][ld]      : f32 scores, key j's row at st + j * ld            (rows in lanes)
///   pt [np][ld]     : lane r of pair j2 = (p[r][2 j2], p[r][2 j2 + 1])
///   vpk [np][dv]    : element x of pair j2 = (v[2 j2][x], v[2 j2 + 1][x])
///   ot [dv][ld]     : f32 output accumulator, transposed                (rows in lanes)
/// ld is a multiple of 16 and every row vector [c * 16, c * 16 + 16) with c < nrv is computed.
/// Not thread-safe across calls sharing outputs; no allocation.

#include <cstdint>

namespace pagoda::kernels::cpu::detail {

/// True when the CPU executes AVX-512F/BW/VL and AVX512-BF16. Evaluated once. The kernels use
/// these micro-kernels where it holds and the params allow them (CpuAttentionParams::bf16_tiles
/// for the extend tile, bf16_decode for the decode kernels below).
bool cpu_avx512bf16_available();

/// st[j * ld + r] = scale * Σ_d q[r][d] k_j[d] for keys j in [0, n) and rows r in [0, nrv * 16):
/// key j's bf16 row (dq2 pairs) starts at krows[j].
void tile_scores_bf16(const uint32_t* const* krows, int n, const uint32_t* qt, int dq2, int ld,
                      int nrv, float scale, float* st);

/// ot[x * ld + r] += Σ_j p[r][j] v[j][x] for x in [0, dv), rows r in [0, nrv * 16), key pairs
/// j2 in [0, np) (bf16 probabilities: used when the output is bf16, whose rounding is coarser).
void tile_pv_bf16(const uint32_t* pt, const uint32_t* vpk, int np, int dv, int ld, int nrv,
                  float* ot);

/// The same in f32 (AVX-512F FMAs, exact probabilities): pf [n][ld] f32 probabilities (rows in
/// lanes), vf [n][dv] f32 values; used for f32 / f16 outputs.
void tile_pv_f32(const float* pf, const float* vf, int n, int dv, int ld, int nrv, float* ot);

/// Decode (few rows per KV head, keys read in place): s[r * ls + j] = scale * q_r · k_j for rows
/// r in [0, rows) (bf16 rows qrows[r], natural order) and keys j in [0, n) (bf16 rows kp[j] + off);
/// dim a multiple of 32.
void decode_scores_bf16(const uint16_t* const* qrows, int rows, const uint16_t* const* kp,
                        int64_t off, int n, int dim, float scale, float* s, int ls);

/// pp[r * lpp + j2] = bf16 pair (p_r[2 j2], p_r[2 j2 + 1]) for j2 < npad / 2, where p_r = p + r * lp
/// holds npad (a multiple of 16) probabilities. pp may be p itself (lpp = lp): in place.
void decode_pack_p_bf16(const float* p, int lp, int rows, int npad, uint32_t* pp, int lpp);

/// acc[r * la + x] += Σ_j p_r[j] v_j[x] for rows r in [0, rows), keys j in [0, n) (bf16 rows
/// vp[j] + off; the odd tail key's partner must have p = 0), x in [0, dim), dim a multiple of 32;
/// p as the bf16 pairs of decode_pack_p_bf16.
void decode_pv_bf16(const uint32_t* pp, int lpp, int rows, const uint16_t* const* vp, int64_t off,
                    int n, int dim, float* acc, int la);

}  // namespace pagoda::kernels::cpu::detail
