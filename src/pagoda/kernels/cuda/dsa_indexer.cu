#include "pagoda/kernels/cuda/dsa_indexer.h"

#include <cuda_bf16.h>

#include "pagoda/kernels/cuda/device_utils.cuh"

namespace pagoda::kernels::cuda {
namespace {

using detail::mma16816;
using detail::widen2;

constexpr int kTile = 64;          // positions per scores tile
constexpr int kTopkThreads = 512;  // one top-k block per row
constexpr int kCtasPerSm = 4;      // scores blocks per SM the grid aims at (one wave)

__device__ __forceinline__ uint32_t bf16_pair(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(lo)) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(hi)) << 16);
}

/// x = hi + mid + lo in bf16 (24 bits of mantissa: x's own, up to its last bit or two).
__device__ __forceinline__ void split3(float x, __nv_bfloat16 (&p)[3]) {
  p[0] = __float2bfloat16_rn(x);
  const float r = x - __bfloat162float(p[0]);
  p[1] = __float2bfloat16_rn(r);
  p[2] = __float2bfloat16_rn(r - __bfloat162float(p[1]));
}

/// Whether row t sees position p (p < visible is the caller's).
__device__ __forceinline__ bool tree_sees(const DsaIndexArgs& a, int t, int p) {
  if (a.tree_size == 0) return true;
  const int j = p - a.tree_begin[t];
  return j < 0 || a.tree_bits[static_cast<int64_t>(t) * a.tree_size + j] != 0;
}

// Block (x: a strided set of 64-position tiles, y: row t), one warp per 16 heads. Warp w keeps
// A = q[t, 16w .. 16w + 16, :] in registers as three bf16 parts (zero past heads and dim); per
// tile the block stages the keys as bf16 [64, 16 KS + 8] (the pad spreads the B-fragment reads
// over all banks), each warp computes D = A · keysᵀ (16 heads x 8 positions per mma), applies
// ReLU and its heads' weights and sums over its heads; the warps' partial sums are added in warp
// order, times the key's scale.
template <int KS>
__global__ void __launch_bounds__(256) dsa_scores_kernel(DsaIndexArgs a) {
  constexpr int DP = KS * 16, STRIDE = DP + 8, DW = DP / 4;
  __shared__ __align__(16) __nv_bfloat16 keys_s[kTile * STRIDE];
  __shared__ int64_t row_s[kTile];  // byte offset of the position's index row, -1 unseen
  __shared__ float scale_s[kTile];
  __shared__ float part_s[8][kTile];
  const int t = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4, nwarps = blockDim.x / 32;

  uint32_t A[3][KS][4];
  {
    const float* q = a.q + static_cast<int64_t>(t) * a.heads * a.dim;
    auto qv = [&](int h, int d) { return h < a.heads && d < a.dim ? q[h * a.dim + d] : 0.f; };
#pragma unroll
    for (int s = 0; s < KS; ++s)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int h = 16 * warp + g + 8 * (i & 1), d = 16 * s + 2 * c + 8 * (i >> 1);
        __nv_bfloat16 x0[3], x1[3];
        split3(qv(h, d), x0);
        split3(qv(h, d + 1), x1);
#pragma unroll
        for (int part = 0; part < 3; ++part) A[part][s][i] = bf16_pair(x0[part], x1[part]);
      }
  }
  const float* w = a.w + static_cast<int64_t>(t) * a.heads;
  const int h0 = 16 * warp + g;
  const float w0 = h0 < a.heads ? w[h0] : 0.f, w1 = h0 + 8 < a.heads ? w[h0 + 8] : 0.f;
  const int visible = a.visible[t], slot0 = a.slot_begin[t], code_words = a.dim / 4;
  float* out = a.scores + static_cast<int64_t>(t) * a.max_visible;

  const int tiles = (a.max_visible + kTile - 1) / kTile;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int p0 = tile * kTile;
    for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
      const int p = p0 + i;
      const bool sees = p < visible && tree_sees(a, t, p);
      const int64_t off = sees ? static_cast<int64_t>(a.slots[slot0 + p]) * a.row_bytes : -1;
      row_s[i] = off;
      scale_s[i] = sees ? __ldg(reinterpret_cast<const float*>(a.index_rows + off + a.dim)) : 0.f;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kTile * DW; i += blockDim.x) {
      const int pos = i / DW, word = i % DW;
      const int64_t off = row_s[pos];
      const uint32_t x = off >= 0 && word < code_words
                             ? __ldg(reinterpret_cast<const uint32_t*>(a.index_rows + off) + word)
                             : 0u;
      const uint2 v = make_uint2(widen2<__nv_bfloat16>(__byte_perm(x, 0u, 0x1404)),
                                 widen2<__nv_bfloat16>(__byte_perm(x, 0u, 0x3424)));
      *reinterpret_cast<uint2*>(keys_s + pos * STRIDE + 4 * word) = v;
    }
    __syncthreads();
