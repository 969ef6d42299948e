#pragma once
/// Hopper (sm_90a) split-KV paged MLA decode, absorbed form (Dqk 576 = 512 + 64 rope, Dv 512,
/// one latent "kv head" shared by every q head), wgmma from shared memory, bf16 latent, or fp8
/// e4m3 widened to bf16 in shared memory by the producer (MlaSm90Fp8).
///
/// For many q heads (Hq >= 64, DeepSeek's 128) the mma.sync kernel (mla_decode_kernel.cuh) is
/// compute-bound at 16-32 heads per block; here one block serves 64 heads (the wgmma M), so
/// each latent tile read from L2 feeds four times the FLOPs, and the tensor cores are fed by
/// wgmma instead of warp-level MMAs. Below 64 heads it runs where the tiles come by TMA (its
/// empty rows cost tensor-core time, which the bandwidth-bound h_q 16 case has to spare).
///
/// One block = one work item (request, kv chunk [a, b), load_decode_item) x 64 q heads
/// (mla_block_coords: the head blocks of one item are adjacent in the 1-D grid; rows past Hq are
/// zero and never written). 384 threads:
///  * warpgroup 0, producer, two ways:
///    - TMA (kTma: page sizes >= 16, MlaSm90Map): every whole 64-key tile of a chunk that starts
///      on a box boundary. Lane 0 of warp 0 arrives on the stage's `full` mbarrier with the
///      tile's byte count and issues 9 boxes (one per 128-byte atom column) per page of the
///      tile, or per tile when the page is larger; lanes of warp 0 look up the next tile's
///      pages meanwhile, the other producer threads only arrive. At B128 h_q 128 page 64 on the
///      H200 this made the kernel 1.6x faster than the cp.async gather below (0.30 vs 0.48 ms,
///      bench/results/mla_h200.md), which ncu had shown waiting on `full` for 20 % of its
///      samples, its producer lanes busy with address math.
///    - cp.async (page sizes < 16, and a chunk's last tile when it ends past the chunk's keys:
///      a box copies whole page rows, and unused rows may hold NaN, which would reach O through
///      P = 0 times V): per 64-key tile, lanes 0..15 of warp w look up the pages of keys
///      16w .. 16w + 15 (any page size; the next tile's lookups are in flight while this one is
///      issued); per group of 4 rows one shuffle hands the row offsets to the copying lanes (8
///      per row, one 16-byte chunk of each atom column), which gather the latent rows [576]
///      with 16-byte cp.async into a 2-stage ring of 128B-swizzled tiles [9][64 keys][128 B]
///      (keys past the chunk are zero-filled, so unused slots never reach the accumulators).
///      This row-group gather made page 1 at h_q 128 1.6x faster on the H200 than the earlier
///      one, which had a division and a modulo by 72, a shuffle and the swizzle per copy
///      (0.157 vs 0.250 ms at B64 L4096). Each lane's cp.async.mbarrier.arrive completes the
///      stage's `full` mbarrier when its copies have landed, so the producer never waits for
///      its own copies (publishing a tile only after issuing the next one measured 16 % slower
///      at B128 h_q 128 on the H200), and the consumers fence the tile into the async proxy
///      after their wait.
///  * warpgroups 1 and 2, consumers c = 0, 1: per tile
///      S_c = Q K[32c .. 32c + 31]^T   wgmma m64n32k16 x 36, Q and K from shared memory;
///      row maxima of both halves exchanged through shared memory (named barrier 1), so both
///      consumers hold the same running max m; P_c = exp2(S_c - m) stored as bf16 into the
///      shared P tile [64 heads][64 keys] (named barrier 2 publishes it);
///      O_c = O_c * alpha + P V[:, 256c .. 256c + 255]   wgmma m64n256k16 x 4, P K-major and V
///      (the tile's first 512 columns) MN-major from shared memory (with kTma, m, O and l move
///      only when a row's max grows by more than 8, base 2);
///    then an arrive on the stage's `empty` mbarrier. Each consumer owns 256 of the 512 output
///    columns (128 f32 accumulators per thread); the row sums l are summed over both at the end.
///    (FlashMLA's first schedule, one consumer scoring whole tiles with m64n64k16 while the other
///    only runs its P V half, measured 36 % slower on the H200: 656 vs 483 us at B128 h_q 128.
///    Issuing S of tile t + 1 behind P V of tile t before releasing tile t's stage measured
///    20 % slower with TMA: the release then waits for tile t + 1 to land, and with two stages
///    that leaves one tile in flight.)
/// Split chunks write (O / l, lse) partials for the merge kernel; whole requests write the
/// output (sinks, v_scale and LSE applied here).
///
/// Shared memory (bytes, 1024-aligned): Q [9][64][128 B] 73,728, two stages 147,456 (with fp8,
/// each stage's top 40,960 bytes take the raw tile first), P 8,192, row maxima and sums 1,024,
/// mbarriers 48: 230,448 + alignment.
/// Contract (checked by the host, mla_decode_supported and mla_decode_sm90_chosen): q/out bf16,
/// latent bf16 or e4m3; Hkv 1; V is K's storage (same pointer and strides); rows 16-byte aligned;
/// one query row per request.

