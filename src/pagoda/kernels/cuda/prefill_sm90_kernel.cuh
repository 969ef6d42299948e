#pragma once
/// Hopper (sm_90a) paged prefill / extend / verify: wgmma from shared memory, a producer
/// warpgroup gathering paged K/V, two consumer warpgroups.
///
/// Same work decomposition and planner as prefill_kernel (a work item is
/// prefill_rows_per_tile(DQK, true) = 128 packed rows x one kv head, GQA rows packed as
/// r -> (token r / G, head hkv * G + r % G)); at D <= 128 either kernel can run a plan, at D = 256
/// the plan must have been made for this kernel (AttentionArgs::prefill_sm90: 128 rows, not 64).
///
/// Persistent: the grid is at most one block per SM (the launcher's choice) and each block runs
/// a sequence of work units, unit = (work item, kv head); see sm90_unit(). The producer streams
/// the K/V tiles of one unit after another through one ring (it runs up to kStages tiles ahead,
/// across unit boundaries), and each consumer issues the next unit's Q load before it stores the
/// current unit's output, so a unit's prologue and epilogue overlap its neighbours' work. (Issuing
/// that load inside the tile loop, right after the last S GEMM, cost 13 % at B4 S4096 on the
/// H200: ptxas then gave P its own registers and moved the row sums between the P V wgmmas.)
/// A grid of one block per unit (PAGODA_SM90_PERSISTENT=0) is the non-persistent kernel.
///
/// Roles (384 threads, one block per SM):
///  * warpgroup 0, producer: per tile of kKeys keys (128; 64 at D = 256) each warp owns a quarter
///    of the rows and a lane looks up the page of one of them (any page size; the next tile's
///    lookup is in flight while this one is issued); warp shuffles hand the row offsets to the
///    copying lanes (8 per row, 4 rows per instruction, every 128-byte atom column of K and V
///    per shuffle), which gather K and V rows with 16-byte cp.async into a kStages-deep ring of
///    128B-swizzled shared-memory tiles (zero-filled past the request's keys). It then waits for its own copies of the previous tile, fences them into the
///    async proxy and arrives on that stage's `full` mbarrier. Before reusing a stage it waits on
///    the stage's `empty` mbarrier.
///  * warpgroups 1 and 2, consumers, 64 packed rows each: Q staged once (128B-swizzled); per tile
///    S = Q K^T with wgmma m64nKk16 (K = kKeys; both operands in shared memory), masking and online
///    softmax in registers (base 2, lazy rescaling as in prefill_kernel), then O += P V with
///    wgmma m64nDVk16 (P from registers, V MN-major from shared memory), and an arrive on `empty`.
/// Tiles a consumer's 64 rows cannot see (causal, window) skip both GEMMs. With kPingPong
/// (PAGODA_SM90_PINGPONG=1) the two consumers take strict turns issuing their GEMMs through two
/// named barriers, so one's softmax overlaps the other's tensor-core work (FA3's ping-pong).
/// The warpgroup index goes through a lane-0 shuffle so the compiler knows it is warp-uniform:
/// the ring indices and wgmma descriptors then live in uniform registers (built once, moved by
/// desc_advance, sm90_utils.cuh), and issuing a wgmma costs a few uniform adds instead of a
/// dependent mask / shift / move chain (2-10 % faster at D >= 128 on the H200, D 64 unchanged;
/// bench/results/hopper_h200.md, 2026-12-02).
/// Issuing P V of tile i together with S of tile i + 1 in one turn (software pipelining, FA3's
/// order) measured 5 % slower at D 128 in the same call and is not used.
///
/// Shared memory (bytes, 1024-aligned): Q [DQK/64][128 rows][128 B], then per stage K
/// [DQK/64][kKeys][128 B] and V [DV/64][kKeys][128 B], then the mbarriers. D = 256 takes 64-key
/// tiles and 2 stages (Q 64 KB + 2 x 64 KB), so the consumers' registers hold O (128 per thread)
/// beside a 64-key score tile; DQK 192 / DV 128 (the non-absorbed MLA prefill of DeepSeek-style
/// models) takes 128-key tiles and 2 stages (Q 48 KB + 2 x 80 KB).
/// Supports 16-bit Q == KV types, DQK = DV = 64, 128 and 256, and DQK 192 / DV 128; fp8 KV uses
/// prefill_kernel (D = DQK = DV) or the generic kernel.

#include "pagoda/kernels/cuda/device_utils.cuh"
#include "pagoda/kernels/cuda/pdl.cuh"
#include "pagoda/kernels/cuda/prefill_common.cuh"
#include "pagoda/kernels/cuda/sm90_utils.cuh"