#pragma unroll 2
    for (int j = 0; j < kTile / 8; ++j) {
      float hi[4] = {0.f, 0.f, 0.f, 0.f}, lo[4] = {0.f, 0.f, 0.f, 0.f};
      const __nv_bfloat16* krow = keys_s + (8 * j + g) * STRIDE + 2 * c;
#pragma unroll
      for (int s = 0; s < KS; ++s) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(krow + 16 * s);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(krow + 16 * s + 8);
        mma16816<__nv_bfloat16>(hi, A[0][s], b0, b1);
        mma16816<__nv_bfloat16>(lo, A[1][s], b0, b1);
        mma16816<__nv_bfloat16>(lo, A[2][s], b0, b1);
      }
      // D rows: heads h0 (d0, d1) and h0 + 8 (d2, d3); columns: positions 8j + 2c, + 1.
      float v0 = w0 * fmaxf(hi[0] + lo[0], 0.f) + w1 * fmaxf(hi[2] + lo[2], 0.f);
      float v1 = w0 * fmaxf(hi[1] + lo[1], 0.f) + w1 * fmaxf(hi[3] + lo[3], 0.f);
#pragma unroll
      for (int m = 4; m < 32; m <<= 1) {
        v0 += __shfl_xor_sync(0xffffffffu, v0, m);
        v1 += __shfl_xor_sync(0xffffffffu, v1, m);
      }
      if (g == 0) {
        part_s[warp][8 * j + 2 * c] = v0;
        part_s[warp][8 * j + 2 * c + 1] = v1;
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
      const int p = p0 + i;
      if (p >= a.max_visible) continue;
      float s = 0.f;
      for (int k = 0; k < nwarps; ++k) s += part_s[k][i];
      s *= scale_s[i];
      out[p] = row_s[i] < 0 ? detail::neg_inf() : (s == 0.f ? 0.f : s);  // -0 -> +0
    }
    __syncthreads();  // the next tile overwrites the shared arrays
  }
}

