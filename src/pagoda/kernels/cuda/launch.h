#pragma once
/// Host entry points of the CUDA attention kernels. Each returns a Status (never throws) and
/// enqueues on `stream`; none allocates, so all are CUDA-graph capturable.

#include <cuda_runtime_api.h>

#include "pagoda/core/dtype.h"
#include "pagoda/core/status.h"
#include "pagoda/kernels/cuda/attention_params.h"
#include "pagoda/kernels/cuda/dsa_indexer.h"
#include "pagoda/kernels/cuda/linear_params.h"
#include "pagoda/kernels/cuda/move_rows.h"

namespace pagoda::kernels::cuda {

/// The kernels' element type of a float DType (f32/f16/bf16/fp8); false for others.
bool to_elem_type(DType t, ElemType& out);

/// True when the tuned kernels have an instantiation for these dtypes / head dims:
/// q = out in {bf16, f16}; kv = q's dtype or fp8 e4m3; Dqk == Dv in {64, 128, 256}.
bool fast_path_supported(DType q, DType kv, DType out, int head_dim_qk, int head_dim_v);

/// Tensor-core (mma.sync m16n8k16) split-KV paged decode over the work items, one block per (item,
/// kv head, 16 q heads); one query row per request; partial states go to
/// the workspace and need launch_merge afterwards when counts[2] > 0.
Status launch_decode(const AttentionArgs& args, cudaStream_t stream);
/// True when the MLA decode kernel serves this absorbed-MLA shape (q/out bf16, latent bf16 or fp8
/// e4m3, Hkv 1, Dqk 576, Dv 512, enough opt-in shared memory on the current device). Whether
/// to use it is the plan's choice (KernelOptions::mla_decode).
bool mla_decode_usable(DType q, DType kv, DType out, int num_kv_heads, int head_dim_qk,
                       int head_dim_v);
/// q heads per MLA decode block on the current device (the split-KV planner's unit) with the
/// plan's variants: 64 (16 at Hq <= 16 with v.mla_sm90_small) where the Hopper kernel runs
/// (sm_90a, bf16 or e4m3 latent, any page size, v.mla_sm90), else mla_decode_heads_per_block(Hq).
int mla_decode_block_heads(DType q, DType kv, DType out, int num_qo_heads,
                           const CudaLaunchVariants& v);
/// Split-KV paged MLA decode (absorbed form): one block per (work item,
/// mla_decode_block_heads() q heads): the Hopper wgmma kernel (mla_decode_sm90_kernel.cuh) where
/// it runs, else the tensor-core mma.sync kernel (mla_decode_kernel.cuh). The latent row [576] is
/// K and its first 512 columns are V (args.v is not read). One query row per request; partials
/// need launch_merge like launch_decode. kUnsupported for any other shape.
Status launch_mla_decode(const AttentionArgs& args, cudaStream_t stream);
/// True when the Hopper prefill kernel (prefill_sm90_kernel) serves these dtypes / head dims on
/// the current device with the plan's variants: sm_90 with the sm_90a image built, q = kv = out
/// in {bf16, f16}, Dqk == Dv in {64, 128, 256} or 192 / 128; with v.sm90_overlap also kv e4m3
/// at Dqk = Dv = 128. A prefill plan that uses it (the plan's
/// choice: KernelOptions::sm90_prefill) sets AttentionArgs::prefill_sm90 (items:
/// prefill_rows_per_tile).
bool prefill_sm90_serves(DType q, DType kv, DType out, int head_dim_qk, int head_dim_v,
                         const CudaLaunchVariants& v = {});
/// Paged flash attention over ragged queries (extend, prefill, tree verify, mixed): the sm90
/// kernel when args.prefill_sm90 (kUnsupported when it cannot run here), else the mma.sync
/// m16n8k16 kernel; work items of prefill_rows_per_tile(D, args.prefill_sm90) packed q rows.
Status launch_prefill(const AttentionArgs& args, cudaStream_t stream);
/// Any dtype / head dim up to 1024 (MLA 576/512, f32, e5m2 ...): one warp per (row, q head).
Status launch_generic(const AttentionArgs& args, cudaStream_t stream);
/// Merges split-KV partial states of requests with more than one chunk (sinks applied here).
Status launch_merge(const AttentionArgs& args, cudaStream_t stream);
/// Writes new tokens' K or V into a paged cache.
Status launch_append_kv(const AppendArgs& args, cudaStream_t stream);
/// Row moves in device buffers (move_rows.h): kInvalidArgument for negative sizes, null pointers
/// with work to do or a grid past CUDA's limits; kInternal when a launch fails.
Status launch_move_rows(const MoveRowsArgs& args, cudaStream_t stream);
/// A row gather (move_rows.h GatherRowsArgs): kInvalidArgument for negative sizes or null
/// pointers with work to do; kInternal when the launch fails.
Status launch_gather_rows(const GatherRowsArgs& args, cudaStream_t stream);
/// The DSA indexer's scores and top-k (dsa_indexer.h): kInvalidArgument for sizes out of range
/// (k, heads, dim < 1, rows > 65535, rows x max_visible past int32, an index row not a whole
/// number of words), null pointers with work to do; kUnsupported past the kernels' limits (dim
/// over 128 or not a multiple of 4, over 128 heads, k over 4,096), naming them; kInternal when a
/// launch fails.
Status launch_dsa_index_topk(const DsaIndexArgs& args, cudaStream_t stream);

/// The Mamba2 recurrence of one layer (linear_params.h: conv, token scan, chunked SSD scan):
/// kInvalidArgument for bad sizes, a null pointer with work to do, a conv kernel wider than
/// kConvRows + 1, a bad tile or chunk count, or more than 65535 sequences or heads; kInternal
/// when a launch fails. Shared memory (linear_scan_smem_bytes,
/// and ssd_chunk_smem_bytes when the plan has chunks) is the caller's check.
Status launch_linear_recurrence(const LinearRecurrenceArgs& args, cudaStream_t stream);

/// Resident decode blocks per SM for the given config (for the split-KV planner).
int decode_blocks_per_sm(DType q, DType kv, int head_dim);

}  // namespace pagoda::kernels::cuda
