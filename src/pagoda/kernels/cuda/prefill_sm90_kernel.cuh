#pragma once
/// Hopper (sm_90a) paged prefill / extend / verify: wgmma from shared memory, a producer
/// warpgroup gathering paged K/V, two consumer warpgroups (three at D 64).
///
/// Same work decomposition and planner as prefill_kernel (a work item is
/// prefill_rows_per_tile(DQK, true) packed rows x one kv head, 64 rows per consumer: 192 at D 64,
/// 128 elsewhere; GQA rows packed as r -> (token r / G, head hkv * G + r % G)). The plan must
/// have been made for this kernel (AttentionArgs::prefill_sm90): the mma.sync kernel's items are
/// 128 rows (64 at D 256). Three consumers at D 64 (512 threads), as FA3 has at that head dim:
/// a D 64 tile has half a D 128 tile's GEMM work and the same softmax work, and with two
/// consumers ncu put no pipe above 39 % busy there (tensor 34 %, MUFU 37 %); the third made D 64
/// 1.24x faster on the H200 (same-call A/B, bench/results/hopper_h200.md, 2026-12-04 seventh
/// session).
///
/// Persistent: the grid is at most one block per SM (the launcher's choice) and each block runs
/// a sequence of work units, unit = (work item, kv head); see sm90_unit(). The producer streams
/// the K/V tiles of one unit after another through one ring (it runs up to kStages tiles ahead,
/// across unit boundaries). Outside the overlap schedule each consumer issues the next unit's Q
/// load before it stores the current unit's output, so a unit's prologue and epilogue overlap
/// its neighbours' work. (Issuing that load inside the tile loop, right after the last S GEMM,
/// cost 13 % at B4 S4096 on the H200: ptxas then gave P its own registers and moved the row sums
/// between the P V wgmmas.) Under the overlap schedule (kOverlap, D 128) the pipeline runs across
/// units: the producer loads Q into two buffers (the next unit's while this one runs; Q `empty`
/// barriers), a unit's first turn issues its first S GEMM beside the previous unit's last P V
/// GEMM, and the previous unit's output goes out after that GEMM's wait, staged through the
/// previous unit's own Q buffer: one TMA store per atom column when the warpgroup's 64 rows are
/// whole and G divides 64, else 16-byte row stores by every thread (store_tile_staged). The TMA
/// stores' reads of the buffer are waited for a turn later (release_q), when the buffer goes
/// back to the producer. The first turn is a copy of its own (turn<true>), so the steady-state
/// turns carry none of that code (a runtime test there cost ~550 register moves in the loop).
/// Two Q buffers leave 2 K and 3 V stages. Same call on the H200 against the unit-by-unit
/// overlap (2026-12-04, eleventh session): B16 S1024 4.3 % faster, B4 S4096 2.8 %, extend
/// 1.0 %, but tree verify 5.8 % slower (every round). The deferred TMA stores then took 4.8 %
/// at B16 S1024, 3.5 % at B1 S4096, 1.9 % at B4 S4096 and 4.2 % at tree verify, which is back
/// at its time before the cross-unit pipeline; waiting for the stores' reads in the epilogue
/// itself held warp 0, and the warpgroup's next GEMM with it, and lost 1.1-1.3 % at B4 S4096,
/// page 1 and extend (twelfth session, bench/results/hopper_h200.md).
/// A grid of one block per unit (KernelOptions::sm90_persistent off) is the non-persistent kernel.
/// Unit records (PrefillSm90Config::kRecords, the two-stage configuration D 256):
/// only the producer walks the schedule and reads the plan; it publishes each unit (its work
/// item, kv head, rows and keys: Sm90UnitRec) in a two-slot ring of shared-memory records with
/// their own full / empty mbarriers, and the consumers take their units from there. The
/// three-stage configurations (D 64, 128, DQK 192) walk the schedule in every warpgroup
/// (sm90_next_unit, prefill_work), which measured faster there. Either way the consumers gather
/// Q without integer divisions (it had a division and a modulo by G per 16-byte chunk; at d684115 a
/// consumer warp ran ~1,800 instructions per unit switch, 1,262 once plus a 135-instruction Q
/// loop about 4 times, against ~570 per key tile, and ncu put 19 % of all stall samples at B16
/// S1024 on the once-per-unit code and 5 % on the Q loop).
///
/// Roles (Cfg::kThreads: 384, 512 at D 64; one block per SM):
///  * warpgroup 0, producer: the K/V tiles of kKeys keys (128; 64 at D 256 and DQK 192) into a
///    kStages-deep ring of 128B-swizzled shared-memory tiles, each stage with a `full` and an
///    `empty` mbarrier (it waits on `empty` before reusing a stage; under the overlap schedule
///    K and V of a stage have a pair each, full_k / empty_k and full_v / empty_v). Every
///    arrival is one per warp (lane 0): per thread, the shared-memory atomics were 32 times as
///    many. Two ways:
///    - TMA (kRecords configurations at page size >= 16, Sm90KvMaps): lane 0 of warp 0 arrives
///      on `full` with the stage's byte count and issues one 4-D box per page (or per tile when
///      the page is larger) and atom column of K and V; lanes of warp 0 look up the next tile's
///      pages meanwhile, and lane 0 of each other producer warp only arrives. Used for every
///      tile of a unit whose first key is on a box boundary, except a last tile that ends past
///      the request's keys (a box copies whole page rows, and the unused rows of the last page
///      may hold anything: NaN there would reach O through P = 0 times V).
///    - cp.async (every other tile: D 64 / 128 / DQK 192, page sizes < 16, the tails, window
///      starts off a box; at D 128 TMA boxes of 16-key pages measured 2-7 % slower than this
///      under tile by tile, 35-54 % under the overlap, bench/results/hopper_h200.md): each
///      warp owns a quarter of the rows and a lane looks up the page of one of them (any page
///      size; the next tile's lookup is in flight while this one is issued); warp shuffles hand
///      the row addresses and pages to the copying lanes (8 per row, 4 rows per instruction,
///      every 128-byte atom column per shuffle), which copy 16-byte chunks (zero-filled past the
///      request's keys) at immediate offsets from one pointer per row. (Per chunk, a select and a
///      64-bit add of an element offset took ~14 instructions; the leaner issue made D 128
///      1.9-5.8 % faster on the H200, so the producer's issue slots are the consumers' too:
///      bench/results/hopper_h200.md, 2026-12-04 ninth session.)
///      First the tile's K, then, once only that group is younger, the previous tile is
///      published (its copies waited for, fenced into the async proxy, `full` arrived on), then
///      V. So a tile is published as soon as the next tile's K stage is free, not after its V
///      stage, which the overlapped consumers hold longer.
///  * warpgroups 1 .. kConsumers, consumers, 64 packed rows each: Q staged once per unit
///    (128B-swizzled; by the consumers themselves, or by the producer under kOverlap);
///    per tile S = Q K^T with wgmma m64nKk16 (K = kKeys; both operands in shared memory),
///    masking and online softmax in registers (base 2, lazy rescaling as in prefill_kernel), then
///    O += P V with wgmma m64nDVk16 (P from registers, V MN-major from shared memory), and an
///    arrive on `empty`. Two schedules:
///    - overlap (kOverlap, D 128 by default; PrefillSm90Config::kCanOverlap): FA3's
///      intra-warpgroup overlap. Turn i issues S of tile i, then P V of tile i - 1; the
///      warpgroup waits for S alone, frees K, and runs tile i's softmax while its own P V GEMM
///      runs; then it waits for P V, frees V, rescales O by the softmax's factors
///      (softmax_tile_deferred) and converts P. Its own tensor work thus overlaps its softmax,
///      not only the other consumer's. (ptxas hoists the P V wait above the tile's
///      exponentials, so in the SASS the P V GEMM overlaps the row maxima only; a loop
///      between the two kept the exponentials first and measured 3-6 % slower on the H200,
///      2026-12-04 ninth session.) Same call on the H200 against the tile-by-tile kernel
///      (2026-12-04 eighth session): 1.6-4.2 % faster on every D 128 shape.
///    - tile by tile (D 64, 256, DQK 192; sm90_overlap off at D 128): S, the softmax, P V,
///      then the stage is freed.
/// Tiles a consumer's 64 rows cannot see (causal, window) skip both GEMMs. With kPingPong
/// (sm90_pingpong; two consumers only) the two consumers take strict turns issuing
/// their GEMMs through two named barriers, so one's softmax overlaps the other's tensor-core
/// work (FA3's ping-pong).
/// The warpgroup index goes through a lane-0 shuffle so the compiler knows it is warp-uniform:
/// the ring indices and wgmma descriptors then live in uniform registers (built once, moved by
/// desc_advance, sm90_utils.cuh), and issuing a wgmma costs a few uniform adds instead of a
/// dependent mask / shift / move chain (2-10 % faster at D >= 128 on the H200, D 64 unchanged;
/// bench/results/hopper_h200.md, 2026-12-02).
/// (Issuing P V of tile i together with S of tile i + 1 in one turn and waiting for both before
/// the softmax measured 5 % slower at D 128, 2026-12-02: it delays the softmax, overlapping
/// nothing.)
///
/// Shared memory (bytes, 1024-aligned): Q [DQK/64][128 rows][128 B], then per stage K
/// [DQK/64][kKeys][128 B] and V [DV/64][kKeys][128 B] (kOverlap: two Q buffers, then the K ring
/// of 2, then the V ring of 3, in the same bytes), then the mbarriers (K and V rings, record
/// ring, Q `empty` pair) and the two unit records. D = 256 takes 64-key tiles and 2 stages (Q 64
/// KB, 2 x 64 KB), so the consumers' registers hold O (128 per thread) beside a 64-key score tile;
/// DQK 192 / DV 128 (the non-absorbed MLA prefill of DeepSeek-style models) takes 64-key tiles
/// and 3 stages (Q 48 KB + 3 x 40 KB), tile by tile.
/// Supports 16-bit Q == KV types, DQK = DV = 64, 128 and 256, and DQK 192 / DV 128; fp8 KV uses
/// prefill_kernel (D = DQK = DV) or the generic kernel, except e4m3 K/V at D 128 under the overlap
/// schedule, which runs here (KV = E4M3, below; 3.4-3.8x the mma.sync kernel on the H100,
/// bench/results/records/h100_ab_kernels_dab988d.json).

