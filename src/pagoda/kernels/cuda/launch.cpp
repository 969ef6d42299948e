#include "pagoda/kernels/cuda/launch.h"

#include <string>

#include "pagoda/kernels/cuda/launch_raw.h"

namespace pagoda::kernels::cuda {
namespace {

Status to_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::ok();
  if (e == cudaErrorNotSupported) {
    return Status(ErrorCode::kUnsupported, std::string(what) + ": no kernel for this shape");
  }
  return Status(ErrorCode::kInternal, std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace

bool to_elem_type(DType t, ElemType& out) {
  switch (t) {
    case DType::kF32: out = ElemType::kF32; return true;
    case DType::kF16: out = ElemType::kF16; return true;
    case DType::kBF16: out = ElemType::kBF16; return true;
    case DType::kFp8E4M3: out = ElemType::kE4M3; return true;
    case DType::kFp8E5M2: out = ElemType::kE5M2; return true;
    default: return false;
  }
}

bool fast_path_supported(DType q, DType kv, DType out, int head_dim_qk, int head_dim_v) {
  ElemType eq{}, ekv{};
  if (out != q || head_dim_qk != head_dim_v) return false;
  if (!to_elem_type(q, eq) || !to_elem_type(kv, ekv)) return false;
  return raw::fast_path(eq, ekv, head_dim_qk);
}

int decode_blocks_per_sm(DType q, DType kv, int head_dim) {
  ElemType eq{}, ekv{};
  if (!to_elem_type(q, eq) || !to_elem_type(kv, ekv)) return 1;
  return raw::decode_blocks_per_sm(eq, ekv, head_dim);
}

Status launch_decode(const AttentionArgs& a, cudaStream_t s) {
  return to_status(raw::decode(a, s), "decode launch");
}
bool mla_decode_usable(DType q, DType kv, DType out, int num_kv_heads, int head_dim_qk,
                       int head_dim_v) {
  ElemType eq{}, ekv{}, eo{};
  if (!to_elem_type(q, eq) || !to_elem_type(kv, ekv) || !to_elem_type(out, eo)) return false;
  return raw::mla_decode_supported(eq, ekv, eo, num_kv_heads, head_dim_qk, head_dim_v);
}
int mla_decode_block_heads(DType q, DType kv, DType out, int num_qo_heads,
                           const CudaLaunchVariants& v) {
  ElemType eq{}, ekv{}, eo{};
  if (!to_elem_type(q, eq) || !to_elem_type(kv, ekv) || !to_elem_type(out, eo)) {
    return mla_decode_heads_per_block(num_qo_heads);
  }
  return raw::mla_decode_block_heads(eq, ekv, eo, num_qo_heads, v);
}
Status launch_mla_decode(const AttentionArgs& a, cudaStream_t s) {
  return to_status(raw::mla_decode(a, s), "MLA decode launch");
}
bool prefill_sm90_serves(DType q, DType kv, DType out, int head_dim_qk, int head_dim_v,
                         const CudaLaunchVariants& v) {
  ElemType eq{}, ekv{};
  if (out != q || !to_elem_type(q, eq) || !to_elem_type(kv, ekv)) return false;
  return raw::prefill_sm90_supported(eq, ekv, head_dim_qk, head_dim_v, v);
}
Status launch_prefill(const AttentionArgs& a, cudaStream_t s) {
  return to_status(raw::prefill(a, s), "prefill launch");
}
Status launch_generic(const AttentionArgs& a, cudaStream_t s) {
  if (a.head_dim_qk > 1024 || a.head_dim_v > 1024) {
    return Status(ErrorCode::kUnsupported, "generic CUDA attention supports head dims <= 1024");
  }
  return to_status(raw::generic(a, s), "generic attention launch");
}
Status launch_merge(const AttentionArgs& a, cudaStream_t s) {
  return to_status(raw::merge(a, s), "merge-state launch");
}
Status launch_append_kv(const AppendArgs& a, cudaStream_t s) {
  return to_status(raw::append_kv(a, s), "KV append launch");
}
Status launch_move_rows(const MoveRowsArgs& a, cudaStream_t s) {
  if (a.num_bases < 0 || a.num_pairs < 0 || a.row_bytes < 0)
    return Status(ErrorCode::kInvalidArgument, "move_rows: negative size");
  if (a.num_bases == 0 || a.num_pairs == 0 || a.row_bytes == 0) return Status();
  if (a.bases == nullptr || a.src == nullptr || a.dst == nullptr || a.scratch == nullptr)
    return Status(ErrorCode::kInvalidArgument, "move_rows: null device pointer");
  if (a.num_pairs > 0x7fffffff || a.num_bases > 65535)
    return Status(ErrorCode::kInvalidArgument, "move_rows: more than 65535 buffers");
  return to_status(raw::move_rows(a, s), "move_rows launch");
}

Status launch_gather_rows(const GatherRowsArgs& a, cudaStream_t s) {
  if (a.n < 0 || a.row_bytes < 0)
    return Status(ErrorCode::kInvalidArgument, "gather_rows: negative size");
  if (a.n == 0 || a.row_bytes == 0) return Status();
  if (a.src == nullptr || a.rows == nullptr || a.dst == nullptr)
    return Status(ErrorCode::kInvalidArgument, "gather_rows: null device pointer");
  return to_status(raw::gather_rows(a, s), "gather_rows launch");
}

Status launch_dsa_index_topk(const DsaIndexArgs& a, cudaStream_t s) {
  if (a.rows < 0 || a.max_visible < 0 || a.k < 1 || a.heads < 1 || a.dim < 1 || a.page_size < 1 ||
      a.row_bytes < a.dim + 4 || a.row_bytes % 4 != 0)
    return Status(ErrorCode::kInvalidArgument, "dsa_index_topk: bad sizes");
  if (a.dim > kDsaMaxDim || a.dim % 4 != 0 || a.heads > kDsaMaxHeads || a.k > kDsaMaxTopk)
    return Status(ErrorCode::kUnsupported,
                  "dsa_index_topk: index_head_dim " + std::to_string(a.dim) + " (a multiple of " +
                      "4 up to " + std::to_string(kDsaMaxDim) + "), " + std::to_string(a.heads) +
                      " index heads (up to " + std::to_string(kDsaMaxHeads) + "), top-k " +
                      std::to_string(a.k) + " (up to " + std::to_string(kDsaMaxTopk) + ")");
  if (a.rows == 0) return Status();
  if (a.rows > 65535 || int64_t{a.rows} * a.max_visible > 0x7fffffff)
    return Status(ErrorCode::kInvalidArgument,
                  "dsa_index_topk: more than 65535 rows or 2^31 scores in one launch");
  if (a.index_rows == nullptr || a.q == nullptr || a.w == nullptr || a.visible == nullptr ||
      a.page_begin == nullptr || a.pages == nullptr || a.seen == nullptr || a.scores == nullptr ||
      a.topk == nullptr || a.topk_scores == nullptr ||
      (a.tree_size > 0 && (a.tree_begin == nullptr || a.tree_bits == nullptr)) ||
      (a.slot_out != nullptr && a.slot_out_begin == nullptr))
    return Status(ErrorCode::kInvalidArgument, "dsa_index_topk: null device pointer");
  return to_status(raw::dsa_index_topk(a, s), "dsa_index_topk launch");
}

Status launch_linear_recurrence(const LinearRecurrenceArgs& a, cudaStream_t s) {
  if (a.num_seqs < 0)
    return Status(ErrorCode::kInvalidArgument, "linear recurrence: negative size");
  if (a.num_seqs == 0) return Status();
  if (a.num_heads < 1 || a.head_dim < 1 || a.state_size < 1 || a.num_groups < 1 ||
      a.num_heads % a.num_groups != 0 || a.conv_kernel < 1)
    return Status(ErrorCode::kInvalidArgument, "linear recurrence: bad layer sizes");
  if (a.num_seqs > 65535 || a.num_heads > 65535)
    return Status(ErrorCode::kInvalidArgument,
                  "linear recurrence: more than 65535 sequences or heads in one launch");
  if (a.xbc == nullptr || a.dt == nullptr || a.y == nullptr || a.act == nullptr ||
      a.conv == nullptr || a.dt_bias == nullptr || a.a_log == nullptr || a.d == nullptr ||
      a.states == nullptr || a.seq_slot == nullptr || a.seq_start == nullptr ||
      a.seq_nodes == nullptr || a.seq_tile == nullptr || a.seq_chunk == nullptr ||
      (a.num_chunks > 0 && a.chunk_states == nullptr))
    return Status(ErrorCode::kInvalidArgument, "linear recurrence: null device pointer");
  if (a.conv_kernel - 1 > kConvRows || a.num_tiles < a.num_seqs || a.num_chunks < 0)
    return Status(ErrorCode::kInvalidArgument,
                  "linear recurrence: a conv kernel wider than kConvRows + 1, fewer conv tiles "
                  "than sequences or a negative chunk count");
  return to_status(raw::linear_recurrence(a, s), "linear recurrence launch");
}

}  // namespace pagoda::kernels::cuda
