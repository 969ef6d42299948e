#pragma once
/// Raw launchers of the dense kernels of the bf16 (f16, f32) GPU-resident model path.
///
/// Activation dtype: every launcher takes an `ActDType` argument and untyped pointers (`void*`)
/// for the activation/weight arrays; the kernels are templates instantiated for f32, f16
/// (__half) and bf16 (__nv_bfloat16). Buffers typed `float*` are always f32 whatever the
/// activation dtype (the residual stream, RoPE inverse frequencies, f32 logits).
///
/// Plain types only: this header is compiled by nvcc, which cannot include pagoda's core headers
/// (fmt in C++20 mode). Each launcher enqueues on `stream` and returns the launch error
/// (cudaSuccess when there is nothing to do); none synchronizes or allocates, so all can be
/// captured into a CUDA graph. Arrays are row-major device memory and must not alias unless
/// stated. All math is f32 (compiled without --use_fast_math), with exactly one rounding to the
/// activation dtype per output element. Every kernel takes a 16-byte vectorised path when the
/// row lengths and pointers allow it (sizes multiple of 8 elements, 16-byte aligned pointers)
/// and a scalar path otherwise; both compute the same values.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pagoda::model::cuda_kernels {

/// Element type of activations and weights.
enum class ActDType : int32_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

/// Bytes per element of `t` (4 or 2).
inline int64_t act_dtype_size(ActDType t) { return t == ActDType::kF32 ? 4 : 2; }

/// What add_rms_norm does to the f32 residual stream before normalising it.
enum class ResidualOp : int32_t {
  kAssign = 0,  ///< residual = f32(x)      (first layer: x is the embedding)
  kAdd = 1,     ///< residual += f32(x)     (f32 add, one rounding)
};

/// out[t, :] = table[ids[t] - vocab_begin, :] for t in [0, rows); a bit copy (no conversion).
/// table [vocab_rows, hidden], out [rows, hidden], both `dtype`. Rows whose id is outside
/// [vocab_begin, vocab_begin + vocab_rows) are zeros (a vocabulary-parallel shard); vocab_rows < 0
/// means every id is in range. ids are trusted (checked on the host).
cudaError_t embed_rows(ActDType dtype, const void* table, const int32_t* ids, void* out,
                       int64_t rows, int64_t hidden, cudaStream_t stream, int64_t vocab_begin = 0,
                       int64_t vocab_rows = -1);

/// Fused residual add + RMSNorm, one block per row:
///   residual[t, :] = f32(x[t, :])                 (op == kAssign)
///   residual[t, :] = residual[t, :] + f32(x[t, :]) (op == kAdd, f32)
///   inv = 1 / sqrtf(sum(residual[t, :]^2) / hidden + eps)   (f32 sum, fixed-order reduction)
///   out[t, i] = round(residual[t, i] * inv * f32(weight[i]))  (f32 products, one rounding)
/// x, weight, out are `dtype` ([rows, hidden], [hidden], [rows, hidden]); residual is f32
/// [rows, hidden], read and written. out may alias x (each element is read before it is written
/// by the same thread); residual must not alias either. HF rounds residual * inv to the dtype
/// before the weight product; this rounds once.
cudaError_t add_rms_norm(ActDType dtype, const void* x, float* residual, const void* weight,
                         void* out, int64_t rows, int64_t hidden, float eps, ResidualOp op,
                         cudaStream_t stream);

/// Final norm on the selected rows only: out[t, :] = rmsnorm(residual[r, :]) * weight with
/// r = row_index[t] (or t when row_index is null), t in [0, rows), same math as add_rms_norm.
/// residual f32 [*, hidden] (not modified), weight [hidden] and out [rows, hidden] `dtype`.
cudaError_t rms_norm_rows(ActDType dtype, const float* residual, const int32_t* row_index,
                          const void* weight, void* out, int64_t rows, int64_t hidden, float eps,
                          cudaStream_t stream);

