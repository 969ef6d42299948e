#pragma once
/// Transposed tensor-core split-KV paged decode for fp8 e4m3 KV and GQA groups of <= 8 q heads.
///
/// The decode_tc kernel puts the group's q heads in the MMA m dimension (16 rows, 75 % padding
/// at G 4) and widens fp8 through a shared-memory staging tile. Here the roles are swapped:
///   S^T = K Q^T   (m16 = 16 keys, n8 = 8 q heads, k16 = head dim)   -> D/16 MMAs per 16 keys
///   O^T = V^T P^T (m16 = 16 head dims, n8 = 8 q heads, k16 = 16 keys) -> D/16 MMAs per 16 keys
/// (half the MMAs of decode_tc). Both A operands (K and V^T) are built straight from the fp8
/// bytes in registers: a lane loads 16-byte chunks of the copied tile, pairs V bytes with prmt and
/// widens them with widen_even / widen_odd (no staging tile, no ldmatrix). The head-dim order inside the K·Q
/// contraction is permuted (lane quad q owns chunks q, q + 4, ... of a key row; a 4-byte word
/// feeds the pairs (d0, d2) and (d1, d3)) and Q is loaded in the same order; the V head dims a lane owns are d = g * D/8 + [0, D/8) (g = lane / 4), which
/// fixes where O^T lands. P (S^T accumulator layout) becomes the B operand of the second MMA with
/// two movmatrix transposes. Softmax is lazy: the reference max of a head only moves when a
/// logit exceeds it by more than 2^8 (one warp vote per tile; rescale of O and l only then).
/// Everything else (warp-private cp.async rings, page prefetch, warp merge, split partials,
/// sinks, window, cap, scales) follows decode_tc_kernel.cuh.

#include <type_traits>

#include "pagoda/kernels/cuda/decode_tc_kernel.cuh"

