#pragma once
/// Tensor-core split-KV paged decode (GQA head groups on mma.sync m16n8k16, f32 accumulation).
///
/// One block = one work item (request, kv chunk [a, b)) x one kv head x up to kDecodeMaxGroup
/// (16) q heads of that kv head. The group's q heads are the 16 rows of the MMA A operand (rows
/// beyond the group are zero and never written). 4 warps; warp w owns the 16-key tiles
/// w, w + 4, w + 8, ... of the chunk and streams them through its own multi-stage cp.async ring
/// in shared memory, so the mainloop has no block barrier (only __syncwarp). Per tile:
/// S = Q K^T (D/16 x 2 MMAs), online softmax in registers (rows = q heads), O += P V (D/8 MMAs).
/// Page ids of the next tile are loaded one iteration ahead; each lane resolves one key row and
/// the row offsets are shuffled to the lanes that copy its 16-byte chunks (page size 1 costs the
/// same as page size 16). fp8 e4m3 KV is copied as bytes (half the traffic) and widened to the
/// query type in a per-warp staging tile before ldmatrix. The 4 warps' (m, l, O) states are
/// merged in shared memory at the end; split chunks write (O / l, lse) partials for the merge
/// kernel, whole requests write the output (sinks and v_scale applied here).
///
/// Contract (checked by the host): q/out in {bf16, f16}; KV = q type or e4m3; D in {64, 128, 256};
/// 16-byte aligned rows (strides multiples of 8 elements); one query row per request.

#include <type_traits>

#include "pagoda/kernels/cuda/device_utils.cuh"
#include "pagoda/kernels/cuda/pdl.cuh"

namespace pagoda::kernels::cuda::detail {

template <typename T, typename KV, int D>
struct DecodeTcConfig {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = kDecodeMaxGroup;                  // 16 q heads (MMA m)
  static constexpr int kKeys = 16;                               // keys per warp tile
  static constexpr bool kConvert = !std::is_same_v<KV, T>;       // fp8 KV
  static constexpr int kRowChunks = int(D * sizeof(KV)) / 16;    // 16-byte chunks per key row
  static constexpr int kChunkElems = 16 / int(sizeof(KV));
  static constexpr int kCopies = kKeys * kRowChunks / 32;        // cp.async per lane per matrix
  static constexpr size_t kTileBytes = size_t(kKeys) * D * sizeof(KV);
  static constexpr size_t kStageBytes = 2 * kTileBytes;          // K + V as stored
  static constexpr int kStagesRaw = int((kConvert ? 16384 : 24576) / kStageBytes);
  static constexpr int kStages = kStagesRaw < 2 ? 2 : (kStagesRaw > 8 ? 8 : kStagesRaw);
  static constexpr size_t kConvBytes = kConvert ? 2 * size_t(kKeys) * D * sizeof(T) : 0;
  static constexpr size_t kWarpBytes = kStages * kStageBytes + kConvBytes;
  static constexpr bool kQInRegs = D <= 128;
  static constexpr size_t kQBytes = kQInRegs ? 0 : size_t(kRows) * D * sizeof(T);
  static constexpr size_t kPipeBytes = kWarps * kWarpBytes;
  static constexpr size_t kMergeBytes = size_t(kWarps) * kRows * (D + 2) * sizeof(float);
  static constexpr size_t kSmemBytes =
      kQBytes + (kPipeBytes > kMergeBytes ? kPipeBytes : kMergeBytes);
  static_assert(kCopies >= 1 && kKeys * kRowChunks % 32 == 0);
  static_assert(D % 64 == 0 && kKeys == 16 && kRows == 16);
};

/// Offset (elements) of 16-byte chunk c of row r in an XOR-swizzled [rows][D] 16-bit tile.
template <int D>
__device__ __forceinline__ int dtc_swz(int r, int c) {
  return (r * (D / 8) + (c ^ (r & 7))) * 8;
}

/// The end of a decode block (decode_tc and decode_tct): the kW warps' states, published in
/// shared memory (maxima and sums ml [kW][kRows][2], unnormalised O red [kW][kRows][D]) before
/// the caller's __syncthreads, merged per (q head g < ng, dim) and written: the output row (sinks
/// and v_scale applied, LSE when asked) for a whole request (partial < 0), else the split
/// partial (O / l, lse) for the merge kernel.
template <typename T, int D, int kW, int kRows, int kThreads>
__device__ __forceinline__ void merge_warp_states(const AttentionArgs& a, const float* red,
                                                  const float* ml, int ng, int tid, int head0,
                                                  int row, int partial) {
  for (int idx = tid; idx < ng * D; idx += kThreads) {
    const int g = idx / D, d = idx % D;
    float mm = neg_inf();
#pragma unroll
    for (int w = 0; w < kW; ++w) mm = fmaxf(mm, ml[(w * kRows + g) * 2]);
    float lsum = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < kW; ++w) {
      const float f = exp2_diff(ml[(w * kRows + g) * 2], mm);
      lsum += ml[(w * kRows + g) * 2 + 1] * f;
      acc += red[(w * kRows + g) * D + d] * f;
    }
    const int head = head0 + g;
    if (partial < 0) {
      float lse;
      const float f = finalize_state(mm, lsum, a.sinks, head, a.v_scale, lse);
      T* op = static_cast<T*>(a.out) + int64_t(row) * a.o_stride_n + int64_t(head) * a.o_stride_h;
      if constexpr (std::is_same_v<T, __half>) {
        op[d] = __float2half_rn(acc * f);
      } else {
        op[d] = __float2bfloat16_rn(acc * f);
      }
      if (d == 0 && a.lse != nullptr) a.lse[row * a.lse_stride_n + head * a.lse_stride_h] = lse;
    } else {
      const bool empty = mm == neg_inf() || lsum <= 0.f;
      const size_t base = size_t(partial) * a.num_qo_heads + head;
      a.partial_o[base * D + d] = empty ? 0.f : acc / lsum * a.v_scale;
      if (d == 0) a.partial_lse[base] = empty ? neg_inf() : mm + log2f(lsum);
    }
  }
}

