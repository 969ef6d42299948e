#pragma once
/// Device helpers shared by the CUDA attention kernels: element conversion, cp.async, ldmatrix,
/// mma.sync wrappers, the visibility predicate and the softmax finaliser.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "pagoda/kernels/cuda/attention_params.h"
#include "pagoda/kernels/cuda/mask_rows.h"
#include "pagoda/kernels/cuda/pdl.cuh"

namespace pagoda::kernels::cuda::detail {

inline constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

/// Lazy rescaling threshold of the online softmax (base 2), shared by the prefill and decode
/// kernels: the running max only moves when a logit exceeds it by more than this, so
/// p <= 2^8 stays well inside bf16 / f32 range.
constexpr float kLazyRescale = 8.f;

/// fp8 e4m3 storage tag (one byte).
struct E4M3 {
  uint8_t bits;
};

// ---- scalar conversion -------------------------------------------------------------------
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(E4M3 x) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(x.bits, __NV_E4M3)));
}

/// Loads element `i` of a tensor of runtime dtype `t` as f32 (generic paths only).
__device__ __forceinline__ float load_any(const void* p, int64_t i, ElemType t) {
  switch (t) {
    case ElemType::kF32: return static_cast<const float*>(p)[i];
    case ElemType::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    case ElemType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case ElemType::kE4M3:
      return __half2float(
          __half(__nv_cvt_fp8_to_halfraw(static_cast<const uint8_t*>(p)[i], __NV_E4M3)));
    case ElemType::kE5M2:
      return __half2float(
          __half(__nv_cvt_fp8_to_halfraw(static_cast<const uint8_t*>(p)[i], __NV_E5M2)));
    default: return 0.f;
  }
}

/// Stores f32 `x` as element `i` of a tensor of runtime dtype `t` (fp8 saturates).
__device__ __forceinline__ void store_any(void* p, int64_t i, ElemType t, float x) {
  switch (t) {
    case ElemType::kF32: static_cast<float*>(p)[i] = x; break;
    case ElemType::kF16: static_cast<__half*>(p)[i] = __float2half_rn(x); break;
    case ElemType::kBF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x); break;
    case ElemType::kE4M3:
      static_cast<uint8_t*>(p)[i] = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
      break;
    case ElemType::kE5M2:
      static_cast<uint8_t*>(p)[i] = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
      break;
    default: break;
  }
}

// ---- 8-element vectors -------------------------------------------------------------------
/// Unpacks 8 consecutive elements held in registers (16 bytes for 16-bit types, 8 for fp8).
template <typename KV>
struct Vec8;
template <>
struct Vec8<__nv_bfloat16> {
  using Raw = uint4;
  __device__ __forceinline__ static void unpack(const Raw& r, float (&f)[8]) {
    const auto* h = reinterpret_cast<const __nv_bfloat162*>(&r);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 x = __bfloat1622float2(h[i]);
      f[2 * i] = x.x;
      f[2 * i + 1] = x.y;
    }
  }
};
template <>
struct Vec8<__half> {
  using Raw = uint4;
  __device__ __forceinline__ static void unpack(const Raw& r, float (&f)[8]) {
    const auto* h = reinterpret_cast<const __half2*>(&r);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 x = __half22float2(h[i]);
      f[2 * i] = x.x;
      f[2 * i + 1] = x.y;
    }
  }
};
template <>
struct Vec8<E4M3> {
  using Raw = uint2;
  __device__ __forceinline__ static void unpack(const Raw& r, float (&f)[8]) {
    const auto* b = reinterpret_cast<const __nv_fp8x2_storage_t*>(&r);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __half2 h(__nv_cvt_fp8x2_to_halfraw2(b[i], __NV_E4M3));
      const float2 x = __half22float2(h);
      f[2 * i] = x.x;
      f[2 * i + 1] = x.y;
    }
  }
};

/// Packs two floats into one 32-bit register of T2.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float a, float b) {
  __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&h);
}