namespace pagoda::kernels::cuda::detail {

inline constexpr int kDecodeTctMaxGroup = 8;  ///< q heads of the transposed kernel (MMA n)

template <typename T, int D>
struct DecodeTctConfig {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = kDecodeTctMaxGroup;
  static constexpr int kKeys = 16;
  static constexpr int kRowChunks = D / 16;                      // 16-byte chunks per fp8 row
  static constexpr int kCopies = kKeys * kRowChunks / 32;        // cp.async per lane per matrix
  static constexpr size_t kTileBytes = size_t(kKeys) * D;
  static constexpr size_t kStageBytes = 2 * kTileBytes;
  // 12 KB ring per warp (3 stages at D 128): 48 KB per block, 4 blocks (16 warps) per SM. On the
  // H200 this beat 16 KB (3 blocks/SM) by 11 % once the widening left the ALU pipe (NOTES v4).
  static constexpr int kStageBudget = 12288;
  static constexpr int kStagesRaw = int(kStageBudget / kStageBytes);
  static constexpr int kStages = kStagesRaw < 2 ? 2 : (kStagesRaw > 8 ? 8 : kStagesRaw);
  static constexpr size_t kWarpBytes = kStages * kStageBytes;
  static constexpr size_t kPipeBytes = kWarps * kWarpBytes;
  static constexpr size_t kMergeBytes = size_t(kWarps) * kRows * (D + 2) * sizeof(float);
  static constexpr size_t kSmemBytes = kPipeBytes > kMergeBytes ? kPipeBytes : kMergeBytes;
  static constexpr int kVBytes = D / 8;                          // V bytes per key per lane
  static_assert(kCopies >= 1 && kKeys * kRowChunks % 32 == 0 && D % 64 == 0);
};

/// Physical 16-byte chunk of K chunk c in key row r (lanes of a quarter warp hit 8 bank groups).
template <int D>
__device__ __forceinline__ int tct_ksw(int r, int c) {
  return D >= 128 ? (c ^ ((r & 1) << 2)) : c;
}
/// Physical 16-byte chunk of V chunk c in key row r.
template <int D>
__device__ __forceinline__ int tct_vsw(int r, int c) {
  const int q = (r >> 1) & 3;
  if constexpr (D == 128) return c ^ (q << 1);
  if constexpr (D == 256) return c ^ (((q & 1) << 2) | (q >> 1));
  return c ^ ((q & 1) << 1);
}

template <typename T>
__device__ __forceinline__ uint32_t hmul2_bits(uint32_t a, uint32_t b) {
  using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  T2 x = __hmul2(*reinterpret_cast<const T2*>(&a), *reinterpret_cast<const T2*>(&b));
  return *reinterpret_cast<uint32_t*>(&x);
}
/// e4m3 -> T field placement constants: shift of bytes 0/2 (multiply, FMA pipe), shift of bytes
/// 1/3 (right shift), exponent/mantissa mask, 2^(bias_T - 7) with the sign OR-ed in.
template <typename T>
struct TctWiden;
template <>
struct TctWiden<__nv_bfloat16> {
  static constexpr uint32_t kMulEven = 16u, kShiftOdd = 4u, kMask = 0x07F007F0u, kOne = 0x7B807B80u;
};
template <>
struct TctWiden<__half> {
  static constexpr uint32_t kMulEven = 128u, kShiftOdd = 1u, kMask = 0x3F803F80u, kOne = 0x5C005C00u;
};
/// (a & b) | c in one LOP3 (the compiler splits it in two when b and c are both immediates).
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
/// Bytes 0 and 2 of w -> two T values (exact for all finite e4m3; checked on the host for every
/// code): magnitude fields placed with a multiply (FMA pipe, off the busy ALU pipe), the sign
/// folded into the +-2^(bias_T - 7) multiplier. `sign` = 0x80008000, `one` = TctWiden::kOne, in
/// registers so that and_or stays one instruction.
template <typename T>
__device__ __forceinline__ uint32_t widen_even(uint32_t w, uint32_t sign, uint32_t one) {
  using C = TctWiden<T>;
  const uint32_t mag = (w * C::kMulEven) & C::kMask;
  return hmul2_bits<T>(mag, and_or(w * 256u, sign, one));
}
/// Bytes 1 and 3 of w -> two T values (the right shift as a high multiply, FMA pipe).
template <typename T>
__device__ __forceinline__ uint32_t widen_odd(uint32_t w, uint32_t sign, uint32_t one) {
  using C = TctWiden<T>;
  const uint32_t mag = __umulhi(w, 1u << (32 - C::kShiftOdd)) & C::kMask;
  return hmul2_bits<T>(mag, and_or(w, sign, one));
}

__device__ __forceinline__ uint32_t movmatrix_t(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

template <typename T, int D>
__global__ void __launch_bounds__(128) decode_tct_kernel(AttentionArgs a, LogitTransform xf) {
  pdl_wait();  // reads the K/V the previous kernel stored (pdl.cuh)
  pdl_launch_dependents();
  using Cfg = DecodeTctConfig<T, D>;
  using KV = E4M3;
  constexpr int kS = Cfg::kStages;
  constexpr int kW = Cfg::kWarps;
  constexpr int kVB = Cfg::kVBytes;
  extern __shared__ __align__(16) unsigned char smem[];

  const DevicePlan& plan = a.plan;
  DecodeItem work;
  if (!load_decode_item(a, blockIdx.x, work)) return;
  const int b = work.b, kv_lo = work.kv_lo, n = work.n, partial = work.partial;

  const int hkv = blockIdx.y;
  const int group_size = a.num_qo_heads / a.num_kv_heads;
  const int ng = min(Cfg::kRows, group_size);
  const int head0 = hkv * group_size;
  const int row = plan.qo_indptr[b];
  const int32_t* pages = plan.kv_indices + plan.kv_indptr[b];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int quad = lane % 4, g = lane / 4;

  unsigned char* pipe = smem;
  unsigned char* wbase = pipe + warp * Cfg::kWarpBytes;

  // ---- Q^T as the B operand: head g, head dims of chunk quad + 4 (kk / 4), word kk % 4 ----
  uint32_t qb[D / 16][2];
  {
    const T* qg = static_cast<const T*>(a.q) + int64_t(row) * a.q_stride_n +
                  int64_t(head0 + g) * a.q_stride_h;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int d = (quad + 4 * (kk / 4)) * 16 + (kk % 4) * 4;
      uint2 v{0u, 0u};
      if (g < ng) v = *reinterpret_cast<const uint2*>(qg + d);
      // K pairs are (d0, d2) and (d1, d3) of each 4-byte word (see widen_even / widen_odd).
      qb[kk][0] = __byte_perm(v.x, v.y, 0x5410);
      qb[kk][1] = __byte_perm(v.x, v.y, 0x7632);
    }
  }

  const int ntiles = (n + Cfg::kKeys - 1) / Cfg::kKeys;
  const int nmy = warp < ntiles ? (ntiles - warp + kW - 1) / kW : 0;
  const int ps = a.page_size;
  const KV* kg = static_cast<const KV*>(a.k.data) + int64_t(hkv) * a.k.head_stride;
  const KV* vg = static_cast<const KV*>(a.v.data) + int64_t(hkv) * a.v.head_stride;

  auto fetch_page = [&](int li) -> int {
    const int key = (warp + kW * li) * Cfg::kKeys + (lane & 15);
    return (li < nmy && key < n) ? __ldg(pages + (kv_lo + key) / ps) : -1;
  };
  auto stage_k = [&](int st) { return wbase + st * Cfg::kStageBytes; };
  auto stage_v = [&](int st) { return wbase + st * Cfg::kStageBytes + Cfg::kTileBytes; };
  auto issue = [&](int li, int page) {
    const int key = (warp + kW * li) * Cfg::kKeys + (lane & 15);
    int64_t off = -1;
    if (page >= 0) {
      const int64_t o = (kv_lo + key) % ps;
      off = lane < 16 ? page * a.k.page_stride + o * a.k.token_stride
                      : page * a.v.page_stride + o * a.v.token_stride;
    }
    unsigned char* kd = stage_k(li % kS);
    unsigned char* vd = stage_v(li % kS);
#pragma unroll
    for (int j = 0; j < Cfg::kCopies; ++j) {
      const int idx = lane + 32 * j;
      const int r = idx / Cfg::kRowChunks, c = idx % Cfg::kRowChunks;
      const int64_t ko = __shfl_sync(0xffffffffu, off, r);
      const int64_t vo = __shfl_sync(0xffffffffu, off, 16 + r);
      cp_async16(kd + r * D + tct_ksw<D>(r, c) * 16, ko < 0 ? kg : kg + ko + c * 16, ko >= 0);
      cp_async16(vd + r * D + tct_vsw<D>(r, c) * 16, vo < 0 ? vg : vg + vo + c * 16, vo >= 0);
    }
  };

  // Lane state: heads 2 quad + e; m is uniform over the 8 lanes of a quad column, l is partial.
  // Kept in registers (opaque to constant folding) so that each and_or is a single LOP3.
  uint32_t ksign = 0x80008000u, kone = TctWiden<T>::kOne;
  asm volatile("" : "+r"(ksign), "+r"(kone));
  float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f};
  float o[D / 16][4];  // O^T m-tile t: [0..1] dim g*kVB + 2t, [2..3] dim g*kVB + 2t + 1
#pragma unroll
  for (int i = 0; i < D / 16; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;

#pragma unroll
  for (int s = 0; s < kS - 1; ++s) {
    if (s < nmy) issue(s, fetch_page(s));
    cp_async_commit();
  }
  int pg = fetch_page(kS - 1);

  for (int li = 0; li < nmy; ++li) {
    __syncwarp();
    const int nx = li + kS - 1;
    if (nx < nmy) issue(nx, pg);
    cp_async_commit();
    pg = fetch_page(nx + 1);
    cp_async_wait<kS - 1>();
    __syncwarp();

    const unsigned char* kt = stage_k(li % kS);
    const unsigned char* vt = stage_v(li % kS);

    // S^T = K Q^T: rows = keys g and g + 8, columns = heads 2 quad, 2 quad + 1.
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < D / 64; ++j) {
      const int c = quad + 4 * j;
      const uint4 k0 = *reinterpret_cast<const uint4*>(kt + g * D + tct_ksw<D>(g, c) * 16);
      const uint4 k1 =
          *reinterpret_cast<const uint4*>(kt + (g + 8) * D + tct_ksw<D>(g + 8, c) * 16);
      const uint32_t* w0 = reinterpret_cast<const uint32_t*>(&k0);
      const uint32_t* w1 = reinterpret_cast<const uint32_t*>(&k1);
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        uint32_t ka[4];
        ka[0] = widen_even<T>(w0[w], ksign, kone);
        ka[1] = widen_even<T>(w1[w], ksign, kone);
        ka[2] = widen_odd<T>(w0[w], ksign, kone);
        ka[3] = widen_odd<T>(w1[w], ksign, kone);
        mma16816<T>(s, ka, qb[4 * j + w][0], qb[4 * j + w][1]);
      }
    }
    const int kb0 = (warp + kW * li) * Cfg::kKeys;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = kb0 + g + 8 * (e / 2);
      s[e] = key < n ? xf(s[e]) : neg_inf();
    }
    // Lazy online softmax: move the reference only when a logit exceeds it by more than
    // kLazyRescale (base 2).
    const bool grow =
        fmaxf(s[0], s[2]) > m[0] + kLazyRescale || fmaxf(s[1], s[3]) > m[1] + kLazyRescale;
    if (__any_sync(0xffffffffu, grow)) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float mx = fmaxf(s[e], s[e + 2]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        if (mx > m[e]) {
          const float scale = exp2_diff(m[e], mx);
          m[e] = mx;
          l[e] *= scale;
#pragma unroll
          for (int t = 0; t < D / 16; ++t) {
            o[t][e] *= scale;
            o[t][2 + e] *= scale;
          }
        }
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) s[e] = exp2_diff(s[e], m[e & 1]);
    l[0] += s[0] + s[2];
    l[1] += s[1] + s[3];
    // P^T as the B operand: b0 = keys 2 quad, +1 of head g; b1 = keys 8 + 2 quad, +1.
    const uint32_t pb0 = movmatrix_t(pack2<T>(s[0], s[1]));
    const uint32_t pb1 = movmatrix_t(pack2<T>(s[2], s[3]));

    // O^T += V^T P^T: lane needs V bytes [g * kVB, +kVB) of keys 2 quad, +1, +8, +9.
    const int r0 = 2 * quad;