#include <type_traits>

#include "pagoda/kernels/cuda/device_utils.cuh"
#include "pagoda/kernels/cuda/pdl.cuh"
#include "pagoda/kernels/cuda/prefill_common.cuh"
#include "pagoda/kernels/cuda/sm90_utils.cuh"

namespace pagoda::kernels::cuda::detail {

template <typename T, int DQK, int DV>
struct PrefillSm90Config {
  // Consumer warpgroups of 64 packed rows each: three at D 64 (see the top of this file), two
  // elsewhere.
  static constexpr int kConsumers = DQK == 64 ? 3 : 2;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr int kRows = 64 * kConsumers;  // packed rows per block
  // Keys per tile and ring depth: 128 keys x 3 stages at D <= 128, 64 x 2 at D = 256 (O then
  // takes 128 registers per consumer thread), 64 x 3 at DQK 192 / DV 128 (K 24 KB + V 16 KB per
  // stage; registers as at D = 128). DQK 192 took 128 x 2 with records and TMA before; 64 x 3,
  // tile by tile, measured 1.027-1.038x faster on the H100 (MLA prefill B4 S4096, B1 S8192 and
  // extend Q512 on 8k, h16; 5 interleaved rounds, bench/results/records/
  // h100_ab_kernels_dab988d.json); the same tiles on the overlap schedule 0.995-1.003x.
  static constexpr int kKeys = DQK <= 128 ? 128 : 64;
  static constexpr int kStages = DQK <= 192 ? 3 : 2;
  // The two-stage configuration (D 256) takes its units from the producer's records and its
  // full K/V tiles by TMA; the three-stage ones walk the schedule in every warpgroup and copy by
  // cp.async, which measured faster at D 128 in the same H200 call (bench/results/
  // hopper_h200.md, 2026-12-02, fourth session: records cost 2-9 % at D 128 wherever units have
  // many tiles, TMA another 2-7 %; at D 256 both together gained 7-12 %).
  static constexpr bool kRecords = kStages == 2;
  // Intra-warpgroup overlap of softmax and GEMMs (the consumers' kOverlap schedule): a consumer
  // then holds the V stage of tile i - 1 while tile i's K lands, so three stages are needed
  // (with two, the cp.async producer's publish of tile i waits for the stage of tile i - 1,
  // which the consumer frees only after tile i's softmax: a deadlock); and a second score tile
  // beside O and P, which three consumers' 152 registers do not hold (ptxas at D 64: 172 bytes
  // of spills and serialised wgmmas). So D 128 only (DQK 192: slower, above).
  static constexpr bool kCanOverlap = kStages >= 3 && kConsumers == 2 && DQK == DV;
  static constexpr uint32_t kQBytes = kRows * DQK * 2;
  static constexpr uint32_t kKTileBytes = kKeys * DQK * 2;            // one K tile
  static constexpr uint32_t kVTileBytes = kKeys * DV * 2;             // one V tile
  static constexpr uint32_t kStageBytes = kKTileBytes + kVTileBytes;  // K, then V
  // Data: Q, then kStages (K, V) stages; under the overlap schedule (which pipelines across
  // units, see the top of this file) the same bytes hold two Q buffers, a 2-deep K ring and a
  // 3-deep V ring instead (at D 128 exactly as many bytes).
  static constexpr uint32_t kDataBytes = kQBytes + kStages * kStageBytes;
  static constexpr int kXKStages = 2, kXVStages = 3;
  static_assert(!kCanOverlap ||
                    2 * kQBytes + kXKStages * kKTileBytes + kXVStages * kVTileBytes <= kDataBytes,
                "the overlap schedule's buffers exceed the stages'");
  // K and V rings (full / empty each), record ring, and the overlap schedule's Q `empty` pair.
  static constexpr uint32_t kBarBytes = 4 * kStages * 8 + 2 * 2 * 8 + 2 * 8;
  static constexpr uint32_t kRecBytes = 2 * 128;  // two Sm90UnitRec slots
  static constexpr size_t kSmemBytes = 1024 + kDataBytes + kBarBytes + kRecBytes;
  static_assert(kSmemBytes <= 232448, "over the sm_90 shared-memory limit per block");
  // setmaxnreg moves registers inside the block's launch allocation (168 x 384 under
  // __launch_bounds__(384, 1), 128 x 512 with three consumers); asking for more than was freed
  // blocks the consumers forever (seen on the H200 with 80 / 216). Producer / consumer: 56 / 224
  // with two consumers (since the consumers read their units from the producer's records, D 256,
  // O alone 128 registers per consumer thread, no longer spills at 224, and a 40-register
  // producer spilled in its tile loop, ptxas -v); 56 / 152 with three (D 64: the consumer code
  // uses up to R138, no spill).
  static constexpr int kProducerRegs = 56;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 224 : 152;
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kLaunchRegs * kThreads,
                "register split exceeds the launch allocation");
  static_assert((DQK == DV && (DQK == 64 || DQK == 128 || DQK == 256)) || (DQK == 192 && DV == 128),
                "sm90 prefill supports D = 64, 128, 256 and DQK 192 / DV 128");
  static_assert(kRows == prefill_rows_per_tile(DQK, true),
                "planner and kernel disagree on tile rows");
};

/// Unit orders of the persistent schedule (units u in [0, grid_items * Hkv)).
///  kItemSnake (the default): u -> (item u / Hkv, head u % Hkv): every head of the heaviest items
///    first; round r gives block k the unit rG + k (r even) or rG + G - 1 - k (r odd), so with the
///    planner's heaviest-first items each block's total stays within about one item of the mean.
///    The planner keeps items of one weight together by request, so the blocks running at one
///    time read the keys of a few requests.
///  kHeadMajor (sm90_head_major): u -> (item u % grid_items, head u / grid_items): the blocks
///    running at one time share a kv head; block k runs u = k, k + G, k + 2G, ... (G =
///    gridDim.x). Its loads are uneven whenever grid_items is near a multiple of G: block k then
///    takes items k, k + G - grid_items, ... of the sorted list, all heavy or all light (a host
///    simulation of the schedule at 128 items and 132 SMs put the heaviest block at 1.5-1.75x the
///    mean; ncu had the DQK 192 MLA prefill's SMs 65 % active; on the H200 one 4,096-token prompt
///    at 32 / 8 heads ran 1.66x longer than in kItemSnake order, the MLA prefill 1.5x;
///    bench/results/hopper_h200.md, 2026-12-04 seventh session).
enum Sm90Order : int { kHeadMajor = 0, kItemSnake = 1 };

/// What the schedule, the row packing and the page lookups divide by, fixed per launch (the
/// launcher fills it): the unit order (Sm90Order), and as FastDivs (fast_div.h) the group size
/// G = num_qo_heads / num_kv_heads, the kv head count, the plan's grid_items and the page size.
/// A runtime int division is ~30 instructions. In 5d0d4df's D 128 overlap kernel at B16 S1024
/// (ncu's per-instruction counts of one launch on the H200, mapped to source lines with
/// nvdisasm -gi on this machine) 29 division sequences ran 335,232 times per launch, 8.0 % of all
/// warp instructions and of the stall samples: a consumer warp divided by G or the kv head
/// count six times per unit, a producer warp four times per unit and by the page size once per
/// tile.
struct Sm90Sched {
  int order = kItemSnake;
  FastDiv g, hkv, items, page;
};