template <typename T, typename KV, int D>
__global__ void __launch_bounds__(128) decode_tc_kernel(AttentionArgs a, LogitTransform xf) {
  pdl_wait();  // reads the K/V the previous kernel stored (pdl.cuh)
  pdl_launch_dependents();
  using Cfg = DecodeTcConfig<T, KV, D>;
  constexpr int kS = Cfg::kStages;
  constexpr int kW = Cfg::kWarps;
  extern __shared__ __align__(16) unsigned char smem[];

  const DevicePlan& plan = a.plan;
  DecodeItem work;
  if (!load_decode_item(a, blockIdx.x, work)) return;
  const int b = work.b, kv_lo = work.kv_lo, n = work.n, partial = work.partial;

  const int hkv = blockIdx.y;
  const int group_size = a.num_qo_heads / a.num_kv_heads;
  const int g0 = blockIdx.z * Cfg::kRows;
  const int ng = min(Cfg::kRows, group_size - g0);
  const int head0 = hkv * group_size + g0;
  const int row = plan.qo_indptr[b];
  const int32_t* pages = plan.kv_indices + plan.kv_indptr[b];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int quad = lane % 4;

  T* qs = reinterpret_cast<T*>(smem);
  unsigned char* pipe = smem + Cfg::kQBytes;
  unsigned char* wbase = pipe + warp * Cfg::kWarpBytes;
  const T* qg = static_cast<const T*>(a.q) + int64_t(row) * a.q_stride_n +
                int64_t(head0) * a.q_stride_h;

  // ---- Q as the MMA A operand (rows = q heads of the group, zero beyond ng) ----
  [[maybe_unused]] uint32_t qa[Cfg::kQInRegs ? D / 16 : 1][4];
  if constexpr (Cfg::kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = lane / 4 + 8 * h;
        const T* qp = qg + int64_t(r) * a.q_stride_h + kk * 16 + 2 * quad;
        const bool ok = r < ng;
        qa[kk][h] = ok ? *reinterpret_cast<const uint32_t*>(qp) : 0u;
        qa[kk][2 + h] = ok ? *reinterpret_cast<const uint32_t*>(qp + 8) : 0u;
      }
    }
  } else {
    for (int idx = tid; idx < Cfg::kRows * (D / 8); idx += Cfg::kThreads) {
      const int r = idx / (D / 8), c = idx % (D / 8);
      uint4 v{0u, 0u, 0u, 0u};
      if (r < ng) v = *reinterpret_cast<const uint4*>(qg + int64_t(r) * a.q_stride_h + c * 8);
      *reinterpret_cast<uint4*>(qs + dtc_swz<D>(r, c)) = v;
    }
    __syncthreads();
  }

  // ---- this warp's tiles: global tiles warp, warp + kW, ... ----
  const int ntiles = (n + Cfg::kKeys - 1) / Cfg::kKeys;
  const int nmy = warp < ntiles ? (ntiles - warp + kW - 1) / kW : 0;
  const int ps = a.page_size;
  const KV* kg = static_cast<const KV*>(a.k.data) + int64_t(hkv) * a.k.head_stride;
  const KV* vg = static_cast<const KV*>(a.v.data) + int64_t(hkv) * a.v.head_stride;

  // Page id of this lane's key row (lane % 16) of local tile li; -1 when out of range.
  auto fetch_page = [&](int li) -> int {
    const int key = (warp + kW * li) * Cfg::kKeys + (lane & 15);
    return (li < nmy && key < n) ? __ldg(pages + (kv_lo + key) / ps) : -1;
  };
  auto stage_k = [&](int st) { return reinterpret_cast<KV*>(wbase + st * Cfg::kStageBytes); };
  auto stage_v = [&](int st) {
    return reinterpret_cast<KV*>(wbase + st * Cfg::kStageBytes + Cfg::kTileBytes);
  };
  // Lanes 0-15 resolve the K offset of key row lane, lanes 16-31 the V offset of row lane - 16.
  auto issue = [&](int li, int page) {
    const int key = (warp + kW * li) * Cfg::kKeys + (lane & 15);
    int64_t off = -1;
    if (page >= 0) {
      const int64_t o = (kv_lo + key) % ps;
      off = lane < 16 ? page * a.k.page_stride + o * a.k.token_stride
                      : page * a.v.page_stride + o * a.v.token_stride;
    }
    KV* kd = stage_k(li % kS);
    KV* vd = stage_v(li % kS);
#pragma unroll
    for (int j = 0; j < Cfg::kCopies; ++j) {
      const int idx = lane + 32 * j;
      const int r = idx / Cfg::kRowChunks, c = idx % Cfg::kRowChunks;
      const int64_t ko = __shfl_sync(0xffffffffu, off, r);
      const int64_t vo = __shfl_sync(0xffffffffu, off, 16 + r);
      const int dst = Cfg::kConvert ? r * D + c * Cfg::kChunkElems : dtc_swz<D>(r, c);
      cp_async16(kd + dst, ko < 0 ? kg : kg + ko + c * Cfg::kChunkElems, ko >= 0);
      cp_async16(vd + dst, vo < 0 ? vg : vg + vo + c * Cfg::kChunkElems, vo >= 0);
    }
  };

  float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f};
  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;