#pragma unroll
    for (int p = 0; p < (kVB >= 16 ? kVB / 16 : 1); ++p) {
      uint32_t x[4][kVB >= 16 ? 4 : 2];  // keys r0, r0 + 1, r0 + 8, r0 + 9
#pragma unroll
      for (int kr = 0; kr < 4; ++kr) {
        const int r = r0 + (kr & 1) + 8 * (kr >> 1);
        const int byte = g * kVB + p * 16;
        const unsigned char* src = vt + r * D + tct_vsw<D>(r, byte / 16) * 16 + byte % 16;
        if constexpr (kVB >= 16) {
          const uint4 v = *reinterpret_cast<const uint4*>(src);
          x[kr][0] = v.x; x[kr][1] = v.y; x[kr][2] = v.z; x[kr][3] = v.w;
        } else {
          const uint2 v = *reinterpret_cast<const uint2*>(src);
          x[kr][0] = v.x; x[kr][1] = v.y;
        }
      }
#pragma unroll
      for (int w = 0; w < (kVB >= 16 ? 4 : 2); ++w) {
        // [key r0 bytes 0-1 | key r0+1 bytes 0-1] and the same for bytes 2-3 (and keys r0+8, +9).
        const uint32_t u[2][2] = {{__byte_perm(x[0][w], x[1][w], 0x5410),
                                   __byte_perm(x[0][w], x[1][w], 0x7632)},
                                  {__byte_perm(x[2][w], x[3][w], 0x5410),
                                   __byte_perm(x[2][w], x[3][w], 0x7632)}};
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          // m-tile t: row g = byte 2 hf, row g + 8 = byte 2 hf + 1 of word w.
          const int t = (p * 16 + w * 4) / 2 + hf;
          uint32_t va[4];
          va[0] = widen_even<T>(u[0][hf], ksign, kone);
          va[1] = widen_odd<T>(u[0][hf], ksign, kone);
          va[2] = widen_even<T>(u[1][hf], ksign, kone);
          va[3] = widen_odd<T>(u[1][hf], ksign, kone);
          mma16816<T>(o[t], va, pb0, pb1);
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  // ---- merge the 4 warps' states in shared memory ----
  float* red = reinterpret_cast<float*>(pipe);  // [kW][8][D]
  float* ml = red + kW * Cfg::kRows * D;        // [kW][8][2]
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    l[e] += __shfl_xor_sync(0xffffffffu, l[e], 4);
    l[e] += __shfl_xor_sync(0xffffffffu, l[e], 8);
    l[e] += __shfl_xor_sync(0xffffffffu, l[e], 16);
    const int h = 2 * quad + e;
    if (g == 0) {
      ml[(warp * Cfg::kRows + h) * 2] = m[e];
      ml[(warp * Cfg::kRows + h) * 2 + 1] = l[e];
    }
    float* dst = red + (warp * Cfg::kRows + h) * D + g * kVB;
#pragma unroll
    for (int t = 0; t < D / 16; ++t) {
      *reinterpret_cast<float2*>(dst + 2 * t) = make_float2(o[t][e], o[t][2 + e]);
    }
  }
  __syncthreads();
  merge_warp_states<T, D, kW, Cfg::kRows, Cfg::kThreads>(a, red, ml, ng, tid, head0, row, partial);
}

}  // namespace pagoda::kernels::cuda::detail