/// Work item and kv head of round r of this block; false past the block's last unit. Items at
/// or past plan.counts[1] (a graph's spare capacity) come back with item >= counts[1].
__device__ __forceinline__ bool sm90_unit(const AttentionArgs& a, const Sm90Sched& sc, int r,
                                          int& item, int& hkv) {
  const int g = gridDim.x, k = blockIdx.x;
  const int units = a.grid_items * a.num_kv_heads;
  const int u = r * g + (sc.order == kItemSnake && (r & 1) ? g - 1 - k : k);
  if (u >= units) return false;
  if (sc.order == kItemSnake) {
    item = sc.hkv.div(u);
    hkv = u - item * a.num_kv_heads;
  } else {
    hkv = sc.items.div(u);
    item = u - hkv * a.grid_items;
  }
  return true;
}

/// The next live unit at or after round r (r advances to it); false when the block is done.
__device__ __forceinline__ bool sm90_next_unit(const AttentionArgs& a, const Sm90Sched& sc, int& r,
                                               int& item, int& hkv) {
  for (;; ++r) {
    if (!sm90_unit(a, sc, r, item, hkv)) return false;
    if (item < a.plan.counts[1]) return true;
  }
}

/// What the producer tells the consumers about one unit (a slot of the record ring in shared
/// memory): its work item (item < 0: the block has no more units), kv head, rows and keys, and
/// the number of leading key tiles the custom mask leaves free (mask_free_cols).
struct Sm90UnitRec {
  PrefillWork work;
  int item, hkv, nfree;
};
static_assert(sizeof(Sm90UnitRec) <= 128, "record slot is 128 bytes");

/// Packed row pr's (token offset, head in the kv group): pr = tok * G + head. step() moves it
/// on by a fixed number of rows given as (rows / G, rows % G), without a division.
struct PackedRow {
  int tok, head;
  __device__ __forceinline__ PackedRow(int pr, const FastDiv& G)
      : tok(G.div(pr)), head(pr - tok * G.d) {}
  __device__ __forceinline__ void step(int dtok, int dhead, int G) {
    tok += dtok;
    head += dhead;
    if (head >= G) {
      head -= G;
      ++tok;
    }
  }
};

/// store_tile for one consumer warpgroup's 64 rows through shared memory: each warp writes its 16
/// rows of normalised O (16-bit, stmatrix) into `stage` (row 0 of this warpgroup's rows of a Q
/// buffer, 128B-swizzled like Q, atom columns kAtomStride bytes apart), the warpgroup syncs on
/// named barrier `bar`, and each thread then copies 16-byte chunks of whole rows to global
/// memory (two 256-byte rows per warp instruction at DV 128) instead of store_tile's 4-byte
/// pieces of eight rows (at B16 S1024 store_tile held 10 % of the stall samples, lg throttle
/// and short_sb: ncu, 2026-12-04 tenth session). LSE as store_tile. The caller keeps split-KV
/// partials (w.partial >= 0) and outputs whose rows are not 16-byte aligned on store_tile.
/// With `omap` (the output's tensor map, Sm90KvMaps::o) and all 64 rows inside the unit, lane 0
/// of warp 0 stores the staged rows instead, one TMA box per atom column, and returns true: that
/// thread must wait for the boxes' reads (tma_store_wait_read) before the stage is written
/// again. Warpgroup-collective (the result is the same in every thread).
template <typename T, int kDT, uint32_t kAtomStride>
__device__ __forceinline__ bool store_tile_staged(const AttentionArgs& a, const PrefillWork& w,
                                                  int hkv, int g0, int warp, int lane,
                                                  const float (&m)[2], const float (&l)[2],
                                                  const float (&o)[kDT][4], uint32_t stage, int bar,
                                                  const CUtensorMap* omap, const FastDiv& gdiv) {
  const int G = gdiv.d;
  float f[2];
  // Row h of this lane is packed row pr0 + 8 h: its (token, head) from one division, stepped.
  const int pr0 = g0 + warp * 16 + lane / 4;
  PackedRow lrow(pr0, gdiv);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float lsum = l[h];
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
    f[h] = 0.f;
    if (pr0 + 8 * h < w.rows) {
      const int head = hkv * G + lrow.head;
      float lse;
      f[h] = finalize_state(m[h], lsum, a.sinks, head, a.v_scale, lse);
      if (a.lse != nullptr && lane % 4 == 0) {
        a.lse[(w.q_begin + lrow.tok) * a.lse_stride_n + head * a.lse_stride_h] = lse;
      }
    }
    lrow.step(gdiv.div(8), gdiv.mod(8), G);
  }
  // The accumulator fragment of one n-tile and row half is an 8 x 8 matrix in stmatrix's
  // layout: one stmatrix.x4 per n-tile pair stores (d, rows 0-7), (d, 8-15), (d + 1, 0-7) and
  // (d + 1, 8-15) of the warp's 16 rows; lane j gives row j % 8 of matrix j / 8. (Four
  // st.shared.b32 per pair before.)
  const int sr = warp * 16 + ((lane / 8) & 1) * 8 + lane % 8;  // this lane's row of the 64
  const uint32_t srow = stage + uint32_t(sr) * 128u;
  const int sc = lane / 16;  // + 1 n-tile for matrices 2 and 3
#pragma unroll
  for (int d = 0; d < kDT; d += 2) {
    const uint32_t dst = srow + (d / 8) * kAtomStride + uint32_t((((d % 8) + sc) ^ (sr & 7)) << 4);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(dst),
                 "r"(pack2<T>(o[d][0] * f[0], o[d][1] * f[0])),
                 "r"(pack2<T>(o[d][2] * f[1], o[d][3] * f[1])),
                 "r"(pack2<T>(o[d + 1][0] * f[0], o[d + 1][1] * f[0])),
                 "r"(pack2<T>(o[d + 1][2] * f[1], o[d + 1][3] * f[1]))
                 : "memory");
  }
  if (omap != nullptr && g0 + 64 <= w.rows) {
    fence_proxy_async();  // the stmatrix writes, before the TMA engine reads them
    named_bar_sync(bar, 128);
    if (warp == 0 && lane == 0) {
#pragma unroll
      for (int at = 0; at < kDT / 8; ++at) {
        tma_store_3d(omap, stage + at * kAtomStride, at * 64, hkv * G, w.q_begin + gdiv.div(g0));
      }
      tma_store_commit();
    }
    return true;
  }
  named_bar_sync(bar, 128);
  // Thread t copies chunk t % C of rows t / C + (128 / C) j (C = kDT 16-byte chunks per row: an
  // n-tile is 8 columns of 16-bit values).
  constexpr int kChunks = kDT, kRowStep = 128 / kChunks;
  static_assert(kRowStep > 0 && 64 % kRowStep == 0, "whole rows per pass");
  const int t128 = warp * 32 + lane;
  const int c = t128 % kChunks;
  int pr = g0 + t128 / kChunks;
  PackedRow row(pr, gdiv);
  const int step_tok = gdiv.div(kRowStep), step_head = gdiv.mod(kRowStep);
#pragma unroll
  for (int j = 0; j < 64 / kRowStep; ++j) {
    if (pr < w.rows) {
      const int r = pr - g0;
      uint4 v;
      ld_shared16(stage + (c / 8) * kAtomStride + sw128_offset(r, c % 8), v);
      T* op = static_cast<T*>(a.out) + (w.q_begin + row.tok) * a.o_stride_n +
              (hkv * G + row.head) * a.o_stride_h + c * 8;
      *reinterpret_cast<uint4*>(op) = v;
    }
    pr += kRowStep;
    row.step(step_tok, step_head, G);
  }
  return false;
}

/// K and V of the paged cache as 4-D TMA tensors (prefill_sm90.cu encodes them per launch):
/// dims (d, kv head, token in page, page), box {64 elements, 1, `rows` tokens, 1}, 128-byte
/// swizzle: one box is `rows` keys x one 128-byte atom column, laid out as the cp.async path
/// lays it. rows = 0: no TMA (every tile by cp.async).
/// The output as a 3-D TMA tensor (o; o_ok false: none): dims (d < DV, q head, token), box {64
/// elements, G heads, 64 / G tokens} under the 128-byte swizzle, i.e. one consumer
/// warpgroup's 64 packed rows x one atom column, laid out as store_tile_staged stages them.
struct Sm90KvMaps {
  CUtensorMap k, v, o;
  int rows = 0;
  bool o_ok = false;
};