#pragma unroll
  for (int s = 0; s < kS - 1; ++s) {
    if (s < nmy) issue(s, fetch_page(s));
    cp_async_commit();
  }
  int pg = fetch_page(kS - 1);

  for (int li = 0; li < nmy; ++li) {
    __syncwarp();  // every lane is done with the stage that the next issue overwrites
    const int nx = li + kS - 1;
    if (nx < nmy) issue(nx, pg);
    cp_async_commit();
    pg = fetch_page(nx + 1);
    cp_async_wait<kS - 1>();
    __syncwarp();

    const T* kt;
    const T* vt;
    if constexpr (Cfg::kConvert) {
      T* ck = reinterpret_cast<T*>(wbase + kS * Cfg::kStageBytes);
      T* cv = ck + Cfg::kKeys * D;
      const auto* rk = reinterpret_cast<const unsigned char*>(stage_k(li % kS));
      const auto* rv = reinterpret_cast<const unsigned char*>(stage_v(li % kS));
#pragma unroll
      for (int j = 0; j < Cfg::kCopies; ++j) {
        const int idx = lane + 32 * j;
        const int r = idx / Cfg::kRowChunks, c = idx % Cfg::kRowChunks;
        // Lanes with c % 8 >= 4 store their high chunk first: 8 lanes, 8 bank groups.
        const int sw = (c >> 2) & 1;
        uint4 lo, hi;
        widen16<T>(*reinterpret_cast<const uint4*>(rk + r * D + c * 16), lo, hi);
        *reinterpret_cast<uint4*>(ck + dtc_swz<D>(r, 2 * c + sw)) = sw ? hi : lo;
        *reinterpret_cast<uint4*>(ck + dtc_swz<D>(r, 2 * c + 1 - sw)) = sw ? lo : hi;
        widen16<T>(*reinterpret_cast<const uint4*>(rv + r * D + c * 16), lo, hi);
        *reinterpret_cast<uint4*>(cv + dtc_swz<D>(r, 2 * c + sw)) = sw ? hi : lo;
        *reinterpret_cast<uint4*>(cv + dtc_swz<D>(r, 2 * c + 1 - sw)) = sw ? lo : hi;
      }
      __syncwarp();
      kt = ck;
      vt = cv;
    } else {
      kt = stage_k(li % kS);
      vt = stage_v(li % kS);
    }

    // S = Q K^T: 16 q heads x 16 keys.
    float s[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t kb[4];
      ldmatrix_x4(kb, kt + dtc_swz<D>((lane / 16) * 8 + lane % 8, kk * 2 + (lane / 8) % 2));
      if constexpr (Cfg::kQInRegs) {
        mma16816<T>(s[0], qa[kk], kb[0], kb[1]);
        mma16816<T>(s[1], qa[kk], kb[2], kb[3]);
      } else {
        uint32_t qf[4];
        ldmatrix_x4(qf, qs + dtc_swz<D>(lane % 16, kk * 2 + lane / 16));
        mma16816<T>(s[0], qf, kb[0], kb[1]);
        mma16816<T>(s[1], qf, kb[2], kb[3]);
      }
    }
    transform_logits16(s, (warp + kW * li) * Cfg::kKeys, n, quad, xf);
    // Online softmax; a row (q head) is shared by the 4 lanes of a quad.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = fmaxf(m[h], fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]),
                                   fmaxf(s[1][2 * h], s[1][2 * h + 1])));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float scale = exp2_diff(m[h], mx);
      m[h] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        s[j][2 * h] = exp2_diff(s[j][2 * h], mx);
        s[j][2 * h + 1] = exp2_diff(s[j][2 * h + 1], mx);
        sum += s[j][2 * h] + s[j][2 * h + 1];
      }
      l[h] = l[h] * scale + sum;