#include "pagoda/kernels/cuda/device_utils.cuh"
#include "pagoda/kernels/cuda/fast_div.h"
#include "pagoda/kernels/cuda/pdl.cuh"
#include "pagoda/kernels/cuda/sm90_utils.cuh"
#include "pagoda/kernels/cuda/wgmma_ops.cuh"

namespace pagoda::kernels::cuda::detail {

struct MlaSm90Config {
  static constexpr int kDqk = 576, kDv = 512;
  static constexpr int kThreads = 384;
  static constexpr int kHeads = kMlaSm90Heads;  // q heads per block (wgmma M)
  static constexpr int kKeys = 64;              // keys per tile
  static constexpr int kStages = 2;
  static constexpr int kChunks = kDqk / 8;  // 16-byte chunks per latent row (72)
  static constexpr int kAtoms = kDqk / 64;  // 128-byte atom columns (9)
  static constexpr uint32_t kQBytes = kHeads * kDqk * 2;
  static constexpr uint32_t kTileBytes = kKeys * kDqk * 2;
  static constexpr uint32_t kPBytes = kHeads * kKeys * 2;
  static constexpr uint32_t kRedBytes = 2 * 2 * kHeads * 4;  // [max, sum][consumer][head]
  // full / empty, and the fp8 path's `landed` (a raw tile's TMA copies complete).
  static constexpr uint32_t kBarBytes = 3 * kStages * 8;
  static constexpr size_t kSmemBytes =
      1024 + kQBytes + kStages * kTileBytes + kPBytes + kRedBytes + kBarBytes;
  static_assert(kHeads == 64, "one wgmma M per block");
  static_assert(kSmemBytes <= 232448, "over the sm_90 shared-memory limit per block");
  // Registers per producer / consumer thread (setmaxnreg). The fp8 producer also widens tiles,
  // and at 40 ptxas spilled its loop-invariant addresses; the consumers fit 224 (ptxas -v, no
  // spills at sm_90a).
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;
  static constexpr int kFp8ProducerRegs = 56, kFp8ConsumerRegs = 224;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 168 * kThreads &&
                    128 * kFp8ProducerRegs + 256 * kFp8ConsumerRegs <= 168 * kThreads,
                "register split exceeds the launch allocation");
};

/// The latent cache as a 4-D TMA tensor (mla_decode_sm90.cu encodes it per launch, tma_map.h):
/// dims (d, head, token in page, page), boxes of `rows` keys x one 128-byte atom column. rows = 0:
/// no TMA (every tile by cp.async).
struct MlaSm90Map {
  CUtensorMap latent;
  int rows = 0;
  /// The page size as a FastDiv (fast_div.h; set by the launcher, TMA or not): the producers'
  /// page lookups divide by it per tile. A runtime division there is ~30 instructions per warp
  /// and tile, twice per tile in the gather, which is all of a page-1 launch's tiles.
  FastDiv page;
};

/// The fp8 e4m3 latent's tiles (kFp8): a tile lands as raw bytes in the top kBytes of its bf16
/// stage, [5 atom columns of 128 e4m3][64 keys][128 B] under the 128-byte swizzle (the fifth
/// column holds dims 512..575 in its first 64 bytes of each row: TMA zero-fills the rest, the
/// gather leaves it), and the producer widens it in place into the stage's bf16 layout
/// [9][64 keys][128 B] (mla_widen_stage) before publishing it. Half the bytes of a bf16 tile
/// cross HBM and L2; the consumers run unchanged. (The mma.sync kernel's fp8 path, the route
/// before, ran at 27 % of copy bandwidth at h_q 16 and 0.38x the bf16 speed at h_q 128 on the
/// H200: bench/results/mla_h200.md.)
struct MlaSm90Fp8 {
  static constexpr int kAtoms = 5;  // 128-byte atom columns of a raw row (576 B: 4.5)
  static constexpr uint32_t kAtomBytes = MlaSm90Config::kKeys * 128;
  static constexpr uint32_t kBytes = kAtoms * kAtomBytes;  // 40,960 (TMA counts the zero fill)
  static constexpr uint32_t kOff = MlaSm90Config::kTileBytes - kBytes;  // 32,768
  static_assert(kOff % 1024 == 0, "raw columns start on the swizzle pattern's period");
  static constexpr int kBar = 3;  // the producer's named barrier (the consumers use 1 and 2)
};