namespace pagoda::kernels::cuda::detail {

template <typename T, int DQK, int DV>
struct PrefillSm90Config {
  static constexpr int kThreads = 384;
  static constexpr int kRows = 128;        // packed rows per block (2 consumers x 64)
  // Keys per tile and ring depth: 128 keys x 3 stages at D <= 128, 64 x 2 at D = 256 (O then
  // takes 128 registers per consumer thread), 128 x 2 at DQK 192 / DV 128 (K 48 KB + V 32 KB
  // per stage; registers as at D = 128).
  static constexpr int kKeys = DQK <= 192 ? 128 : 64;
  static constexpr int kStages = DQK <= 128 ? 3 : 2;
  static constexpr uint32_t kQBytes = kRows * DQK * 2;
  static constexpr uint32_t kKTileBytes = kKeys * DQK * 2;            // one K tile
  static constexpr uint32_t kVTileBytes = kKeys * DV * 2;             // one V tile
  static constexpr uint32_t kStageBytes = kKTileBytes + kVTileBytes;  // K, then V
  static constexpr uint32_t kBarBytes = 2 * kStages * 8;
  static constexpr size_t kSmemBytes = 1024 + kQBytes + kStages * kStageBytes + kBarBytes;
  static_assert(kSmemBytes <= 232448, "over the sm_90 shared-memory limit per block");
  // setmaxnreg moves registers inside the block's launch allocation (168 x 384 under
  // __launch_bounds__(384, 1)); asking for more than was freed blocks the consumers forever
  // (seen on the H200 with 80 / 216).
  // D = 256: O alone takes 128 registers per consumer thread; 224 spill a few, 232 do not.
  static constexpr int kProducerRegs = DV <= 128 ? 56 : 40;
  static constexpr int kConsumerRegs = DV <= 128 ? 224 : 232;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 168 * kThreads,
                "register split exceeds the launch allocation");
  static_assert((DQK == DV && (DQK == 64 || DQK == 128 || DQK == 256)) || (DQK == 192 && DV == 128),
                "sm90 prefill supports D = 64, 128, 256 and DQK 192 / DV 128");
  static_assert(kRows == prefill_rows_per_tile(DQK, true),
                "planner and kernel disagree on tile rows");
};

/// Unit orders of the persistent schedule (units u in [0, grid_items * Hkv)).
///  kHeadMajor: u -> (item u % grid_items, head u / grid_items): the blocks running at one time
///    share a kv head (its K/V stay in L2); block k runs u = k, k + G, k + 2G, ... (G = gridDim.x).
///  kItemSnake: u -> (item u / Hkv, head u % Hkv): every head of the heaviest items first; round r
///    gives block k the unit rG + k (r even) or rG + G - 1 - k (r odd), so with the planner's
///    heaviest-first items each block's total stays within about one item of the mean.
enum Sm90Order : int { kHeadMajor = 0, kItemSnake = 1 };

/// Work item and kv head of round r of this block; false past the block's last unit. Items at
/// or past plan.counts[1] (a graph's spare capacity) come back with item >= counts[1].
__device__ __forceinline__ bool sm90_unit(const AttentionArgs& a, int order, int r, int& item,
                                          int& hkv) {
  const int g = gridDim.x, k = blockIdx.x;
  const int units = a.grid_items * a.num_kv_heads;
  const int u = r * g + (order == kItemSnake && (r & 1) ? g - 1 - k : k);
  if (u >= units) return false;
  if (order == kItemSnake) {
    item = u / a.num_kv_heads;
    hkv = u % a.num_kv_heads;
  } else {
    item = u % a.grid_items;
    hkv = u / a.grid_items;
  }
  return true;
}

/// The next live unit at or after round r (r advances to it); false when the block is done.
__device__ __forceinline__ bool sm90_next_unit(const AttentionArgs& a, int order, int& r,
                                               int& item, int& hkv) {
  for (;; ++r) {
    if (!sm90_unit(a, order, r, item, hkv)) return false;
    if (item < a.plan.counts[1]) return true;
  }
}