/// Widens two e4m3 bytes (in bits 8-15 and 24-31 of w) to two T values with integer ops and one
/// packed multiply: e4m3's sign/exponent/mantissa are placed into T's fields (exponent bias 7
/// instead of T's), then 2^(bias_T - 7) restores the value. Exact for every finite e4m3 value
/// (subnormals included; checked against cuda_fp8 for all 254 finite codes); the two NaN codes
/// come out finite. Avoids the f32 round trip, whose conversions run at 16/clk/SM on Hopper.
template <typename T>
__device__ __forceinline__ uint32_t widen2(uint32_t w);
template <>
__device__ __forceinline__ uint32_t widen2<__nv_bfloat16>(uint32_t w) {
  const uint32_t r = (w & 0x80008000u) | ((w >> 4) & 0x07F007F0u);
  __nv_bfloat162 x = *reinterpret_cast<const __nv_bfloat162*>(&r);
  const __nv_bfloat162 k = __halves2bfloat162(__ushort_as_bfloat16(0x7B80),
                                              __ushort_as_bfloat16(0x7B80));  // 2^120
  x = __hmul2(x, k);
  return *reinterpret_cast<uint32_t*>(&x);
}
template <>
__device__ __forceinline__ uint32_t widen2<__half>(uint32_t w) {
  const uint32_t r = (w & 0x80008000u) | ((w >> 1) & 0x3F803F80u);
  __half2 x = *reinterpret_cast<const __half2*>(&r);
  const __half2 k = __halves2half2(__ushort_as_half(0x5C00), __ushort_as_half(0x5C00));  // 2^8
  x = __hmul2(x, k);
  return *reinterpret_cast<uint32_t*>(&x);
}

/// Widens 16 e4m3 bytes to 16 T values (two 16-byte chunks, element order kept).
template <typename T>
__device__ __forceinline__ void widen16(const uint4& raw, uint4& lo, uint4& hi) {
  const uint32_t* x = reinterpret_cast<const uint32_t*>(&raw);
  uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = widen2<T>(__byte_perm(x[i], 0u, 0x1404));      // bytes 0, 1 -> bits 8, 24
    out[2 * i + 1] = widen2<T>(__byte_perm(x[i], 0u, 0x3424));  // bytes 2, 3
  }
  lo = make_uint4(out[0], out[1], out[2], out[3]);
  hi = make_uint4(out[4], out[5], out[6], out[7]);
}

// ---- async copies / matrix instructions --------------------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
/// 16 bytes of shared memory at a shared-window address (volatile, ordered as a memory access).
__device__ __forceinline__ void ld_shared16(uint32_t addr, uint4& v) {
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void st_shared16(uint32_t addr, const uint4& v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}
/// 16-byte cp.async (L2 only); zero-fills when !pred.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)),
               "l"(gmem), "r"(pred ? 16 : 0));
}
/// 8-byte cp.async; zero-fills when !pred.
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_addr(smem)),
               "l"(gmem), "r"(pred ? 8 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem)));
}

/// d += a * b with m16n8k16, f32 accumulation.
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                        uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float (&d)[4], const uint32_t (&a)[4],
                                                 uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- masks and softmax -------------------------------------------------------------------
/// Number of keys of request b.
__device__ __forceinline__ int kv_len_of(const DevicePlan& p, int b, int page_size) {
  const int pages = p.kv_indptr[b + 1] - p.kv_indptr[b];
  return pages == 0 ? 0 : (pages - 1) * page_size + p.kv_last_page_len[b];
}

/// A split-KV decode work item as the kernels read it: request b, its first key kv_lo (the
/// sliding window applied), the number of keys n of the chunk, and the partial slot (-1: write
/// the output).
struct DecodeItem {
  int b, kv_lo, n, partial;
};
/// Reads work item `item` of the plan; false when it is past counts[1] (the block has no work).
__device__ __forceinline__ bool load_decode_item(const AttentionArgs& a, int item, DecodeItem& w) {
  const DevicePlan& plan = a.plan;
  if (item >= plan.counts[1]) return false;
  w.b = plan.item_req[item];
  w.kv_lo = plan.item_a[item];
  const int kv_hi = plan.item_b[item];
  w.partial = plan.item_partial[item];
  const int kv_len = kv_len_of(plan, w.b, a.page_size);
  if (a.window_left >= 0) w.kv_lo = max(w.kv_lo, kv_len - 1 - a.window_left);
  w.n = max(kv_hi - w.kv_lo, 0);
  return true;
}