/// Widens the raw e4m3 tile of the stage at shared address `stage` in place into bf16, by the
/// producer's 128 threads (t128 = 0..127, all of them, together): raw chunk c (16 e4m3 of dims
/// 128a + 16c ..) of row r of raw column a becomes bf16 chunks 2 (c % 4) and 2 (c % 4) + 1 of
/// row r of bf16 column 2a + c / 4 (widen16: exact for every finite e4m3; the NaN codes come out
/// finite, as on the mma.sync path). Raw column a is read from [kOff + 8192 a, +8192) and bf16
/// columns 2a, 2a + 1 are written to [16384 a, +16384): column a's writes overlap raw columns
/// a - 2 .. a and never a later one, so the order
///   read 0, write 0, read 1, write 1 | read 2, write 2, read 3 | write 3, read 4 | write 4
/// (| = a barrier of the 128 threads) overwrites no raw byte before every thread has read it.
/// Thread t128 takes chunk c = t128 % 8 of rows t128 / 8 + 16k (k < 4) of every column (of
/// column 4, where only chunks 0..3 are live, the threads with c < 4 alone): rows 16 apart share
/// the swizzle phase, so every address is one of two per-thread offsets from the stage plus an
/// immediate (a chunk's high half goes 16 bytes from its low half's swizzled place: XOR 16).
/// A warp reads whole 128-byte rows, and neither the reads nor the writes take more than their
/// 4 wavefronts per 512 bytes.
__device__ __forceinline__ void mla_widen_stage(uint32_t stage, int t128) {
  using F = MlaSm90Fp8;
  constexpr uint32_t kCol = F::kAtomBytes;  // one 64-row column, raw or bf16 (8,192 bytes)
  const int r = t128 >> 3, c = t128 & 7;
  const uint32_t rd = stage + F::kOff + sw128_offset(r, c);
  const uint32_t wr = stage + uint32_t(c >> 2) * kCol + sw128_offset(r, 2 * (c & 3));
  uint4 x[4];
  auto read = [&]<int kAt>() {
    if (kAt < 4 || c < 4) {
#pragma unroll
      for (int k = 0; k < 4; ++k) ld_shared16(rd + kAt * kCol + 2048u * k, x[k]);
    }
  };
  auto write = [&]<int kAt>() {
    if (kAt < 4 || c < 4) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        uint4 lo, hi;
        widen16<__nv_bfloat16>(x[k], lo, hi);
        const uint32_t at = wr + 2 * kAt * kCol + 2048u * k;  // 32-byte aligned offsets
        st_shared16(at, lo);
        st_shared16(at ^ 16u, hi);
      }
    }
  };
  read.template operator()<0>();
  write.template operator()<0>();
  read.template operator()<1>();
  write.template operator()<1>();
  named_bar_sync(F::kBar, 128);
  read.template operator()<2>();
  write.template operator()<2>();
  read.template operator()<3>();
  named_bar_sync(F::kBar, 128);
  write.template operator()<3>();
  read.template operator()<4>();
  named_bar_sync(F::kBar, 128);
  write.template operator()<4>();
}

/// Warp 0 of a producer, lane `lane`: the TMA boxes of the 64-key tile whose first key is `key0`
/// into the stage at `dst`, kAtoms atom columns of kColElems elements (128 bytes) each, one box of
/// map.rows keys per page (or one per tile inside a larger page; lane j holds the page of box j
/// in `page`), completing on `bar`, on which lane 0 first arrives expecting `bytes`.
template <int kAtoms, int kColElems>
__device__ __forceinline__ void mla_sm90_tma_tile(const MlaSm90Map& map, uint32_t dst, int key0,
                                                  int page, int ps, uint64_t* bar, uint32_t bytes,
                                                  int lane) {
  constexpr int kKeys = MlaSm90Config::kKeys;
  constexpr uint32_t kAtomBytes = kKeys * 128;  // one atom column of a 64-key tile
  if (lane == 0) mbar_arrive_expect_tx(bar, bytes);
  const int box = map.rows;
  const int tok = box < ps ? map.page.mod(key0) : 0;  // boxes of whole pages: 0
  for (int j = 0; j * box < kKeys; ++j) {
    const int pg = __shfl_sync(0xffffffffu, page, j);
    if (lane == 0) {
#pragma unroll
      for (int at = 0; at < kAtoms; ++at) {
        tma_load_4d(dst + at * kAtomBytes + uint32_t(j * box) * 128u, &map.latent, at * kColElems,
                    0, tok, pg, bar);
      }
    }
  }
}