template <typename T, int DQK, int DV, bool kPingPong>
__global__ void __launch_bounds__(384, 1)
    prefill_sm90_kernel(AttentionArgs a, LogitTransform xf, int order) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  pdl_wait();  // reads the K/V the previous kernel stored (pdl.cuh)
  pdl_launch_dependents();
  using Cfg = PrefillSm90Config<T, DQK, DV>;
  constexpr int kKeys = Cfg::kKeys;
  constexpr int kStages = Cfg::kStages;
  constexpr int kNT = kKeys / 8;     // score n-tiles of 8 columns
  constexpr int kDT = DV / 8;        // output n-tiles
  constexpr int kQChunks = DQK / 8;  // 16-byte chunks per Q / K row

  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t pad = ((raw_addr + 1023u) & ~1023u) - raw_addr;
  unsigned char* smem = smem_raw + pad;
  const uint32_t q_addr = raw_addr + pad;
  const uint32_t kv_addr = q_addr + Cfg::kQBytes;  // stage s: K at + s * stage, V after it
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Cfg::kQBytes + kStages * Cfg::kStageBytes);
  uint64_t* empty = full + kStages;

  const DevicePlan& plan = a.plan;
  const int G = a.num_qo_heads / a.num_kv_heads;

  const int tid = threadIdx.x;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // warp-uniform to the compiler
  const int t128 = tid % 128;
  if (tid == 0) mbar_init_ring(full, empty, kStages, 128, 256);  // producer 128, consumers 256
  __syncthreads();

  if (wg == 0) {
    // ================= producer =================
    reg_dealloc<Cfg::kProducerRegs>();
    const int ps = a.page_size;
    // Each warp copies a quarter of the tile's rows, kGroups groups of 4; lane j < kWarpRows looks
    // up the page of its warp's row j (group j / 4, row j % 4 of it). A copy instruction covers
    // one group x one 128-byte atom column (8 lanes per row, lane % 8 = the 16-byte chunk): per
    // group the row offsets are shuffled once and reused for every atom column of K (DQK / 64)
    // and of V (DV / 64). Group g of warp pw is the rows [4 (g W + pw), +4) with W = 4 at D = 64
    // (the four warps side by side), and [pw kWarpRows + 4 g, +4) otherwise (a contiguous
    // quarter per warp): on the H200 (bench/results/hopper_h200.md, 2026-12-02) each was the
    // faster of the two at its head dims (contiguous: D 64 9 % slower; D 256 7 % faster).
    constexpr int kWarpRows = kKeys / 4;     // 32 (16 at D = 256)
    constexpr int kGroups = kWarpRows / 4;   // 4-row groups per warp and tile
    constexpr bool kSideBySide = DQK == 64;
    const int lane = t128 % 32, pw = t128 / 32;
    const int c8 = lane % 8, sub = lane / 8;
    auto group_row0 = [&](int g) {
      return kSideBySide ? 4 * (g * 4 + pw) : pw * kWarpRows + 4 * g;
    };
    const int my_row = group_row0(lane / 4) + lane % 4;
    const bool looks_up = lane < kWarpRows;
    int it = 0;  // tiles issued by this block over all its units: the ring position
    int item = 0, hkv = 0;
    for (int r = 0; sm90_next_unit(a, order, r, item, hkv); ++r) {
      const PrefillWork work = prefill_work(a, item, Cfg::kRows, kKeys);
      const int lo = work.lo, hi = work.hi, ntiles = work.ntiles;
      const int32_t* pages = plan.kv_indices + plan.kv_indptr[work.b];
      const T* kg = static_cast<const T*>(a.k.data) + hkv * a.k.head_stride + c8 * 8;
      const T* vg = static_cast<const T*>(a.v.data) + hkv * a.v.head_stride + c8 * 8;
      auto lookup = [&](int tile) -> int {
        const int kj = lo + tile * kKeys + my_row;
        return looks_up && tile < ntiles && kj < hi ? __ldg(pages + kj / ps) : -1;
      };
      int page_next = lookup(0);
      for (int i = 0; i < ntiles; ++i, ++it) {
        const int s = it % kStages;
        const int page = page_next;
        const int64_t o = (lo + i * kKeys + my_row) % ps;
        const int64_t kof = page < 0 ? -1 : page * a.k.page_stride + o * a.k.token_stride;
        const int64_t vof = page < 0 ? -1 : page * a.v.page_stride + o * a.v.token_stride;
        page_next = lookup(i + 1);  // in flight while this tile is issued
        if (it >= kStages) mbar_wait(&empty[s], ((it / kStages) - 1) & 1);
        const uint32_t kdst = kv_addr + s * Cfg::kStageBytes;
        const uint32_t vdst = kdst + Cfg::kKTileBytes;
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
          const int src = g * 4 + sub;
          const int64_t kp = __shfl_sync(0xffffffffu, kof, src);
          const int64_t vp = __shfl_sync(0xffffffffu, vof, src);
          const uint32_t so = sw128_offset(group_row0(g) + sub, c8);
#pragma unroll
          for (int at = 0; at < DQK / 64; ++at) {
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                             kdst + at * (kKeys * 128) + so),
                         "l"(kp < 0 ? kg : kg + kp + at * 64), "r"(kp < 0 ? 0 : 16));
          }
#pragma unroll
          for (int at = 0; at < DV / 64; ++at) {
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                             vdst + at * (kKeys * 128) + so),
                         "l"(vp < 0 ? vg : vg + vp + at * 64), "r"(vp < 0 ? 0 : 16));
          }
        }
        cp_async_commit();
        if (i > 0) {  // the previous tile of this unit has landed: publish it
          cp_async_wait<1>();
          fence_proxy_async();
          mbar_arrive(&full[(it - 1) % kStages]);
        }
      }
      // The unit's last tile is published before the next unit's lookups start, so the
      // consumers never wait on the producer's prologue of a unit.
      if (ntiles > 0) {
        cp_async_wait<0>();
        fence_proxy_async();
        mbar_arrive(&full[(it - 1) % kStages]);
      }
    }
    return;
  }

  // ================= consumers =================
  reg_alloc<Cfg::kConsumerRegs>();
  const int cw = wg - 1;                 // consumer index: rows [64 cw, 64 cw + 64) of the tile
  const int warp = t128 / 32, lane = tid % 32;

  // Q of a unit: this warpgroup's 64 rows, as cp.async into its half of the Q buffer (the
  // caller waits, fences and syncs the warpgroup before the first S GEMM reads it).
  auto load_q = [&](int q_item, int q_hkv) {
    const int qb = plan.item_req[q_item];
    const int q_begin = plan.qo_indptr[qb];
    const int rows = (plan.qo_indptr[qb + 1] - q_begin) * G;
    const int g0 = plan.item_a[q_item] * Cfg::kRows + cw * 64;
    for (int idx = t128; idx < 64 * kQChunks; idx += 128) {
      const int r = idx / kQChunks, c = idx % kQChunks;
      const int pr = g0 + r;
      const bool ok = pr < rows;
      const T* src = static_cast<const T*>(a.q);
      if (ok) {
        src += (q_begin + pr / G) * a.q_stride_n + (q_hkv * G + pr % G) * a.q_stride_h + c * 8;
      }
      const uint32_t dst = q_addr + (c / 8) * (Cfg::kRows * 128) + sw128_offset(cw * 64 + r, c % 8);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                   "r"(ok ? 16 : 0));
    }
    cp_async_commit();
  };

  // Ping-pong (kPingPong): the two consumers take turns issuing their GEMMs (S, then P V, tile
  // by tile), so one warpgroup's softmax runs while the other's GEMMs occupy the tensor cores.
  // Consumer c waits on named barrier 4 + c before issuing and arrives on the other one after;
  // consumer 1 opens the first turn, and consumer 0 takes consumer 1's last arrive after the
  // loop (an unconditional arrive keeps the issue-to-wait path free of divergent code, which
  // would make ptxas serialise the wgmmas). Both consumers run the same tiles of the same
  // units, so the turns line up across units.
  auto turn_begin = [&]() {
    if constexpr (kPingPong) named_bar_sync(4 + cw, 256);
  };
  auto turn_end = [&]() {
    if constexpr (kPingPong) named_bar_arrive(5 - cw, 256);
  };
  if constexpr (kPingPong) {
    if (cw == 1) named_bar_arrive(4, 256);
  }

  // Operand descriptors: this warpgroup's Q rows, and K / V of stage 0 (desc_advance moves
  // them to a stage and a k-step).
  const uint64_t q_desc = sw128_desc(q_addr + cw * 64 * 128, 16, 1024);
  const uint64_t k_desc0 = sw128_desc(kv_addr, 16, 1024);
  const uint64_t v_desc0 = sw128_desc(kv_addr + Cfg::kKTileBytes, kKeys * 128, 1024);

  int it = 0;  // tiles consumed over all units (the producer's ring position)
  int r = 0, item = 0, hkv = 0;
  bool live = sm90_next_unit(a, order, r, item, hkv);
  if (live) load_q(item, hkv);
  while (live) {
    const PrefillWork work = prefill_work(a, item, Cfg::kRows, kKeys);
    const int hkv_done = hkv;
    const int rows = work.rows, lo = work.lo, hi = work.hi, ntiles = work.ntiles;
    const int qoff = work.qoff;
    const MaskInfo& mask = work.mask;
    cp_async_wait<0>();  // this unit's Q
    fence_proxy_async();
    named_bar_sync(2 + cw, 128);

    const int g0 = work.r0 + cw * 64;    // first packed row of this warpgroup
    const int wr0 = g0 + warp * 16;      // first packed row of this warp
    // Keys this warpgroup can see at all.
    const bool wg_rows = g0 < rows;
    const int gt_first = g0 / G;
    const int gt_last = (min(g0 + 64, rows) - 1) / G;
    int ghi = hi, glo = lo;
    if (mask.bits == nullptr && mask.causal) ghi = min(hi, qoff + gt_last + 1);
    if (mask.window >= 0) glo = max(lo, qoff + gt_first - mask.window);
    // This warp's rows (for the per-warp full-tile test).
    const int wt_first = wr0 / G;
    const int wt_last = (max(min(wr0 + 16, rows), wr0 + 1) - 1) / G;
    const bool capped = xf.cap > 0.f;
    const float scale = capped ? 1.f : xf.scale_log2;
    const int nfree = mask.bits != nullptr && plan.mask_free_cols != nullptr
                          ? max(0, (min(hi, plan.mask_free_cols[work.b]) - lo) / kKeys)
                          : 0;

    float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f};
    float o[kDT][4];