/// Work item and head block of an MLA decode block: the grid is 1-D, grid_items x nhb blocks,
/// and the nhb head blocks of one item are adjacent (x = item * nhb + hb), so the blocks that read
/// one latent chunk run at the same time and share it through L2.
__device__ __forceinline__ void mla_block_coords(int nhb, int& item, int& hb) {
  const int x = static_cast<int>(blockIdx.x);
  item = x / nhb;
  hb = x % nhb;
}

/// exp2 that maps (-inf) - (-inf) to 0 instead of NaN.
__device__ __forceinline__ float exp2_diff(float a, float m) {
  return m == neg_inf() ? 0.f : exp2f(a - m);
}

/// Scales raw q·k (already multiplied by k_scale) into a base-2 logit.
struct LogitTransform {
  float scale_log2;   ///< sm_scale * log2(e), when no cap
  float cap;          ///< soft cap (0 = none)
  float pre;          ///< sm_scale / cap
  float post;         ///< cap * log2(e)
  __device__ __forceinline__ float operator()(float x) const {
    return cap > 0.f ? post * tanhf(x * pre) : x * scale_log2;
  }
};
/// Transforms the logits of a 16-key S tile held as two m16n8 C fragments (this lane's keys
/// key0 + 8j + 2 (lane % 4) + {0, 1}); keys >= n become -inf.
__device__ __forceinline__ void transform_logits16(float (&s)[2][4], int key0, int n, int quad,
                                                   const LogitTransform& xf) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key0 + j * 8 + quad * 2 + (e & 1);
      s[j][e] = key < n ? xf(s[j][e]) : neg_inf();
    }
  }
}
inline LogitTransform make_logit_transform(float sm_scale, float cap, float k_scale) {
  LogitTransform t{};
  t.scale_log2 = sm_scale * k_scale * kLog2e;
  t.cap = cap;
  t.pre = cap > 0.f ? sm_scale * k_scale / cap : 0.f;
  t.post = cap * kLog2e;
  return t;
}

/// The tuned attention kernels' launch: kernel(args, logit transform of args) on `grid` x
/// `threads` with `smem` bytes of dynamic shared memory (opted in first), through launch_pdl
/// (every such kernel calls pdl_wait() before touching memory). Returns the first error.
template <typename Kernel>
cudaError_t launch_attention(Kernel kernel, dim3 grid, int threads, size_t smem,
                             const AttentionArgs& args, cudaStream_t stream) {
  const cudaError_t st = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (st != cudaSuccess) return st;
  return launch_pdl(kernel, grid, dim3(threads), smem, stream, args,
                    make_logit_transform(args.sm_scale, args.logit_cap, args.k_scale));
}

/// Folds an optional sink (natural-log logit) into a state (m, l) in base 2; returns the factor
/// that multiplies the unnormalised accumulator and sets lse. Factor 0 / lse -inf when empty.
__device__ __forceinline__ float finalize_state(float m, float l, const float* sinks, int head,
                                                float v_scale, float& lse) {
  float sink2 = neg_inf();
  if (sinks != nullptr) sink2 = sinks[head] * kLog2e;
  const float mm = fmaxf(m, sink2);
  if (mm == neg_inf() || l <= 0.f) {
    lse = neg_inf();
    return 0.f;
  }
  const float a = exp2_diff(m, mm);
  const float total = l * a + exp2_diff(sink2, mm);
  lse = mm + log2f(total);
  return a / total * v_scale;
}

}  // namespace pagoda::kernels::cuda::detail