/// The producer warpgroup of the fp8 path (kFp8; t128 = 0..127, warp = t128 / 32): tile t's raw
/// bytes land in stage t % 2 (TMA boxes of `map.rows` keys x 128 bytes into `landed`, the
/// whole tiles of a chunk that starts on a box boundary, as the bf16 path; the rest by the
/// cp.async gather, zero-filled past the chunk's keys), then every producer thread widens them
/// (mla_widen_stage), fences its stores into the async proxy and arrives on `full`. Schedule:
/// tiles 0 and 1 are issued up front; turn t widens tile t (which landed while the consumers ran
/// tile t - 1), then waits for tile t - 1's stage and issues tile t + 1 into it. So tile t + 1
/// lands and is widened while the consumers run tile t: the consumers never wait on the
/// widening unless landing and widening a tile take longer than consuming one.
template <bool kTma>
__device__ __forceinline__ void mla_sm90_fp8_producer(const AttentionArgs& a, const MlaSm90Map& map,
                                                      const int32_t* pages, int kv_lo, int n,
                                                      int ntiles, uint32_t kv_addr, uint64_t* full,
                                                      uint64_t* empty, uint64_t* landed, int t128) {
  using C = MlaSm90Config;
  using F = MlaSm90Fp8;
  constexpr int kS = C::kStages;
  const int warp = t128 / 32, lane = t128 % 32;
  const int ps = a.page_size;
  const auto* kg = static_cast<const uint8_t*>(a.k.data);
  const int box = map.rows;
  const int ntma = kTma && kv_lo % box == 0 ? n / C::kKeys : 0;
  // TMA: lane j < kKeys / box of warp 0 looks up the page of box j (a tile ahead).
  auto box_page = [&](int tile) -> int {
    return warp == 0 && tile < ntma && lane * box < C::kKeys
               ? __ldg(pages + map.page.div(kv_lo + tile * C::kKeys + lane * box))
               : 0;
  };
  // The gather (the bf16 path's, 16-byte chunks of e4m3): lane = (sub, c8) copies chunk c8 of
  // raw columns 0..3, and of column 4 when c8 < 4, of the rows warp * 16 + 4 g + sub (g < 4);
  // lanes 0..15 of warp w look up the pages of keys 16 w .. 16 w + 15 (a tile ahead).
  constexpr int kRows = C::kKeys / 4;
  const int c8 = lane % 8, sub = lane / 8;
  // Row 4 g + sub of the warp's 16 is 4 (g % 2) + sub mod 8: the odd groups' swizzle phase is
  // the even ones' XOR 4, so their offset is the even one's + 512 with bit 6 flipped.
  const uint32_t so_even = sw128_offset(warp * kRows + sub, c8);
  auto lookup = [&](int tile) -> int {
    const int key = tile * C::kKeys + warp * kRows + lane;
    return lane < kRows && tile < ntiles && key < n ? __ldg(pages + map.page.div(kv_lo + key)) : -1;
  };
  int box_next = box_page(0), row_next = lookup(ntma);
  auto issue = [&](int t) {  // tile t into its stage, which is free
    const int s = t % kS;
    const uint32_t raw = kv_addr + s * C::kTileBytes + F::kOff;
    if (t < ntma) {
      const int page = box_next;
      box_next = box_page(t + 1);
      if (warp == 0) {
        mla_sm90_tma_tile<F::kAtoms, 128>(map, raw, kv_lo + t * C::kKeys, page, ps, &landed[s],
                                          F::kBytes, lane);
      }
      return;
    }
    const int page = row_next;
    const int key = t * C::kKeys + warp * kRows + lane;
    const int64_t off = page < 0 ? -1
                                 : int64_t(page) * a.k.page_stride +
                                       int64_t(map.page.mod(kv_lo + key)) * a.k.token_stride;
    row_next = lookup(t + 1);
#pragma unroll
    for (int g = 0; g < kRows / 4; ++g) {
      const int64_t o = __shfl_sync(0xffffffffu, off, 4 * g + sub);
      const uint32_t d =
          raw + ((g & 1) ? (so_even + 512u) ^ 64u : so_even) + uint32_t(g >> 1) * 1024u;
      const uint8_t* src = o < 0 ? kg : kg + o + c8 * 16;
#pragma unroll
      for (int at = 0; at < F::kAtoms; ++at) {
        if (at < F::kAtoms - 1 || c8 < 4) {
          asm volatile(
              "cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d + at * F::kAtomBytes),
              "l"(o < 0 ? src : src + at * 128), "r"(o < 0 ? 0 : 16));
        }
      }
    }
    cp_async_commit();
  };
  for (int t = 0; t < min(ntiles, kS); ++t) issue(t);
  for (int t = 0; t < ntiles; ++t) {
    const int s = t % kS;
    if (t < ntma) {
      mbar_wait(&landed[s], (t / kS) & 1);
    } else {
      // Gathered: this thread's copies of tile t (tile 1's may still be in flight at t = 0),
      // then every producer thread's.
      if (t == 0 && ntiles > 1) {
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      named_bar_sync(F::kBar, 128);
    }
    mla_widen_stage(kv_addr + s * C::kTileBytes, t128);
    fence_proxy_async();  // the widened tile before the consumers' wgmmas and later TMA writes
    mbar_arrive(&full[s]);
    if (t >= 1 && t + 1 < ntiles) {
      mbar_wait(&empty[(t + 1) % kS], ((t - 1) / kS) & 1);  // tile t - 1's stage is free
      issue(t + 1);
    }
  }
  cp_async_wait<0>();  // (every gathered tile was waited for; kept as the bf16 path keeps it)
}

/// The producer warpgroup of the bf16 path (its warp 0..3 and lane): tile t of the chunk into
/// stage t % 2 (see the top of this file: TMA boxes of whole tiles, else the cp.async gather),
/// each stage refilled once the consumers have freed it (`empty`), published on `full` (128
/// arrivals). The kernels for few heads (mla_decode_sm90_small_kernel.cuh) run it too.
template <bool kTma>
__device__ __forceinline__ void mla_sm90_bf16_producer(const AttentionArgs& a,
                                                       const MlaSm90Map& map, const int32_t* pages,
                                                       int kv_lo, int n, int ntiles,
                                                       uint32_t kv_addr, uint64_t* full,
                                                       uint64_t* empty, int warp, int lane) {
  using T = __nv_bfloat16;
  using C = MlaSm90Config;
  constexpr int kS = C::kStages;
  constexpr uint32_t kAtomBytes = C::kKeys * 128;  // one atom column of a 64-row operand
  const int ps = a.page_size;
  const T* kg = static_cast<const T*>(a.k.data);
  constexpr int kRows = C::kKeys / 4;  // rows per warp (16)
  // TMA: the chunk's whole tiles when it starts on a box boundary. A box copies whole page
  // rows, and the rows past the chunk's keys may hold anything (NaN there would reach O
  // through P = 0 times V), so a last tile that ends past them goes by cp.async, zero-filled.
  const int box = map.rows;
  const int ntma = kTma && kv_lo % box == 0 ? n / C::kKeys : 0;
  int t = 0;
  if (ntma > 0) {  // never without kTma (ntma is then the constant 0)
    // Lane j < kKeys / box of warp 0 looks up the page of box j (the next tile's lookup is in
    // flight while this one is issued).
    auto box_page = [&](int tile) -> int {
      return warp == 0 && tile < ntma && lane * box < C::kKeys
                 ? __ldg(pages + map.page.div(kv_lo + tile * C::kKeys + lane * box))
                 : 0;
    };
    int pnext = box_page(0);
    for (; t < ntma; ++t) {
      const int s = t % kS;
      const int page = pnext;
      pnext = box_page(t + 1);
      if (t >= kS) mbar_wait(&empty[s], ((t / kS) - 1) & 1);
      // Lane 0 of warp 0 arrives with the tile's byte count and issues every box; the other
      // 127 producer threads arrive at once (full counts 128 arrivals).
      if (warp == 0) {
        mla_sm90_tma_tile<C::kAtoms, 64>(map, kv_addr + s * C::kTileBytes, kv_lo + t * C::kKeys,
                                         page, ps, &full[s], C::kTileBytes, lane);
        if (lane != 0) mbar_arrive(&full[s]);
      } else {
        mbar_arrive(&full[s]);
      }
    }
  }
  // The gather: lane = (sub, c8) copies 16-byte chunk c8 of every atom column of the rows
  // warp * 16 + 4 g + sub (g < 4), 4 rows per instruction; one shuffle per row group hands it
  // the row's offset. The swizzle depends on the row mod 8 = 4 (g % 2) + sub: two shared-memory
  // offsets cover every group.
  const int c8 = lane % 8, sub = lane / 8;
  const T* kgc = kg + c8 * 8;
  const uint32_t so_base[2] = {sw128_offset(warp * kRows + sub, c8),
                               sw128_offset(warp * kRows + 4 + sub, c8)};
  auto lookup = [&](int tile) -> int {
    const int key = tile * C::kKeys + warp * kRows + lane;
    return lane < kRows && tile < ntiles && key < n ? __ldg(pages + map.page.div(kv_lo + key)) : -1;
  };
  int page_next = lookup(t);
  for (; t < ntiles; ++t) {
    const int s = t % kS;
    const int page = page_next;
    const int key = t * C::kKeys + warp * kRows + lane;
    const int64_t off = page < 0 ? -1
                                 : int64_t(page) * a.k.page_stride +
                                       int64_t(map.page.mod(kv_lo + key)) * a.k.token_stride;
    page_next = lookup(t + 1);
    if (t >= kS) mbar_wait(&empty[s], ((t / kS) - 1) & 1);
    const uint32_t dst = kv_addr + s * C::kTileBytes;
#pragma unroll
    for (int g = 0; g < kRows / 4; ++g) {
      const int64_t o = __shfl_sync(0xffffffffu, off, 4 * g + sub);
      const uint32_t d = dst + so_base[g & 1] + uint32_t(g >> 1) * 1024u;
#pragma unroll
      for (int at = 0; at < C::kAtoms; ++at) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d + at * kAtomBytes),
                     "l"(o < 0 ? kg : kgc + o + at * 64), "r"(o < 0 ? 0 : 16));
      }
    }
    cp_async_mbar_arrive(&full[s]);  // completes when this lane's copies have landed
  }
  cp_async_wait<0>();  // leave no copy in flight behind an exited thread
}