#pragma unroll
      for (int d = 0; d < D / 8; ++d) {
        o[d][2 * h] *= scale;
        o[d][2 * h + 1] *= scale;
      }
    }
    // O += P V.
    uint32_t pa[4];
    pa[0] = pack2<T>(s[0][0], s[0][1]);
    pa[1] = pack2<T>(s[0][2], s[0][3]);
    pa[2] = pack2<T>(s[1][0], s[1][1]);
    pa[3] = pack2<T>(s[1][2], s[1][3]);
#pragma unroll
    for (int d2 = 0; d2 < D / 16; ++d2) {
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, vt + dtc_swz<D>(lane % 8 + ((lane / 8) % 2) * 8, d2 * 2 + lane / 16));
      mma16816<T>(o[2 * d2], pa, vb[0], vb[1]);
      mma16816<T>(o[2 * d2 + 1], pa, vb[2], vb[3]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  // ---- merge the 4 warps' states in shared memory (reuses the pipeline buffers) ----
  float* red = reinterpret_cast<float*>(pipe);                    // [kW][16][D]
  float* ml = red + kW * Cfg::kRows * D;                          // [kW][16][2]
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    const int r = lane / 4 + 8 * h;
    if (quad == 0) {
      ml[(warp * Cfg::kRows + r) * 2] = m[h];
      ml[(warp * Cfg::kRows + r) * 2 + 1] = l[h];
    }
    float* dst = red + (warp * Cfg::kRows + r) * D + quad * 2;
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      *reinterpret_cast<float2*>(dst + d * 8) = make_float2(o[d][2 * h], o[d][2 * h + 1]);
    }
  }
  __syncthreads();
  merge_warp_states<T, D, kW, Cfg::kRows, Cfg::kThreads>(a, red, ml, ng, tid, head0, row, partial);
}

}  // namespace pagoda::kernels::cuda::detail