/// Whether every output row (token, head) starts on a 16-byte boundary: the staged epilogue's
/// 16-byte row stores and its TMA stores need it (the launcher encodes the output map only then;
/// the kernel takes store_tile otherwise).
__host__ __device__ __forceinline__ bool out_rows_aligned16(const AttentionArgs& a) {
  return (reinterpret_cast<uintptr_t>(a.out) % 16) == 0 && a.o_stride_n % 8 == 0 &&
         a.o_stride_h % 8 == 0;
}

/// KV: T, or E4M3 (fp8 K/V widened by the producer; D 128 under the overlap schedule).
template <typename T, int DQK, int DV, bool kPingPongAsked, bool kOverlapAsked, typename KV = T>
__global__ void __launch_bounds__(PrefillSm90Config<T, DQK, DV>::kThreads, 1)
    prefill_sm90_kernel(AttentionArgs a, LogitTransform xf, const Sm90Sched sched,
                        const __grid_constant__ Sm90KvMaps maps) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  pdl_wait();  // reads the K/V the previous kernel stored (pdl.cuh)
  pdl_launch_dependents();
  using Cfg = PrefillSm90Config<T, DQK, DV>;
  // Ping-pong takes turns between exactly two consumers.
  constexpr bool kPingPong = kPingPongAsked && Cfg::kConsumers == 2;
  constexpr bool kOverlap = kOverlapAsked && Cfg::kCanOverlap;
  // fp8 e4m3 K/V (kFp8): the producer copies a tile's raw rows into its stage and widens them
  // there to T (fp8_widen_rows below); the consumers read T tiles as for 16-bit KV. D 128 under
  // the overlap schedule only (cp.async copies: no TMA boxes of raw rows).
  constexpr bool kFp8 = !std::is_same_v<KV, T>;
  static_assert(!kFp8 || (std::is_same_v<KV, E4M3> && DQK == 128 && DV == 128 && kOverlap),
                "fp8 KV: e4m3, D 128, the overlap schedule");
  // Under kOverlap K and V have rings of their own (full_k / empty_k, full_v / empty_v; the
  // consumers free K after the S GEMM and V after the next turn's P V GEMM) with their own
  // depths (PrefillSm90Config::kXKStages, kXVStages), the pipeline runs across units, and the
  // producer loads Q into two buffers. Elsewhere the V barriers are unused and a stage is one
  // K+V unit (split barriers in the tile-by-tile schedules measured 13-19 % slower at D 256 and
  // DQK 192 on the H200, 2026-12-04 eighth session, cause not found).
  constexpr int kCT = Cfg::kConsumerThreads;
  constexpr int kKeys = Cfg::kKeys;
  constexpr int kStages = Cfg::kStages;
  constexpr int kKStages = kOverlap ? Cfg::kXKStages : kStages;
  constexpr int kVStages = kOverlap ? Cfg::kXVStages : kStages;
  // Ring strides: K and V interleaved per stage, or (kOverlap) each ring contiguous.
  constexpr uint32_t kKStride = kOverlap ? Cfg::kKTileBytes : Cfg::kStageBytes;
  constexpr uint32_t kVStride = kOverlap ? Cfg::kVTileBytes : Cfg::kStageBytes;
  constexpr int kNT = kKeys / 8;  // score n-tiles of 8 columns
  constexpr int kDT = DV / 8;     // output n-tiles

  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t pad = ((raw_addr + 1023u) & ~1023u) - raw_addr;
  unsigned char* smem = smem_raw + pad;
  const uint32_t q_addr = raw_addr + pad;  // Q buffer b (kOverlap: b < 2) at + b * kQBytes
  // K of stage s at k_addr + s * kKStride, V at v_addr + s * kVStride.
  const uint32_t k_addr = q_addr + (kOverlap ? 2 : 1) * Cfg::kQBytes;
  const uint32_t v_addr =
      kOverlap ? k_addr + kKStages * Cfg::kKTileBytes : k_addr + Cfg::kKTileBytes;
  // Stage barriers: full_k / empty_k cover K and V of a stage, or only K under kOverlap, where
  // full_v / empty_v cover V.
  uint64_t* full_k = reinterpret_cast<uint64_t*>(smem + Cfg::kDataBytes);
  uint64_t* full_v = full_k + kStages;
  uint64_t* empty_k = full_v + kStages;
  uint64_t* empty_v = empty_k + kStages;
  uint64_t* rec_full = empty_v + kStages;  // [2]: the producer wrote the slot (1 arrival)
  uint64_t* rec_empty = rec_full + 2;      // [2]: every consumer thread read it (kCT arrivals)
  Sm90UnitRec* recs = reinterpret_cast<Sm90UnitRec*>(rec_empty + 2);
  // [2] (kOverlap): Q buffer b is free again (every consumer thread stored its unit's O through
  // it: one arrival per thread, as rec_empty, so each thread's own reads of the staged rows are
  // released by its own arrival).
  // After the records (its 16 bytes are the last of kBarBytes).
  uint64_t* q_empty =
      reinterpret_cast<uint64_t*>(reinterpret_cast<unsigned char*>(recs) + Cfg::kRecBytes);

  const DevicePlan& plan = a.plan;
  const FastDiv& gdiv = sched.g;
  const int G = gdiv.d;

  const int tid = threadIdx.x;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // warp-uniform to the compiler
  const int t128 = tid % 128;
  if (tid == 0) {
    mbar_init_ring(rec_full, rec_empty, 2, 1, kCT);
    // One arrival per warp: the four producer warps, every consumer warp (publish_tile,
    // arrive_empty).
    mbar_init_ring(full_k, empty_k, kStages, 4, kCT / 32);
    mbar_init_ring(full_v, empty_v, kStages, 4, kCT / 32);
    if constexpr (kOverlap) {
      mbar_init(&q_empty[0], kCT);
      mbar_init(&q_empty[1], kCT);
      mbar_init_fence();
    }
  }
  __syncthreads();

  // Q rows [row0, row0 + 16 nj) of a unit's tile (row0 tile-local) into the Q buffer at q_buf,
  // by cp.async without a commit (the caller commits, waits, fences and syncs before an S GEMM
  // reads them): the consumers load their 64 rows each (nj = 4), or under kOverlap the producer
  // the tile's 128 (nj = 8). Thread t128 copies 16-byte chunk t128 % 8 of every 128-byte atom
  // column of the rows row0 + t128 / 8 + 16 j (j < nj); the row's token and head step by 16
  // packed rows without a division.
  const int q_c8 = t128 % 8, q_rs = t128 / 8;
  const int g16_tok = gdiv.div(16), g16_head = gdiv.mod(16);
  auto load_q = [&](const PrefillWork& w, int q_hkv, uint32_t q_buf, int row0, int nj) {
    int pr = w.r0 + row0 + q_rs;
    PackedRow row(pr, gdiv);
    const T* q0 = static_cast<const T*>(a.q) + q_c8 * 8;
#pragma unroll
    for (int j = 0; j < nj; ++j) {
      const bool ok = pr < w.rows;
      const T* src = ok ? q0 + int64_t(w.q_begin + row.tok) * a.q_stride_n +
                              int64_t(q_hkv * G + row.head) * a.q_stride_h
                        : q0;
      const uint32_t dst = q_buf + sw128_offset(row0 + q_rs + 16 * j, q_c8);
#pragma unroll
      for (int at = 0; at < DQK / 64; ++at) {
        asm volatile(
            "cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst + at * (Cfg::kRows * 128)),
            "l"(src + (ok ? at * 64 : 0)), "r"(ok ? 16 : 0));
      }
      pr += 16;
      row.step(g16_tok, g16_head, G);
    }
  };

  if (wg == 0) {
    // ================= producer =================
    reg_dealloc<Cfg::kProducerRegs>();
    const int ps = a.page_size;
    const FastDiv& pdiv = sched.page;  // ps, for the page lookups
    // Each warp copies a quarter of the tile's rows, kGroups groups of 4; lane j < kWarpRows looks
    // up the page of its warp's row j (group j / 4, row j % 4 of it). A copy instruction covers
    // one group x one 128-byte atom column (8 lanes per row, lane % 8 = the 16-byte chunk): per
    // group the row offsets are shuffled once and reused for every atom column of K (DQK / 64)
    // and of V (DV / 64). Group g of warp pw is the rows [4 (g W + pw), +4) with W = 4 at D = 64
    // (the four warps side by side), and [pw kWarpRows + 4 g, +4) otherwise (a contiguous
    // quarter per warp): on the H200 (bench/results/hopper_h200.md, 2026-12-02) each was the
    // faster of the two at its head dims (contiguous: D 64 9 % slower; D 256 7 % faster).
    constexpr int kWarpRows = kKeys / 4;    // 32 (16 at D = 256)
    constexpr int kGroups = kWarpRows / 4;  // 4-row groups per warp and tile
    constexpr bool kSideBySide = DQK == 64;
    const int lane = t128 % 32, pw = t128 / 32;
    const int c8 = lane % 8, sub = lane / 8;
    auto group_row0 = [&](int g) {
      return kSideBySide ? 4 * (g * 4 + pw) : pw * kWarpRows + 4 * g;
    };
    // Shared-memory offset of this lane's chunk in group g: the swizzle depends on the row mod 8,
    // which is the same for every group side by side and alternates with g % 2 for contiguous
    // rows, so two offsets (and a constant per group) cover every group.
    const uint32_t so_base[2] = {sw128_offset(group_row0(0) + sub, c8),
                                 sw128_offset(group_row0(1) + sub, c8)};
    auto group_so = [&](int g) -> uint32_t {
      const int base = kSideBySide ? 0 : (g & 1);
      return so_base[base] + uint32_t(group_row0(g) - group_row0(base)) * 128u;
    };
    const int my_row = group_row0(lane / 4) + lane % 4;
    const bool looks_up = lane < kWarpRows;
    // kFp8: a tile's raw e4m3 rows (128 bytes at D 128) are copied into the second 64-column atom
    // of their stage (kRawOff on), in the places of the T chunks of the same numbers, and
    // widened there (fp8_widen_rows). Raw chunk c8 of a row (dims 16 c8 .. + 15) becomes T chunks
    // 2 (c8 % 4) and + 1 of atom c8 / 4: their swizzled places differ by XOR 16. This lane writes
    // at w_base[g % 2] plus the same row step as group_so.
    constexpr uint32_t kRawOff = uint32_t(kKeys) * 128u;
    // This warp's rows of the tile in the stage at t0 and, with `two`, of the one at t1 (K or V:
    // one layout at D 128), from raw to T, after the warp's copies of them have landed
    // (cp_async_wait): the lane that copied a raw chunk widens it (widen16: exact for every
    // e4m3 code). A chunk written to atom 1 lands on raw chunks of the same row that other lanes
    // of this warp read, so each 4-row group is read, the warp syncs, then it is written; other
    // groups' rows are untouched, and no other warp's rows are involved. The caller's
    // fence_proxy_async then orders the writes before the consumers' wgmmas.
    const uint32_t w_base[2] = {
        uint32_t(c8 >> 2) * kRawOff + sw128_offset(group_row0(0) + sub, 2 * (c8 & 3)),
        uint32_t(c8 >> 2) * kRawOff + sw128_offset(group_row0(1) + sub, 2 * (c8 & 3))};
    auto fp8_widen_rows = [&](uint32_t t0, bool two, uint32_t t1) {
      auto put = [&](uint32_t addr, const uint4& x) {
        uint4 lo, hi;
        widen16<T>(x, lo, hi);
        st_shared16(addr, lo);
        st_shared16(addr ^ 16u, hi);
      };
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        const uint32_t step = uint32_t(group_row0(g) - group_row0(g & 1)) * 128u;
        const uint32_t rd = kRawOff + group_so(g), wr = w_base[g & 1] + step;
        uint4 x0, x1;
        ld_shared16(t0 + rd, x0);
        if (two) ld_shared16(t1 + rd, x1);
        __syncwarp();
        put(t0 + wr, x0);
        if (two) put(t1 + wr, x1);
      }
    };
    int it = 0;  // tiles issued by this block over all its units: the ring position
    int ku = 0;  // units of this block so far: the record ring position
    int qk = 0;  // (kOverlap) units with tiles so far: the Q buffer ring position
    // Thread 0 publishes unit ku's record (item < 0: no more units) in slot ku % 2, once the
    // consumers have read the record two units back.
    auto publish = [&](const PrefillWork& w, int rec_item, int rec_hkv, int nfree) {
      if (!Cfg::kRecords || t128 != 0) return;
      const int slot = ku & 1;
      if (ku >= 2) mbar_wait(&rec_empty[slot], ((ku >> 1) - 1) & 1);
      Sm90UnitRec& rec = recs[slot];
      rec.work = w;
      rec.item = rec_item;
      rec.hkv = rec_hkv;
      rec.nfree = nfree;
      mbar_arrive(&rec_full[slot]);  // release: the consumers' wait acquires the record
    };
    int item = 0, hkv = 0;
    for (int r = 0; sm90_next_unit(a, sched, r, item, hkv); ++r, ++ku) {
      const PrefillWork work = prefill_work(a, item, Cfg::kRows, kKeys, gdiv);
      const int lo = work.lo, hi = work.hi, ntiles = work.ntiles;
      publish(work, item, hkv, mask_free_tiles(plan, work.mask, work.b, lo, hi, kKeys));
      const int32_t* pages = plan.kv_indices + plan.kv_indptr[work.b];
      // TMA tiles: the unit's keys start on a box boundary and the tile's keys all exist (a
      // box copies whole rows of the page; past kv_len they may hold anything, and V rows must
      // be finite where P is 0). Only the last tile can end past kv_len: it goes by cp.async,
      // with zero fill. So a unit is a run of TMA tiles, then cp.async tiles, each its own loop
      // (one merged loop spilled the producer's 56 registers).
      int i = 0;
      const int box = maps.rows;
      if (!kOverlap && box > 0 && lo % box == 0) {
        const int ntma = min(ntiles, (work.mask.kv_len - lo) / kKeys);
        // Lane j < kKeys / box of warp 0 looks up the page of box j (the next tile's lookup is
        // in flight while this one is issued).
        auto box_page = [&](int tile) -> int {
          const int kj = lo + tile * kKeys + lane * box;
          return pw == 0 && tile < ntma && lane * box < kKeys ? __ldg(pages + pdiv.div(kj)) : 0;
        };
        // Lane 0 of warp 0 arrives on `full` with the stage's byte count and issues one box per
        // page (or per tile when the page is larger) and atom column of K and V; lane 0 of each
        // other producer warp arrives at once (full counts one arrival per producer warp).
        // Boxes of whole pages start at token 0; a box smaller than the page (one per tile) at
        // the tile's offset in it. (The overlap schedule copies by cp.async only.)
        int page_next = box_page(0);
        for (; i < ntma; ++i, ++it) {
          const int s = it % kStages;
          const int page = page_next;
          page_next = box_page(i + 1);
          if (it >= kStages) mbar_wait(&empty_k[s], ((it / kStages) - 1) & 1);
          if (pw == 0) {
            const uint32_t kdst = k_addr + s * kKStride;
            if (lane == 0) mbar_arrive_expect_tx(&full_k[s], Cfg::kStageBytes);
            const int t = box < ps ? pdiv.mod(lo + i * kKeys) : 0;
            for (int j = 0; j * box < kKeys; ++j) {
              const int pg = __shfl_sync(0xffffffffu, page, j);
              if (lane == 0) {
                const uint32_t dst = kdst + uint32_t(j * box) * 128u;
#pragma unroll
                for (int at = 0; at < DQK / 64; ++at) {
                  tma_load_4d(dst + at * (kKeys * 128), &maps.k, at * 64, hkv, t, pg, &full_k[s]);
                }
#pragma unroll
                for (int at = 0; at < DV / 64; ++at) {
                  tma_load_4d(dst + Cfg::kKTileBytes + at * (kKeys * 128), &maps.v, at * 64, hkv, t,
                              pg, &full_k[s]);
                }
              }
            }
          } else if (lane == 0) {
            mbar_arrive(&full_k[s]);
          }
        }
      }
      if (i == ntiles) continue;
      const int i0 = i;
      // The kv head's K and V; a lookup lane offsets them to its row, a copying lane to its
      // 16-byte chunk of the row.
      const KV* kg = static_cast<const KV*>(a.k.data) + hkv * a.k.head_stride;
      const KV* vg = static_cast<const KV*>(a.v.data) + hkv * a.v.head_stride;
      auto lookup = [&](int tile) -> int {
        const int kj = lo + tile * kKeys + my_row;
        return looks_up && tile < ntiles && kj < hi ? __ldg(pages + pdiv.div(kj)) : -1;
      };
      int page_next = lookup(i);
      // This warp's rows of one K or V tile into shared memory at dst, then a commit: per 4-row
      // group g the lookup lane's row address `row` (the tensor's base when the row is past the
      // keys: its page < 0, and the chunks are zero-filled without a read) goes to the copying
      // lanes, each of which adds its 16-byte chunk; every atom column is an immediate offset.
      auto copy_group = [&](uint32_t dst, const KV* row, bool ok, int atoms) {
        const KV* src = row + c8 * (16 / int(sizeof(KV)));
#pragma unroll
        for (int at = 0; at < atoms; ++at) {
          asm volatile(
              "{\n.reg .pred p;\nsetp.eq.u32 p, %2, 0;\n"
              "cp.async.cg.shared.global [%0], [%1], 16, p;\n}\n" ::"r"(dst + at * (kKeys * 128)),
              "l"(src + at * 64), "r"(int(ok)));
        }
      };
      auto copy_tile = [&](uint32_t dst, const KV* row, int page, int atoms) {
        const auto row_bits = static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(row));
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
          const int src_lane = g * 4 + sub;
          copy_group(dst + group_so(g),
                     reinterpret_cast<const KV*>(__shfl_sync(0xffffffffu, row_bits, src_lane)),
                     __shfl_sync(0xffffffffu, page, src_lane) >= 0, atoms);
        }
        cp_async_commit();
      };
      // Per tile (one K+V stage, outside kOverlap): K's copies, then the previous tile
      // published (its copies have landed once only this tile's K group is younger), then V's.
      auto publish_tile = [&](int t) {
        fence_proxy_async();
        __syncwarp();  // the warp's copies are ordered before lane 0's arrive (release)
        if (lane == 0) mbar_arrive(&full_k[t % kStages]);
      };
      if constexpr (kOverlap) {
        // Q of the unit into buffer qk % 2 once the consumers' S GEMMs of the unit two back
        // with tiles have landed; it joins the first K tile's group and is published with it
        // (a consumer waits for that tile's `full` before its first S GEMM).
        if (qk >= 2) mbar_wait(&q_empty[qk & 1], ((qk >> 1) - 1) & 1);
        load_q(work, hkv, q_addr + (qk & 1) * Cfg::kQBytes, 0, 8);
        ++qk;
        // Per tile: K (once the S GEMMs of the tile kKStages back landed), then V (once the
        // P V GEMMs of the tile kVStages back landed), then, once only V's group is younger,
        // this K and the previous tile's V are published. The unit's last V is published
        // before the next unit's lookups start.
        for (; i < ntiles; ++i, ++it) {
          const int page = page_next;
          const int64_t o = pdiv.mod(lo + i * kKeys + my_row);
          const KV* krow = page < 0 ? kg : kg + (page * a.k.page_stride + o * a.k.token_stride);
          const KV* vrow = page < 0 ? vg : vg + (page * a.v.page_stride + o * a.v.token_stride);
          page_next = lookup(i + 1);  // in flight while this tile is issued
          const int sk = it % kKStages, sv = it % kVStages;
          if (it >= kKStages) mbar_wait(&empty_k[sk], ((it / kKStages) - 1) & 1);
          copy_tile(k_addr + sk * kKStride + (kFp8 ? kRawOff : 0u), krow, page,
                    kFp8 ? 1 : DQK / 64);
          if (it >= kVStages) mbar_wait(&empty_v[sv], ((it / kVStages) - 1) & 1);
          copy_tile(v_addr + sv * kVStride + (kFp8 ? kRawOff : 0u), vrow, page, kFp8 ? 1 : DV / 64);
          cp_async_wait<1>();
          if constexpr (kFp8) {  // this K, and the previous tile's V of this unit
            fp8_widen_rows(k_addr + sk * kKStride, i > 0,
                           v_addr + ((it + kVStages - 1) % kVStages) * kVStride);
          }
          fence_proxy_async();
          __syncwarp();  // the warp's copies are ordered before lane 0's arrive (release)
          if (lane == 0) {
            mbar_arrive(&full_k[sk]);
            if (i > 0) mbar_arrive(&full_v[(it - 1) % kVStages]);
          }
        }
        cp_async_wait<0>();
        if constexpr (kFp8) {  // the unit's last V
          const uint32_t vb = v_addr + ((it - 1) % kVStages) * kVStride;
          fp8_widen_rows(vb, false, vb);
        }
        fence_proxy_async();
        __syncwarp();
        if (lane == 0) mbar_arrive(&full_v[(it - 1) % kVStages]);
      } else {
        for (; i < ntiles; ++i, ++it) {
          const int s = it % kStages, ph = ((it / kStages) - 1) & 1;
          const int page = page_next;
          const int64_t o = pdiv.mod(lo + i * kKeys + my_row);
          const KV* krow = page < 0 ? kg : kg + (page * a.k.page_stride + o * a.k.token_stride);
          const KV* vrow = page < 0 ? vg : vg + (page * a.v.page_stride + o * a.v.token_stride);
          page_next = lookup(i + 1);  // in flight while this tile is issued
          const uint32_t kdst = k_addr + s * kKStride;
          const uint32_t vdst = v_addr + s * kVStride;
          if (it >= kStages) mbar_wait(&empty_k[s], ph);
          copy_tile(kdst, krow, page, DQK / 64);
          if (i > i0) {  // the previous tile's K and V groups have landed: publish it
            cp_async_wait<1>();
            publish_tile(it - 1);
          }
          copy_tile(vdst, vrow, page, DV / 64);
        }
        // The unit's last tile is published before the next unit's lookups start, so the
        // consumers never wait on the producer's prologue of a unit.
        cp_async_wait<0>();
        publish_tile(it - 1);
      }
    }
    publish(PrefillWork{}, -1, 0, 0);
    return;
  }

  // ================= consumers =================
  reg_alloc<Cfg::kConsumerRegs>();
  const int cw = wg - 1;  // consumer index: rows [64 cw, 64 cw + 64) of the tile
  const int warp = t128 / 32, lane = tid % 32;
  // A stage is given back by lane 0 of each consumer warp once the warp's wgmma wait has
  // returned (the wgmmas that read it have completed: they are warpgroup-wide). Arrivals are
  // shared-memory atomics; one per thread made them 32 times as many.
  auto arrive_empty = [&](uint64_t* bar) {
    if (lane == 0) mbar_arrive(bar);
  };

  // Ping-pong (kPingPong): the two consumers take turns issuing their GEMMs (S, then P V, tile
  // by tile), so one warpgroup's softmax runs while the other's GEMMs occupy the tensor cores.
  // Consumer c waits on named barrier 1 + c before issuing and arrives on the other one after;
  // consumer 1 opens the first turn, and consumer 0 takes consumer 1's last arrive after the
  // loop (an unconditional arrive keeps the issue-to-wait path free of divergent code, which
  // would make ptxas serialise the wgmmas). Both consumers run the same tiles of the same
  // units, so the turns line up across units.
  auto turn_begin = [&]() {
    if constexpr (kPingPong) named_bar_sync(1 + cw, 256);
  };
  auto turn_end = [&]() {
    if constexpr (kPingPong) named_bar_arrive(2 - cw, 256);
  };
  if constexpr (kPingPong) {
    if (cw == 1) named_bar_arrive(1, 256);
  }

  // Operand descriptors: this warpgroup's Q rows (of buffer 0), and K / V of stage 0
  // (desc_advance moves them to a buffer, a stage and a k-step).
  const uint64_t q_desc0 = sw128_desc(q_addr + cw * 64 * 128, 16, 1024);
  const uint64_t k_desc0 = sw128_desc(k_addr, 16, 1024);
  const uint64_t v_desc0 = sw128_desc(v_addr, kKeys * 128, 1024);

  // This warpgroup's Q rows of a unit (outside kOverlap, where the producer loads Q).
  auto load_q_own = [&](const PrefillWork& w, int q_hkv) {
    load_q(w, q_hkv, q_addr, cw * 64, 4);
    cp_async_commit();
  };
  // Without records (kRecords false) a warpgroup walks the schedule itself: Q of unit (item,
  // kv head) with the plan's rows of it.
  auto load_q_plan = [&](int q_item, int q_hkv) {
    const int qb = plan.item_req[q_item];
    PrefillWork w;
    w.q_begin = plan.qo_indptr[qb];
    w.rows = (plan.qo_indptr[qb + 1] - w.q_begin) * G;
    w.r0 = plan.item_a[q_item] * Cfg::kRows;
    load_q_own(w, q_hkv);
  };

  int it = 0;  // tiles consumed over all units (the producer's ring position)
  // With records (Sm90UnitRec) the producer says which unit comes next and what it covers, so
  // the consumers' unit switch reads shared memory instead of the plan's dependent global loads.
  auto rec_wait = [&](int k) { mbar_wait(&rec_full[k & 1], (k >> 1) & 1); };
  int sched_r = 0, sched_item = 0, sched_hkv = 0;  // the schedule walk without records
  bool sched_live = false;
  if constexpr (Cfg::kRecords) {
    rec_wait(0);
    if (recs[0].item >= 0) load_q_own(recs[0].work, recs[0].hkv);
  } else {
    sched_live = sm90_next_unit(a, sched, sched_r, sched_item, sched_hkv);
    if (!kOverlap && sched_live) load_q_plan(sched_item, sched_hkv);
  }

  // The running softmax state and O of this warpgroup's rows of the current unit.
  float m[2], l[2];
  float o[kDT][4];
  float(&o_flat)[kDT * 4] = reinterpret_cast<float(&)[kDT * 4]>(o);
  auto reset_state = [&]() {
    m[0] = m[1] = neg_inf();
    l[0] = l[1] = 0.f;
#pragma unroll
    for (int d = 0; d < kDT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
  };
  reset_state();
  // The score tile sc is declared per tile (a wgmma's accumulators are read-write operands: one
  // declared outside the loop would stay live from tile to tile); so are the P fragments, except
  // where the overlap carries them (pa) to the next turn.
  using ScoreTile = float[kNT][4];
  using PFrags = uint32_t[kKeys / 16][4];
  // O += P V of the tile in V stage s (P from registers, V MN-major from shared memory).
  auto issue_pv = [&](PFrags& pf, int s) {
    const uint64_t v_desc = desc_advance(v_desc0, s * kVStride);
#pragma unroll
    for (int k2 = 0; k2 < kKeys / 16; ++k2) {
      wgmma_rs<T, DV>(o_flat, pf[k2], desc_advance(v_desc, k2 * 16 * 128));
    }
  };
  // O += P V alone in a turn, waited for.
  auto pv_gemm_alone = [&](PFrags& pf, int s) {
    fence_operands(o_flat);
    wgmma_fence();
    issue_pv(pf, s);
    wgmma_commit();
    turn_end();
    wgmma_wait<0>();
    fence_operands(o_flat);
  };

  // Cross-unit pipelining (kOverlap): the last P V GEMM of a unit runs in the next unit's first
  // turn, beside its first S GEMM, and the unit's epilogue (ew, e_hkv, em, el: pend)
  // follows that GEMM's wait. pa holds P of the previous tile (act_prev: it has work for this
  // warpgroup); v_held: this warpgroup has not given back V of tile it - 1 yet.
  PFrags pa;
  uint32_t(&pa_flat)[kKeys / 4] = reinterpret_cast<uint32_t(&)[kKeys / 4]>(pa);
  bool act_prev = false, pend = false, v_held = false;
  PrefillWork ew;
  int e_hkv = 0, qk = 0;  // qk: units with tiles so far (the Q buffer ring)
  float em[2] = {neg_inf(), neg_inf()}, el[2] = {0.f, 0.f};
  // kOverlap: the pending unit's O goes out through its own Q buffer (its S GEMMs have all
  // landed), which the producer may refill only after that (q_empty arrives here, not after the
  // unit's last S GEMM); split-KV partials and unaligned outputs take store_tile.
  const bool o_aligned = out_rows_aligned16(a);
  // q_rel: 1 + the Q buffer whose staged rows are still being read by TMA stores (0: none);
  // release_q waits for those reads and frees it, a turn later than the epilogue that issued
  // them (the wait there held warp 0, and with it the warpgroup's next GEMM).
  int q_rel = 0;
  // Hands Q buffer `slot` back to the producer: every thread arrives after its own reads of the
  // staged rows (racecheck saw the producer's next Q load race the unaligned rows' ld.shared
  // when lane 0 arrived for its warp, with or without a __syncwarp before it; bd46912).
  auto free_q = [&](int slot) { mbar_arrive(&q_empty[slot]); };
  auto release_q = [&]() {
    if (q_rel == 0) return;
    if (warp == 0 && lane == 0) tma_store_wait_read();
    free_q(q_rel - 1);
    q_rel = 0;
  };
  auto epilogue = [&](const float(&mm)[2], const float(&ll)[2]) {
    const int slot = (qk - 1) & 1;  // qk already counts the pending unit
    bool tma = false;
    if (kOverlap && ew.partial < 0 && o_aligned) {
      tma = store_tile_staged<T, kDT, Cfg::kRows * 128>(
          a, ew, e_hkv, ew.r0 + cw * 64, warp, lane, mm, ll, o,
          q_addr + slot * Cfg::kQBytes + cw * 64 * 128, 3 + cw, maps.o_ok ? &maps.o : nullptr,
          gdiv);
      fence_proxy_async();  // the staging's accesses, before the producer refills the buffer
    } else {
      store_tile<T>(a, ew, e_hkv, ew.r0 + cw * 64 + warp * 16, mm, ll, o, lane, gdiv);
    }
    if constexpr (kOverlap) {
      if (tma) {
        q_rel = slot + 1;
      } else {
        free_q(slot);
      }
    }
#pragma unroll
    for (int d = 0; d < kDT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
    pend = false;
  };
  // The pending P V GEMM alone in a turn of its own (both consumers take it: ping-pong turns
  // stay paired), V given back, and the pending epilogue: after the last unit and before a
  // unit without tiles.
  auto drain = [&]() {
    const int tp = max(it - 1, 0), sp = tp % kVStages;
    if (act_prev) mbar_wait(&full_v[sp], (tp / kVStages) & 1);
    turn_begin();
    if (act_prev) {
      fence_operands(pa_flat);
      pv_gemm_alone(pa, sp);
    } else {
      turn_end();
    }
    if (v_held) arrive_empty(&empty_v[sp]);
    v_held = act_prev = false;
    if (pend) epilogue(m, l);
    release_q();
    if (warp == 0 && lane == 0) tma_store_wait_all();  // the stores done before the block exits
  };

  for (int ku = 0;; ++ku) {
    PrefillWork work;
    int hkv = 0, nfree = 0;
    if constexpr (Cfg::kRecords) {
      const Sm90UnitRec& rec = recs[ku & 1];
      if (rec.item < 0) break;
      work = rec.work;
      hkv = rec.hkv;
      nfree = rec.nfree;
      mbar_arrive(&rec_empty[ku & 1]);
    } else {
      if (!sched_live) break;
      work = prefill_work(a, sched_item, Cfg::kRows, kKeys, gdiv);
      hkv = sched_hkv;
      nfree = mask_free_tiles(plan, work.mask, work.b, work.lo, work.hi, kKeys);
    }
    const int rows = work.rows, lo = work.lo, hi = work.hi, ntiles = work.ntiles;
    const int qoff = work.qoff;
    const MaskInfo& mask = work.mask;
    const int g0 = work.r0 + cw * 64;  // first packed row of this warpgroup
    const int wr0 = g0 + warp * 16;    // first packed row of this warp
    if constexpr (kOverlap) {
      if (ntiles == 0) {
        // No keys: its rows store l = 0 at once; the pipeline (a pending P V GEMM and
        // epilogue, the rings) goes on to the next unit with tiles.
        float zo[kDT][4] = {}, zm[2] = {neg_inf(), neg_inf()}, zl[2] = {0.f, 0.f};
        store_tile<T>(a, work, hkv, wr0, zm, zl, zo, lane, gdiv);
        ++sched_r;
        sched_live = sm90_next_unit(a, sched, sched_r, sched_item, sched_hkv);
        continue;
      }
      em[0] = m[0];  // the previous unit's state, for its epilogue in this unit's first turn
      em[1] = m[1];
      el[0] = l[0];
      el[1] = l[1];
      m[0] = m[1] = neg_inf();
      l[0] = l[1] = 0.f;
    } else {
      cp_async_wait<0>();  // this unit's Q
      fence_proxy_async();
      named_bar_sync(3 + cw, 128);
      reset_state();
    }
    const uint32_t q_off = kOverlap ? (qk & 1) * Cfg::kQBytes : 0u;  // this unit's Q buffer

    // Keys this warpgroup can see at all.
    const bool wg_rows = g0 < rows;
    const int gt_first = gdiv.div(g0);
    const int gt_last = div_by(min(g0 + 64, rows) - 1, gdiv);
    int ghi = hi, glo = lo;
    if (mask.bits == nullptr && mask.causal) ghi = min(hi, qoff + gt_last + 1);
    if (mask.window >= 0 && mask.bits == nullptr) glo = max(lo, qoff + gt_first - mask.window);
    // This warp's rows (for the per-warp full-tile test).
    const int wt_first = gdiv.div(wr0);
    const int wt_last = gdiv.div(max(min(wr0 + 16, rows), wr0 + 1) - 1);
    const bool capped = xf.cap > 0.f;
    const float scale = capped ? 1.f : xf.scale_log2;

    // Whether this warpgroup's rows see any key of tile i (else both its GEMMs are skipped).
    auto tile_active = [&](int i) {
      const int kb0 = lo + i * kKeys;
      return wg_rows && kb0 < ghi && kb0 + kKeys > glo;
    };
    // S = Q K^T of the tile in stage s into sc (wgmma m64nKk16, both operands in shared memory).
    auto issue_s = [&](ScoreTile& sc, int s) {
      float(&sc_flat)[kNT * 4] = reinterpret_cast<float(&)[kNT * 4]>(sc);
      const uint64_t k_desc = desc_advance(k_desc0, s * kKStride);
      // The buffer offset is re-read per S GEMM (an opaque move): hoisted out of the tile loop,
      // the eight per-k-step Q descriptors of the unit took registers and the consumers spilled
      // ~170 bytes (ptxas).
      uint32_t qo = q_off;
      asm volatile("" : "+r"(qo));
      const uint64_t q_desc = desc_advance(q_desc0, qo);
#pragma unroll
      for (int kk = 0; kk < DQK / 16; ++kk) {
        const uint32_t half = kk / 4, sub = (kk % 4) * 32;
        wgmma_ss<T, kKeys>(sc_flat, desc_advance(q_desc, half * (Cfg::kRows * 128) + sub),
                           desc_advance(k_desc, half * (kKeys * 128) + sub), kk > 0 ? 1 : 0);
      }
    };
    // Tile i's landed scores: cap, mask, online softmax. deferred: O belongs to an in-flight
    // wgmma, so the rescale factors go to alpha and the return says whether O needs them.
    auto softmax_scores = [&](ScoreTile& sc, int i, bool deferred, float(&alpha)[2]) -> bool {
      float(&sc_flat)[kNT * 4] = reinterpret_cast<float(&)[kNT * 4]>(sc);
      const int kb0 = lo + i * kKeys;
      MaskInfo mk = mask;
      if (i < nfree) {
        mk.bits = nullptr;
        mk.causal = false;
      }
      // (A custom mask's window starts per row: its mask-free tiles are masked too.)
      const bool full_tile = mk.bits == nullptr && kb0 + kKeys <= hi && wr0 + 16 <= rows &&
                             (!mk.causal || kb0 + kKeys - 1 <= qoff + wt_first) &&
                             (mk.window < 0 ||
                              (mask.bits == nullptr && kb0 >= qoff + wt_last - mk.window));
      if (capped) {
#pragma unroll
        for (int e = 0; e < kNT * 4; ++e) sc_flat[e] = xf(sc_flat[e]);
      }
      if (!full_tile) mask_tile<true>(sc, wr0, gdiv, kb0, hi, rows, mk, lane);
      if (deferred) return softmax_tile_deferred(sc, m, l, scale, alpha);
      softmax_tile(sc, m, l, o, scale);
      return false;
    };
    // S alone in a turn, waited for (pv_gemm_alone: P V alone).
    auto s_gemm_alone = [&](ScoreTile& sc, int s) {
      float(&sc_flat)[kNT * 4] = reinterpret_cast<float(&)[kNT * 4]>(sc);
      wgmma_fence();
      issue_s(sc, s);
      wgmma_commit();
      turn_end();
      wgmma_wait<0>();
      fence_operands(sc_flat);
    };
    // P is the A operand straight from the S accumulators.
    auto scores_to_p = [&](const ScoreTile& sc, PFrags& pa) {
#pragma unroll
      for (int k2 = 0; k2 < kKeys / 16; ++k2) p_fragment<T>(pa[k2], sc, k2);
    };

    if constexpr (kOverlap) {
      // Intra-warpgroup overlap (FA3's order), pipelined across units: turn t (tile t of the
      // block's stream, tile i of this unit) issues S of tile t and then P V of tile t - 1,
      // which may be the previous unit's last; the warpgroup waits for S only, frees K, and
      // runs tile t's softmax while its own P V GEMM (and, with ping-pong, the other consumer's
      // GEMMs) keep the tensor cores busy; then it waits for P V, frees V, applies the
      // softmax's rescale to O (or, in a unit's first turn, stores the previous unit's O and
      // clears it) and converts P. A consumer holds V of tile t - 1 and K of tile t at once.
      // Only the block's last P V GEMM runs alone (drain, after the unit loop).
      // kFirst: the unit's first turn with the previous unit's epilogue due (pend), a copy of
      // its own so that the steady-state turns carry none of that code.
      auto turn = [&]<bool kFirst>(int i) {
        const int t = it + i, s = t % kKStages;
        const int tp = max(t - 1, 0), sp = tp % kVStages;  // the previous tile's V stage
        const bool act = tile_active(i);
        mbar_wait(&full_k[s], (t / kKStages) & 1);
        if (act_prev) mbar_wait(&full_v[sp], (tp / kVStages) & 1);
        float alpha[2] = {1.f, 1.f};
        bool moved = false;
        ScoreTile sc;
        float(&sc_flat)[kNT * 4] = reinterpret_cast<float(&)[kNT * 4]>(sc);
        turn_begin();
        if (act && act_prev) {
          fence_operands(o_flat);
          fence_operands(pa_flat);
          wgmma_fence();
          issue_s(sc, s);
          wgmma_commit();
          wgmma_fence();
          issue_pv(pa, sp);
          wgmma_commit();
          turn_end();
          wgmma_wait<1>();
          fence_operands(sc_flat);
          arrive_empty(&empty_k[s]);
          moved = softmax_scores(sc, i, true, alpha);
          wgmma_wait<0>();
          fence_operands(o_flat);
          fence_operands(pa_flat);
        } else if (act) {
          s_gemm_alone(sc, s);
          arrive_empty(&empty_k[s]);
          softmax_scores(sc, i, kFirst, alpha);
        } else if (act_prev) {
          fence_operands(pa_flat);
          pv_gemm_alone(pa, sp);
          arrive_empty(&empty_k[s]);
        } else {
          turn_end();
          arrive_empty(&empty_k[s]);
        }
        if (v_held) arrive_empty(&empty_v[sp]);
        if constexpr (kFirst) {
          if (act) scores_to_p(sc, pa);
          epilogue(em, el);
        } else {
          if (moved) rescale_rows(o, alpha);
          if (act) scores_to_p(sc, pa);
        }
        act_prev = act;
        v_held = true;
      };
      // ntiles > 0 here (units without tiles took the branch at the top).
      if (pend) {
        turn.template operator()<true>(0);
      } else {
        turn.template operator()<false>(0);
      }
      for (int i = 1; i < ntiles; ++i) {
        turn.template operator()<false>(i);
        if (i == 1) release_q();
      }
      release_q();  // a unit of one tile; before the next unit's first turn waits for its Q
      ++sched_r;
      sched_live = sm90_next_unit(a, sched, sched_r, sched_item, sched_hkv);
      it += ntiles;
      ++qk;
      ew = work;
      e_hkv = hkv;
      pend = true;
      continue;  // this unit's epilogue runs in the next unit's first turn (or drain)
    } else {
      // Tile by tile: a turn for S, the softmax, a turn for P V, then the stage is freed.
      // (Freeing it in two halves, K after the S GEMM, made ptxas spill at D 64 and serialise
      // its wgmmas.)
      for (int i = 0; i < ntiles; ++i, ++it) {
        const int s = it % kStages, ph = (it / kStages) & 1;
        const bool active = tile_active(i);
        ScoreTile sc;
        PFrags pf;
        mbar_wait(&full_k[s], ph);
        turn_begin();
        if (active) {
          s_gemm_alone(sc, s);
        } else {
          turn_end();
        }
        if (active) {
          float alpha[2];
          softmax_scores(sc, i, false, alpha);
          scores_to_p(sc, pf);
        }
        turn_begin();
        if (active) {
          pv_gemm_alone(pf, s);
        } else {
          turn_end();
        }
        arrive_empty(&empty_k[s]);
      }
    }
    // Every S GEMM of the unit has read Q: the next unit's Q loads under the epilogue.
    if constexpr (Cfg::kRecords) {
      rec_wait(ku + 1);
      const Sm90UnitRec& next = recs[(ku + 1) & 1];
      if (next.item >= 0) {
        named_bar_sync(3 + cw, 128);  // every warp is past its last wait: no wgmma reads Q
        load_q_own(next.work, next.hkv);
      }
    } else {
      ++sched_r;
      sched_live = sm90_next_unit(a, sched, sched_r, sched_item, sched_hkv);
      if (!kOverlap && sched_live) {
        named_bar_sync(3 + cw, 128);
        load_q_plan(sched_item, sched_hkv);
      }
    }

    // ---- epilogue ----
    store_tile<T>(a, work, hkv, wr0, m, l, o, lane, gdiv);
  }
  if constexpr (kOverlap) drain();
  if constexpr (kPingPong) {
    if (cw == 0) named_bar_sync(1, 256);
  }
#else
  __trap();  // launched only where the sm_90a image exists (prefill_sm90_supported)
#endif
}

}  // namespace pagoda::kernels::cuda::detail