/// A block's shared memory from its 1024-aligned start: Q (kQBytes), the kStages latent stages,
/// P (kPBytes), the row maxima then the row sums (kRedBytes, halves), then the full, empty and
/// (fp8) landed mbarriers of the stages. Cfg: MlaSm90Config or MlaSm90SmallConfig.
template <typename Cfg>
struct MlaSm90Smem {
  uint32_t q_addr, kv_addr, p_addr;  // shared addresses; stage s at kv_addr + s * kTileBytes
  unsigned char* p;                  // P, generic
  float *red_max, *red_sum;
  uint64_t *full, *empty, *landed;
  __device__ __forceinline__ explicit MlaSm90Smem(unsigned char* raw) {
    constexpr int kS = MlaSm90Config::kStages;
    const uint32_t raw_addr = smem_addr(raw);
    const uint32_t pad = ((raw_addr + 1023u) & ~1023u) - raw_addr;
    q_addr = raw_addr + pad;
    kv_addr = q_addr + Cfg::kQBytes;
    p_addr = kv_addr + kS * MlaSm90Config::kTileBytes;
    p = raw + pad + Cfg::kQBytes + kS * MlaSm90Config::kTileBytes;
    red_max = reinterpret_cast<float*>(p + Cfg::kPBytes);
    red_sum = red_max + Cfg::kRedBytes / 8;
    full = reinterpret_cast<uint64_t*>(p + Cfg::kPBytes + Cfg::kRedBytes);
    empty = full + kS;
    landed = empty + kS;
  }
};

