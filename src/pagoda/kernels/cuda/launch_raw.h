#pragma once
/// Raw launchers compiled by nvcc (no pagoda core headers: nvcc's host pass cannot compile fmt).
/// Each returns the CUDA error of its launch; launch.h wraps them into Status.

#include <cuda_runtime_api.h>

#include "pagoda/kernels/cuda/attention_params.h"

namespace pagoda::kernels::cuda::raw {

/// cudaErrorNotSupported when no instantiation matches.
cudaError_t decode(const AttentionArgs& args, cudaStream_t stream);
cudaError_t prefill(const AttentionArgs& args, cudaStream_t stream);
/// The Hopper prefill (prefill_sm90_kernel) runs these types on the current device: sm_90 with
/// the sm_90a image built, Q and KV share a 16-bit type, Dqk == Dv in {64, 128, 256} or
/// 192 / 128; with v.sm90_overlap also e4m3 KV at D 128. prefill() runs it
/// when args.prefill_sm90.
bool prefill_sm90_supported(ElemType q, ElemType kv, int head_dim_qk, int head_dim_v,
                            const CudaLaunchVariants& v);
cudaError_t prefill_sm90(const AttentionArgs& args, cudaStream_t stream);
cudaError_t generic(const AttentionArgs& args, cudaStream_t stream);
cudaError_t merge(const AttentionArgs& args, cudaStream_t stream);
cudaError_t append_kv(const AppendArgs& args, cudaStream_t stream);
bool fast_path(ElemType q, ElemType kv, int head_dim);
/// MLA decode (mla_decode_kernel.cuh): q/out bf16, latent bf16 or e4m3, Hkv 1, 576/512, and the
/// device's opt-in shared memory holds the kernel's buffers.
bool mla_decode_supported(ElemType q, ElemType kv, ElemType out, int num_kv_heads,
                          int head_dim_qk, int head_dim_v);
/// Runs mla_decode_sm90_kernel when mla_decode_sm90_chosen(), else mla_decode_kernel.
cudaError_t mla_decode(const AttentionArgs& args, cudaStream_t stream);
/// The Hopper MLA decode (mla_decode_sm90_kernel.cuh) serves this shape on the current device:
/// sm_90 with the sm_90a image built, q / out bf16 and a bf16 or e4m3 latent (any Hq; any page
/// size), and `v.mla_sm90`. The other MLA checks (mla_decode_supported) still apply.
bool mla_decode_sm90_chosen(ElemType q, ElemType kv, ElemType out, const CudaLaunchVariants& v);
/// q heads per block of the Hopper MLA decode: 16 for Hq <= 16 (the transposed kernel,
/// mla_decode_sm90_small_kernel.cuh) when `v.mla_sm90_small`, else 64 (the live heads first).
/// The planner and the launcher both ask it with the plan's variants.
int mla_decode_sm90_block_heads(int num_qo_heads, const CudaLaunchVariants& v);
cudaError_t mla_decode_sm90(const AttentionArgs& args, cudaStream_t stream);
/// q heads per MLA decode block for this shape on this device: mla_decode_sm90_block_heads()
/// when mla_decode_sm90_chosen(), else mla_decode_heads_per_block(Hq) (the planner sizes its
/// split-KV chunks with it).
int mla_decode_block_heads(ElemType q, ElemType kv, ElemType out, int num_qo_heads,
                           const CudaLaunchVariants& v);
int decode_blocks_per_sm(ElemType q, ElemType kv, int head_dim);

}  // namespace pagoda::kernels::cuda::raw