/// Splits the fused projection qkv [rows, (hq + 2 hkv) * head_dim] (`dtype`) into contiguous
/// q [rows, hq, d], k [rows, hkv, d], v [rows, hkv, d] (`dtype`), adding the optional bias
/// [(hq + 2 hkv) * d] (`dtype`, null = none; Qwen2) and applying HF's NeoX rotate_half RoPE to q
/// and k, all in f32 with one rounding per output:
///   a = f32(qkv[.., i]) + f32(bias[i]),  b = f32(qkv[.., i + d/2]) + f32(bias[i + d/2])
///   angle = f32(positions[t]) * inv_freq[i]   (f32 product; inv_freq f32 [d/2])
///   c, s = sincosf(angle)                     (precise libdevice, not __sinf/__cosf)
///   out[i] = round(a c - b s),  out[i + d/2] = round(b c + a s),  for i in [0, d/2)
///   v = round(f32(qkv) + f32(bias))            (a bit copy when bias is null)
/// head_dim must be even (64, 128, 256 take the vectorised path). HF computes the rotation in the
/// activation dtype with cos/sin rounded to it; this is the f32 version of the same formula.
cudaError_t qkv_bias_rope(ActDType dtype, const void* qkv, const void* bias,
                          const int32_t* positions, const float* inv_freq, void* q, void* k,
                          void* v, int64_t rows, int hq, int hkv, int head_dim,
                          cudaStream_t stream);

/// Destination of qkv_bias_rope_store's K/V rows: one layer of an MHA KV pool (kv_pool.h) whose
/// storage dtype equals the activation dtype (f32, f16, bf16; fp8 pools are not supported: the
/// caller falls back to qkv_bias_rope + the backend's append). Each buffer is
/// [num_slots, hkv, head_dim] (num_slots = (num_pages + 1) * page_size, page 0 included), so head
/// h of slot s starts at element (s * hkv + h) * head_dim. No scale is applied (the layer's
/// k_scale / v_scale must be 1).
struct KvCacheWrite {
  void* k_cache;                 ///< K buffer of the layer
  void* v_cache;                 ///< V buffer of the layer (head_dim_v == head_dim)
  const int32_t* out_cache_loc;  ///< [rows] device: the slot of token t
  int64_t num_slots;             ///< slots in each buffer
};

/// qkv_bias_rope with the KV-cache write fused in (one launch for q, k and v): the same math and
/// rounding, bit-identical outputs, but the rotated k row and the v row of token t are stored at
/// slot out_cache_loc[t] of cache.k_cache / cache.v_cache. q [rows, hq, d] is written as before.
/// k and v (contiguous [rows, hkv, d]) are optional: null skips them, non-null also receives the
/// rows (e.g. for a backend that still wants contiguous K/V for the current tokens).
/// Slot contract: slots are trusted to lie in [0, num_slots) (the scheduler guarantees it; slot 0
/// is the reserved dummy that padded CUDA-graph rows write to, so writes to it are normal); a
/// slot outside that range is skipped (nothing is written for that token's k/v, q still is), as
/// a guard, not an error report. Two tokens with the same slot (other than padding rows, whose
/// content nobody reads) are a caller bug; which one lands is unspecified.
/// Returns cudaErrorInvalidValue for a bad head_dim/head count (as qkv_bias_rope) or a null
/// cache pointer when there is something to write.
cudaError_t qkv_bias_rope_store(ActDType dtype, const void* qkv, const void* bias,
                                const int32_t* positions, const float* inv_freq, void* q, void* k,
                                void* v, const KvCacheWrite& cache, int64_t rows, int hq, int hkv,
                                int head_dim, cudaStream_t stream);

/// SwiGLU: out[t, i] = round(silu(g) * u) with g = f32(gate_up[t, i]), u = f32(gate_up[t, inter
/// + i]), silu(g) = g / (1 + expf(-g)), all f32, one rounding. gate_up [rows, 2 inter] and out
/// [rows, inter] are `dtype`. (HF/PyTorch rounds silu(g) to bf16 before the product; the two
/// differ by at most one bf16 ulp.)
cudaError_t silu_mul(ActDType dtype, const void* gate_up, void* out, int64_t rows, int64_t inter,
                     cudaStream_t stream);

/// out[j] = cap > 0 ? cap * tanhf(f32(in[j]) / cap) : f32(in[j]) for j in [0, n): the LM-head
/// output (`dtype`, e.g. bf16 [rows, vocab] flattened) to f32 logits with the optional final
/// soft cap (Gemma-2 style). With dtype kF32, in may equal out (in place).
cudaError_t logits_to_f32_softcap(ActDType dtype, const void* in, float* out, int64_t n,
                                  float cap, cudaStream_t stream);

/// In-place x = cap * tanhf(x / cap) on f32 logits (cap > 0; cap <= 0 does nothing).
cudaError_t soft_cap_inplace(float* x, int64_t n, float cap, cudaStream_t stream);

}  // namespace pagoda::model::cuda_kernels