/// The producer warpgroup of either latent type (t128 = 0..127): mla_sm90_fp8_producer or
/// mla_sm90_bf16_producer. `landed` is the fp8 path's (kFp8).
template <bool kTma, bool kFp8>
__device__ __forceinline__ void mla_sm90_producer(const AttentionArgs& a, const MlaSm90Map& map,
                                                  const int32_t* pages, int kv_lo, int n,
                                                  int ntiles, uint32_t kv_addr, uint64_t* full,
                                                  uint64_t* empty, uint64_t* landed, int t128) {
  if constexpr (kFp8) {
    mla_sm90_fp8_producer<kTma>(a, map, pages, kv_lo, n, ntiles, kv_addr, full, empty, landed,
                                t128);
  } else {
    mla_sm90_bf16_producer<kTma>(a, map, pages, kv_lo, n, ntiles, kv_addr, full, empty, t128 / 32,
                                 t128 % 32);
  }
}

/// One thread (the caller's tid 0) initialises the stage barriers: full[s] expecting the
/// producer's 128 arrivals, empty[s] `consumers` arrivals, and with kFp8 landed[s] one (lane 0's
/// expect_tx); the block syncs after.
template <bool kFp8>
__device__ __forceinline__ void mla_sm90_init_barriers(uint64_t* full, uint64_t* empty,
                                                       uint64_t* landed, int consumers) {
  if constexpr (kFp8) {
    for (int i = 0; i < MlaSm90Config::kStages; ++i) mbar_init(&landed[i], 1);
  }
  mbar_init_ring(full, empty, MlaSm90Config::kStages, 128, consumers);
}

/// Q of one query row, heads head0 .. head0 + kRows - 1, into [9 atom columns][kRows][128 B]
/// (128B-swizzled) at q_addr by cp.async, thread t of kThreads (heads at and past nb are zero),
/// then waited for and fenced into the async proxy; the caller syncs its consumers after.
template <int kRows, int kThreads>
__device__ __forceinline__ void mla_sm90_load_q(const AttentionArgs& a, int row, int head0, int nb,
                                                uint32_t q_addr, int t) {
  using C = MlaSm90Config;
  const auto* qg = static_cast<const __nv_bfloat16*>(a.q) + int64_t(row) * a.q_stride_n +
                   int64_t(head0) * a.q_stride_h;
  for (int idx = t; idx < kRows * C::kChunks; idx += kThreads) {
    const int r = idx / C::kChunks, c = idx % C::kChunks;
    const bool ok = r < nb;
    const auto* src = ok ? qg + int64_t(r) * a.q_stride_h + c * 8 : qg;
    const uint32_t d = q_addr + (c / 8) * uint32_t(kRows * 128) + sw128_offset(r, c % 8);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "r"(ok ? 16 : 0));
  }
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async();
}