#pragma unroll
    for (int d = 0; d < kDT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
    float (&o_flat)[kDT * 4] = reinterpret_cast<float (&)[kDT * 4]>(o);

    for (int i = 0; i < ntiles; ++i, ++it) {
      const int s = it % kStages;
      mbar_wait(&full[s], (it / kStages) & 1);
      const int kb0 = lo + i * kKeys;
      const bool active = wg_rows && kb0 < ghi && kb0 + kKeys > glo;
      const uint64_t k_desc = desc_advance(k_desc0, s * Cfg::kStageBytes);
      const uint64_t v_desc = desc_advance(v_desc0, s * Cfg::kStageBytes);
      float sc[kNT][4];
      float (&sc_flat)[kNT * 4] = reinterpret_cast<float (&)[kNT * 4]>(sc);
      uint32_t pa[kKeys / 16][4];
      // ---- S = Q K^T ----
      turn_begin();
      if (active) {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < DQK / 16; ++kk) {
          const uint32_t half = kk / 4, sub = (kk % 4) * 32;
          wgmma_ss<T, kKeys>(sc_flat, desc_advance(q_desc, half * (Cfg::kRows * 128) + sub),
                             desc_advance(k_desc, half * (kKeys * 128) + sub), kk > 0 ? 1 : 0);
        }
        wgmma_commit();
        turn_end();
        wgmma_wait<0>();
        fence_operands(sc_flat);
        MaskInfo mk = mask;
        if (i < nfree) {
          mk.bits = nullptr;
          mk.causal = false;
        }
        const bool full_tile = mk.bits == nullptr && kb0 + kKeys <= hi && wr0 + 16 <= rows &&
                               (!mk.causal || kb0 + kKeys - 1 <= qoff + wt_first) &&
                               (mk.window < 0 || kb0 >= qoff + wt_last - mk.window);
        if (capped) {
#pragma unroll
          for (int e = 0; e < kNT * 4; ++e) sc_flat[e] = xf(sc_flat[e]);
        }
        if (!full_tile) mask_tile(sc, wr0, G, kb0, hi, rows, mk, lane);
        softmax_tile(sc, m, l, o, scale);
        // P is the A operand straight from the S accumulators.
#pragma unroll
        for (int k2 = 0; k2 < kKeys / 16; ++k2) p_fragment<T>(pa[k2], sc, k2);
      } else {
        turn_end();
      }
      // ---- O += P V ----
      turn_begin();
      if (active) {
        fence_operands(o_flat);
        wgmma_fence();
#pragma unroll
        for (int k2 = 0; k2 < kKeys / 16; ++k2) {
          wgmma_rs<T, DV>(o_flat, pa[k2], desc_advance(v_desc, k2 * 16 * 128));
        }
        wgmma_commit();
        turn_end();
        wgmma_wait<0>();
        fence_operands(o_flat);
      } else {
        turn_end();
      }
      mbar_arrive(&empty[s]);
    }
    // Every S GEMM of the unit has read Q: the next unit's Q loads under the epilogue.
    ++r;
    live = sm90_next_unit(a, order, r, item, hkv);
    if (live) {
      named_bar_sync(2 + cw, 128);  // every warp is past its last wait: no wgmma reads Q
      load_q(item, hkv);
    }

    // ---- epilogue ----
    store_tile<T>(a, work, hkv_done, wr0, m, l, o, lane);
  }
  if constexpr (kPingPong) {
    if (cw == 0) named_bar_sync(4, 256);
  }
#else
  __trap();  // launched only where the sm_90a image exists (prefill_sm90_supported)
#endif
}

}  // namespace pagoda::kernels::cuda::detail