/// Order-preserving bits of a float (a larger key is a larger value; -inf below every finite).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float order_value(uint32_t u) {
  return __uint_as_float((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
}
/// Sort key: ascending = (score descending, position ascending).
__device__ __forceinline__ unsigned long long sort_key(uint32_t u, int p) {
  return (static_cast<unsigned long long>(~u) << 32) | static_cast<uint32_t>(p);
}

// Block t: row t's min(k, seen) best positions (see the header), sorted, then -1 / -inf.
__global__ void __launch_bounds__(kTopkThreads) dsa_topk_kernel(DsaIndexArgs a) {
  __shared__ uint32_t hist[2048];
  __shared__ unsigned long long cand[kDsaMaxTopk];
  __shared__ uint32_t s_bucket, s_remaining, s_count, s_warp_eq[kTopkThreads / 32];
  const int t = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int keep = min(a.k, a.seen[t]), n = a.visible[t];
  const float* row = a.scores + static_cast<int64_t>(t) * a.max_visible;
  int32_t* out = a.topk + static_cast<int64_t>(t) * a.k;
  float* out_s = a.topk_scores + static_cast<int64_t>(t) * a.k;
  if (keep > 0) {
    // Radix select: digits [31:21], [20:10], [9:0] of the order key; `remaining` counts how
    // many of the elements matching `prefix` on `mask` still belong to the top `keep`.
    uint32_t prefix = 0, mask = 0, remaining = static_cast<uint32_t>(keep);
    constexpr int kShift[3] = {21, 10, 0}, kBits[3] = {11, 11, 10};
#pragma unroll
    for (int d = 0; d < 3; ++d) {
      const int shift = kShift[d], nb = 1 << kBits[d];
      for (int i = tid; i < nb; i += kTopkThreads) hist[i] = 0;
      __syncthreads();
      for (int p = tid; p < n; p += kTopkThreads) {
        const uint32_t u = order_key(row[p]);
        if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & (nb - 1)], 1u);
      }
      __syncthreads();
      if (warp == 0) {  // lane l owns buckets nb-1-l·per down to nb-(l+1)·per (descending)
        const int per = nb / 32;
        uint32_t sum = 0;
        for (int j = 0; j < per; ++j) sum += hist[nb - 1 - lane * per - j];
        uint32_t incl = sum;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
          const uint32_t v = __shfl_up_sync(0xffffffffu, incl, off);
          if (lane >= off) incl += v;
        }
        uint32_t acc = incl - sum;
        if (acc < remaining && remaining <= incl) {
          for (int j = 0; j < per; ++j) {
            const int b = nb - 1 - lane * per - j;
            if (acc + hist[b] >= remaining) {
              s_bucket = static_cast<uint32_t>(b);
              s_remaining = remaining - acc;
              break;
            }
            acc += hist[b];
          }
        }
      }
      __syncthreads();
      prefix |= s_bucket << shift;
      mask |= static_cast<uint32_t>(nb - 1) << shift;
      remaining = s_remaining;
    }
    // prefix = T, the keep-th best key; take every key above T and the `remaining` earliest
    // positions equal to T (hist[T's last digit] of them exist).
    const uint32_t need_eq = remaining, eq_total = hist[prefix & 1023u];
    const uint32_t n_gt = static_cast<uint32_t>(keep) - need_eq;
    if (tid == 0) s_count = 0;
    __syncthreads();
    if (eq_total == need_eq) {
      for (int p = tid; p < n; p += kTopkThreads) {
        const uint32_t u = order_key(row[p]);
        if (u >= prefix) cand[atomicAdd(&s_count, 1u)] = sort_key(u, p);
      }
    } else {  // a tie across the cut: the equal keys in position order, warp by warp
      const int seg = (n + kTopkThreads - 1) / kTopkThreads * 32;  // a warp's positions
      const int begin = warp * seg, end = min(n, begin + seg);
      uint32_t mine = 0;
      for (int p0 = begin; p0 < end; p0 += 32) {
        const int p = p0 + lane;
        const uint32_t u = p < end ? order_key(row[p]) : 0u;
        if (p < end && u > prefix) cand[atomicAdd(&s_count, 1u)] = sort_key(u, p);
        mine += __popc(__ballot_sync(0xffffffffu, p < end && u == prefix));
      }
      if (lane == 0) s_warp_eq[warp] = mine;
      __syncthreads();
      uint32_t base = 0;
      for (int k = 0; k < warp; ++k) base += s_warp_eq[k];
      for (int p0 = begin; p0 < end && base < need_eq; p0 += 32) {
        const int p = p0 + lane;
        const uint32_t u = p < end ? order_key(row[p]) : 0u;
        const bool eq = p < end && u == prefix;
        const uint32_t ballot = __ballot_sync(0xffffffffu, eq);
        const uint32_t rank = base + __popc(ballot & ((1u << lane) - 1u));
        if (eq && rank < need_eq) cand[n_gt + rank] = sort_key(u, p);
        base += __popc(ballot);
      }
    }
    __syncthreads();
    int m = 1;
    while (m < keep) m <<= 1;
    for (int i = keep + tid; i < m; i += kTopkThreads) cand[i] = ~0ull;
    __syncthreads();
    for (int size = 2; size <= m; size <<= 1)
      for (int stride = size / 2; stride > 0; stride >>= 1) {
        for (int i = tid; i < m / 2; i += kTopkThreads) {
          const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
          const unsigned long long x = cand[lo], y = cand[hi];
          if ((x > y) == ((lo & size) == 0)) {
            cand[lo] = y;
            cand[hi] = x;
          }
        }
        __syncthreads();
      }
    for (int i = tid; i < keep; i += kTopkThreads) {
      const unsigned long long v = cand[i];
      const auto pos = static_cast<int32_t>(v & 0xffffffffu);
      out[i] = pos;
      out_s[i] = order_value(~static_cast<uint32_t>(v >> 32));
      if (a.slot_out != nullptr)
        a.slot_out[a.slot_out_begin[t] + i] = a.slots[a.slot_begin[t] + pos];
    }
  }
  for (int i = keep + tid; i < a.k; i += kTopkThreads) {
    out[i] = -1;
    out_s[i] = detail::neg_inf();
  }
}

template <int KS>
cudaError_t launch_scores(const DsaIndexArgs& a, dim3 grid, cudaStream_t stream) {
  dsa_scores_kernel<KS><<<grid, 32 * ((a.heads + 15) / 16), 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

namespace raw {

cudaError_t dsa_index_topk(const DsaIndexArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  if (a.max_visible > 0) {
    int dev = 0, sms = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
    const int tiles = (a.max_visible + kTile - 1) / kTile;
    const int per_row = max(1, min(tiles, (sms * kCtasPerSm + a.rows - 1) / a.rows));
    const dim3 grid(static_cast<unsigned>(per_row), static_cast<unsigned>(a.rows));
    switch ((a.dim + 15) / 16) {
      case 1:
        e = launch_scores<1>(a, grid, stream);
        break;
      case 2:
        e = launch_scores<2>(a, grid, stream);
        break;
      case 3:
        e = launch_scores<3>(a, grid, stream);
        break;
      case 4:
        e = launch_scores<4>(a, grid, stream);
        break;
      case 5:
        e = launch_scores<5>(a, grid, stream);
        break;
      case 6:
        e = launch_scores<6>(a, grid, stream);
        break;
      case 7:
        e = launch_scores<7>(a, grid, stream);
        break;
      case 8:
        e = launch_scores<8>(a, grid, stream);
        break;
      default:
        return cudaErrorInvalidValue;
    }
    if (e != cudaSuccess) return e;
  }
  dsa_topk_kernel<<<static_cast<unsigned>(a.rows), kTopkThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace raw
}  // namespace pagoda::kernels::cuda