/// kTma: the launch has a latent map (map.rows > 0): whole tiles by TMA, and lazy rescaling in
/// the consumers. Without it every tile goes by cp.async and O is rescaled on every tile: on the
/// H200 the lazy rescaling measured 3 % faster with TMA and 2-3 % slower without it, and the
/// TMA branch in the producer cost the page-1 path another few percent when compiled in
/// (bench/results/mla_h200.md, 2026-12-02, fifth session).
/// kFp8: the latent is fp8 e4m3 (MlaSm90Fp8's producer); else bf16.
template <bool kTma, bool kFp8>
__global__ void __launch_bounds__(384, 1)
    mla_decode_sm90_kernel(AttentionArgs a, LogitTransform xf,
                           const __grid_constant__ MlaSm90Map map) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  pdl_wait();  // reads the latent rows the previous kernel stored (pdl.cuh)
  pdl_launch_dependents();
  using T = __nv_bfloat16;
  using C = MlaSm90Config;
  constexpr int kS = C::kStages;
  constexpr uint32_t kAtomBytes = C::kKeys * 128;  // one atom column of a 64-row operand

  int item = 0, hb = 0;
  mla_block_coords((a.num_qo_heads + C::kHeads - 1) / C::kHeads, item, hb);
  DecodeItem work;
  if (!load_decode_item(a, item, work)) return;
  const int b = work.b, kv_lo = work.kv_lo, n = work.n, partial = work.partial;
  const int ntiles = (n + C::kKeys - 1) / C::kKeys;

  extern __shared__ unsigned char smem_raw[];
  const MlaSm90Smem<C> sm(smem_raw);
  const uint32_t q_addr = sm.q_addr, kv_addr = sm.kv_addr, p_addr = sm.p_addr;
  unsigned char* p_smem = sm.p;
  float *red_max = sm.red_max, *red_sum = sm.red_sum;  // [consumer][head] each
  uint64_t *full = sm.full, *empty = sm.empty, *landed = sm.landed;

  const int tid = threadIdx.x;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0), t128 = tid % 128;  // wg: warp-uniform
  const int warp = t128 / 32, lane = tid % 32;
  if (tid == 0) mla_sm90_init_barriers<kFp8>(full, empty, landed, 256);  // two consumers
  __syncthreads();

  const int32_t* pages = a.plan.kv_indices + a.plan.kv_indptr[b];
  if (wg == 0) {
    // ================= producer =================
    reg_dealloc<kFp8 ? C::kFp8ProducerRegs : C::kProducerRegs>();
    mla_sm90_producer<kTma, kFp8>(a, map, pages, kv_lo, n, ntiles, kv_addr, full, empty, landed,
                                  t128);
    return;
  }

  // ================= consumers =================
  reg_alloc<kFp8 ? C::kFp8ConsumerRegs : C::kConsumerRegs>();
  const int cw = wg - 1;  // consumer: keys [32 cw, 32 cw + 32) of S, columns [256 cw, +256) of O
  const int quad = lane % 4;
  const int block_head0 = hb * C::kHeads;
  const int nb = min(C::kHeads, a.num_qo_heads - block_head0);  // q heads of this block
  const int row = a.plan.qo_indptr[b];

  // Q [64 heads][576] (both consumers, 256 threads); rows past Hq are zero.
  mla_sm90_load_q<C::kHeads, 256>(a, row, block_head0, nb, q_addr, tid - 128);
  named_bar_sync(1, 256);

  float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f};
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  const int r0 = warp * 16 + lane / 4;  // this thread's rows r0 and r0 + 8 (heads in the block)

  const uint64_t q_desc = sw128_desc(q_addr, 16, 1024);  // operand descriptors (desc_advance)
  const uint64_t p_desc = sw128_desc(p_addr, 16, 1024);
  for (int t = 0; t < ntiles; ++t) {
    const int s = t % kS;
    mbar_wait(&full[s], (t / kS) & 1);
    fence_proxy_async();  // the producer's landed copies, before this thread's wgmma reads
    const uint32_t k_addr = kv_addr + s * C::kTileBytes;
    const uint64_t k_desc = sw128_desc(k_addr + cw * 32 * 128, 16, 1024);
    // ---- S_c = Q K_c^T ----
    float sc[16];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::kDqk / 16; ++kk) {
      const uint32_t atom = (kk / 4) * kAtomBytes, sub = (kk % 4) * 32;
      wgmma_ss<T, 32>(sc, desc_advance(q_desc, atom + sub), desc_advance(k_desc, atom + sub),
                      kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(sc);
    // sc[4j + 2h + e]: row r0 + 8h, key 32 cw + 8j + 2 quad + e of the tile.
    const int key0 = t * C::kKeys + cw * 32 + 2 * quad;
    float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int key = key0 + 8 * (i / 4) + (i & 1);
      sc[i] = key < n ? xf(sc[i]) : neg_inf();
      mx[(i / 2) & 1] = fmaxf(mx[(i / 2) & 1], sc[i]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      if (quad == 0) red_max[cw * C::kHeads + r0 + 8 * h] = mx[h];
    }
    named_bar_sync(1, 256);
    // Lazy rescaling with kTma (as in prefill_common's softmax_tile): m moves, and O and l are
    // rescaled, only when some row of this warp's 16 grows by more than kLazyRescale (P then
    // stays <= 2^8). Warp w of both consumers holds the same rows, the same m and reads the same
    // maxima, so both take the same branch and their halves of P share one m.
    float mnew[2], alpha[2] = {1.f, 1.f};
    bool grow = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mnew[h] = fmaxf(m[h], fmaxf(red_max[r0 + 8 * h], red_max[C::kHeads + r0 + 8 * h]));
      grow |= mnew[h] > m[h] + kLazyRescale;
    }
    const bool rescale = !kTma || __any_sync(0xffffffffu, grow);
    if (rescale) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        alpha[h] = exp2_diff(m[h], mnew[h]);
        m[h] = mnew[h];
      }
    }
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float p0 = exp2_diff(sc[4 * j + 2 * h], m[h]);
        const float p1 = exp2_diff(sc[4 * j + 2 * h + 1], m[h]);
        sum[h] += p0 + p1;
        *reinterpret_cast<uint32_t*>(p_smem + sw128_offset(r0 + 8 * h, 4 * cw + j) + 4 * quad) =
            pack2<T>(p0, p1);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) l[h] = l[h] * alpha[h] + sum[h];
    if (rescale) {
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] *= alpha[(i / 2) & 1];
    }
    fence_proxy_async();     // P (generic stores) before the wgmmas read it
    named_bar_sync(2, 256);  // both halves of P are in place
    // ---- O_c += P V_c ----
    fence_operands(o);
    wgmma_fence();
    const uint64_t v_desc = sw128_desc(k_addr + 4 * cw * kAtomBytes, kAtomBytes, 1024);
