#pragma once
/// Split-KV paged decode mainloop (CUDA cores, GQA head groups, cp.async pipeline).
///
/// One block = one work item (request, kv chunk) x one kv head x up to kDecodeMaxGroup q heads.
/// 128 threads form groups of D/8 lanes; each lane owns 8 consecutive dims, each group owns
/// whole tokens. Every thread cp.asyncs exactly the 16 (8 for fp8) bytes it later reads, so
/// the multi-stage pipeline needs no block barrier; the page ids of the stage after next are
/// loaded into registers one iteration ahead (page size 1 costs the same as page size 16).

#include <type_traits>

#include "pagoda/kernels/cuda/device_utils.cuh"

namespace pagoda::kernels::cuda::detail {

template <typename T, typename KV, int D>
struct DecodeConfig {
  static constexpr int kThreads = 128;
  static constexpr int kLanes = D / 8;
  static constexpr int kGroups = kThreads / kLanes;
  static constexpr int kTpg = 2;                          // tokens per group per stage
  static constexpr int kTile = kGroups * kTpg;            // tokens per stage
  static constexpr int kStages = sizeof(KV) == 1 ? 12 : 6;
  static constexpr int kG = kDecodeMaxGroup;
  static constexpr size_t kPipeBytes = size_t(kStages) * kTile * D * sizeof(KV) * 2;
  static constexpr size_t kReduceBytes = size_t(kGroups) * kG * (D + 2) * sizeof(float);
  static constexpr size_t kSmemBytes = kPipeBytes > kReduceBytes ? kPipeBytes : kReduceBytes;
};

template <typename T, typename KV, int D>
__global__ void __launch_bounds__(128) decode_kernel(AttentionArgs a, LogitTransform xf) {
  using Cfg = DecodeConfig<T, KV, D>;
  using V8 = Vec8<KV>;
  using Raw = typename V8::Raw;
  extern __shared__ __align__(16) unsigned char smem[];

  const DevicePlan& plan = a.plan;
  const int item = blockIdx.x;
  if (item >= plan.counts[1]) return;
  const int b = plan.item_req[item];
  int kv_lo = plan.item_a[item];
  const int kv_hi = plan.item_b[item];
  const int partial = plan.item_partial[item];
  const int kv_len = kv_len_of(plan, b, a.page_size);
  if (a.window_left >= 0) kv_lo = max(kv_lo, kv_len - 1 - a.window_left);
  const int n = max(kv_hi - kv_lo, 0);

  const int hkv = blockIdx.y;
  const int group_size = a.num_qo_heads / a.num_kv_heads;
  const int g0 = blockIdx.z * Cfg::kG;
  const int ng = min(Cfg::kG, group_size - g0);
  const int head0 = hkv * group_size + g0;
  const int grp = threadIdx.x / Cfg::kLanes;
  const int lane = threadIdx.x % Cfg::kLanes;
  const int row = plan.qo_indptr[b];
  const int32_t* pages = plan.kv_indices + plan.kv_indptr[b];

  float q[Cfg::kG][8];
#pragma unroll
  for (int g = 0; g < Cfg::kG; ++g) {
#pragma unroll
    for (int e = 0; e < 8; ++e) q[g][e] = 0.f;
    if (g < ng) {
      const T* qp = static_cast<const T*>(a.q) + row * a.q_stride_n + (head0 + g) * a.q_stride_h +
                    lane * 8;
      const uint4 raw = *reinterpret_cast<const uint4*>(qp);
      Vec8<T>::unpack(raw, q[g]);
    }
  }

  KV* ks = reinterpret_cast<KV*>(smem);
  KV* vs = ks + Cfg::kStages * Cfg::kTile * D;
  const KV* kbase = static_cast<const KV*>(a.k.data) + hkv * a.k.head_stride + lane * 8;
  const KV* vbase = static_cast<const KV*>(a.v.data) + hkv * a.v.head_stride + lane * 8;
  const int ps = a.page_size;
  const int ntiles = (n + Cfg::kTile - 1) / Cfg::kTile;

  // page id of each of this thread's tokens in `tile` (0 when out of range)
  auto load_pages = [&](int tile, int (&pg)[Cfg::kTpg]) {
#pragma unroll
    for (int j = 0; j < Cfg::kTpg; ++j) {
      const int t = tile * Cfg::kTile + j * Cfg::kGroups + grp;
      pg[j] = (tile < ntiles && t < n) ? __ldg(pages + (kv_lo + t) / ps) : 0;
    }
  };
  auto issue = [&](int tile, const int (&pg)[Cfg::kTpg]) {
    const int stage = tile % Cfg::kStages;
#pragma unroll
    for (int j = 0; j < Cfg::kTpg; ++j) {
      const int tt = j * Cfg::kGroups + grp;
      const int t = tile * Cfg::kTile + tt;
      const bool ok = t < n;
      const int off = (kv_lo + t) % ps;
      const KV* kp = ok ? kbase + pg[j] * a.k.page_stride + off * a.k.token_stride : kbase;
      const KV* vp = ok ? vbase + pg[j] * a.v.page_stride + off * a.v.token_stride : vbase;
      KV* kd = ks + (stage * Cfg::kTile + tt) * D + lane * 8;
      KV* vd = vs + (stage * Cfg::kTile + tt) * D + lane * 8;
      if constexpr (sizeof(KV) == 2) {
        cp_async16(kd, kp, ok);
        cp_async16(vd, vp, ok);
      } else {
        cp_async8(kd, kp, ok);
        cp_async8(vd, vp, ok);
      }
    }
  };

  float m[Cfg::kG], l[Cfg::kG], acc[Cfg::kG][8];
#pragma unroll
  for (int g = 0; g < Cfg::kG; ++g) {
    m[g] = neg_inf();
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.f;
  }

  int pg[Cfg::kTpg];
#pragma unroll
  for (int s = 0; s < Cfg::kStages - 1; ++s) {
    if (s < ntiles) {
      load_pages(s, pg);
      issue(s, pg);
    }
    cp_async_commit();
  }
  load_pages(Cfg::kStages - 1, pg);

  for (int i = 0; i < ntiles; ++i) {
    const int nxt = i + Cfg::kStages - 1;
    if (nxt < ntiles) issue(nxt, pg);
    cp_async_commit();
    load_pages(nxt + 1, pg);
    cp_async_wait<Cfg::kStages - 1>();

    const int stage = i % Cfg::kStages;
    float s[Cfg::kTpg][Cfg::kG];
#pragma unroll
    for (int j = 0; j < Cfg::kTpg; ++j) {
      const int tt = j * Cfg::kGroups + grp;
      const bool ok = i * Cfg::kTile + tt < n;
      float kf[8];
      V8::unpack(*reinterpret_cast<const Raw*>(ks + (stage * Cfg::kTile + tt) * D + lane * 8),
                 kf);
#pragma unroll
      for (int g = 0; g < Cfg::kG; ++g) {
        float d = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) d = fmaf(q[g][e], kf[e], d);
#pragma unroll
        for (int o = Cfg::kLanes / 2; o > 0; o /= 2) d += __shfl_xor_sync(0xffffffffu, d, o);
        s[j][g] = ok ? xf(d) : neg_inf();
      }
    }
#pragma unroll
    for (int g = 0; g < Cfg::kG; ++g) {
      float mx = m[g];
#pragma unroll
      for (int j = 0; j < Cfg::kTpg; ++j) mx = fmaxf(mx, s[j][g]);
      const float scale = exp2_diff(m[g], mx);
      m[g] = mx;
      l[g] *= scale;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] *= scale;
#pragma unroll
      for (int j = 0; j < Cfg::kTpg; ++j) {
        s[j][g] = exp2_diff(s[j][g], mx);
        l[g] += s[j][g];
      }
    }
#pragma unroll
    for (int j = 0; j < Cfg::kTpg; ++j) {
      const int tt = j * Cfg::kGroups + grp;
      float vf[8];
      V8::unpack(*reinterpret_cast<const Raw*>(vs + (stage * Cfg::kTile + tt) * D + lane * 8),
                 vf);
#pragma unroll
      for (int g = 0; g < Cfg::kG; ++g) {
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(s[j][g], vf[e], acc[g][e]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  // Cross-group reduction in shared memory (reuses the pipeline buffers).
  float* red = reinterpret_cast<float*>(smem);                 // [kGroups][kG][D]
  float* ml = red + Cfg::kGroups * Cfg::kG * D;                // [kGroups][kG][2]
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < Cfg::kG; ++g) {
      ml[(grp * Cfg::kG + g) * 2] = m[g];
      ml[(grp * Cfg::kG + g) * 2 + 1] = l[g];
    }
  }
  __syncthreads();
#pragma unroll
  for (int g = 0; g < Cfg::kG; ++g) {
    float mm = neg_inf();
    for (int r = 0; r < Cfg::kGroups; ++r) mm = fmaxf(mm, ml[(r * Cfg::kG + g) * 2]);
    const float f = exp2_diff(m[g], mm);
#pragma unroll
    for (int e = 0; e < 8; ++e) red[(grp * Cfg::kG + g) * D + lane * 8 + e] = acc[g][e] * f;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < ng * D; idx += Cfg::kThreads) {
    const int g = idx / D, d = idx % D;
    float mm = neg_inf();
    for (int r = 0; r < Cfg::kGroups; ++r) mm = fmaxf(mm, ml[(r * Cfg::kG + g) * 2]);
    float lsum = 0.f, o = 0.f;
    for (int r = 0; r < Cfg::kGroups; ++r) {
      lsum += ml[(r * Cfg::kG + g) * 2 + 1] * exp2_diff(ml[(r * Cfg::kG + g) * 2], mm);
      o += red[(r * Cfg::kG + g) * D + d];
    }
    const int head = head0 + g;
    if (partial < 0) {
      float lse;
      const float f = finalize_state(mm, lsum, a.sinks, head, a.v_scale, lse);
      T* op = static_cast<T*>(a.out) + row * a.o_stride_n + head * a.o_stride_h;
      if constexpr (std::is_same_v<T, __half>) {
        op[d] = __float2half_rn(o * f);
      } else {
        op[d] = __float2bfloat16_rn(o * f);
      }
      if (d == 0 && a.lse != nullptr) a.lse[row * a.lse_stride_n + head * a.lse_stride_h] = lse;
    } else {
      const bool empty = mm == neg_inf() || lsum <= 0.f;
      const size_t base = (size_t(partial) * a.num_qo_heads + head);
      a.partial_o[base * D + d] = empty ? 0.f : o / lsum * a.v_scale;
      if (d == 0) a.partial_lse[base] = empty ? neg_inf() : mm + log2f(lsum);
    }
  }
}

}  // namespace pagoda::kernels::cuda::detail