#pragma unroll
    for (int k2 = 0; k2 < C::kKeys / 16; ++k2) {
      wgmma_ss_tb<T, 256>(o, desc_advance(p_desc, k2 * 32), desc_advance(v_desc, k2 * 16 * 128));
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(o);
    mbar_arrive(&empty[s]);
  }

  // ---- row sums over the quad and both consumers (m is the same in both) ----
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    if (quad == 0) red_sum[cw * C::kHeads + r0 + 8 * h] = l[h];
  }
  named_bar_sync(1, 256);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r0 + 8 * h;
    if (r >= nb) continue;
    const float lsum = red_sum[r] + red_sum[C::kHeads + r];
    const int head = block_head0 + r;
    const int col0 = cw * 256 + 2 * quad;
    if (partial < 0) {
      float lse;
      const float f = finalize_state(m[h], lsum, a.sinks, head, a.v_scale, lse);
      T* op = static_cast<T*>(a.out) + int64_t(row) * a.o_stride_n + int64_t(head) * a.o_stride_h;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<uint32_t*>(op + col0 + 8 * j) =
            pack2<T>(o[4 * j + 2 * h] * f, o[4 * j + 2 * h + 1] * f);
      }
      if (cw == 0 && quad == 0 && a.lse != nullptr) {
        a.lse[int64_t(row) * a.lse_stride_n + int64_t(head) * a.lse_stride_h] = lse;
      }
    } else {
      const bool none = m[h] == neg_inf() || lsum <= 0.f;
      const float f = none ? 0.f : a.v_scale / lsum;
      const size_t base = size_t(partial) * a.num_qo_heads + head;
      float* po = a.partial_o + base * C::kDv + col0;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<float2*>(po + 8 * j) =
            make_float2(o[4 * j + 2 * h] * f, o[4 * j + 2 * h + 1] * f);
      }
      if (cw == 0 && quad == 0) a.partial_lse[base] = none ? neg_inf() : m[h] + log2f(lsum);
    }
  }
#else
  __trap();  // launched only where the sm_90a image exists (mla_decode_sm90_chosen)
#endif
}

}  // namespace pagoda::kernels::cuda::detail
