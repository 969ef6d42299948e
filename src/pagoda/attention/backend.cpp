#include "pagoda/attention/backend.h"

#include <vector>

#include "pagoda/attention/dsa.h"
#include "pagoda/core/error.h"

namespace pagoda::attention {

void AttentionBackend::forward(const TensorView& q, const TensorView& k, const TensorView& v,
                               const AttentionLayer& layer, const ForwardBatch& batch,
                               const TensorView& out, SaveKv save) {
  switch (batch.mode) {
    case ForwardMode::kIdle:
      return;
    case ForwardMode::kDecode:
      forward_decode(q, k, v, layer, batch, out, save);
      return;
    case ForwardMode::kExtend:
    case ForwardMode::kMixed:
    case ForwardMode::kTargetVerify:
    case ForwardMode::kDraftExtend:
      forward_extend(q, k, v, layer, batch, out, save);
      return;
  }
  throw_error(ErrorCode::kInvalidArgument, "unknown forward mode {}",
              static_cast<int>(batch.mode));
}

void AttentionBackend::set_sparse_topk(std::span<const int32_t> topk, int k) {
  throw_error(ErrorCode::kUnsupported,
              "backend '{}' has no DeepSeek sparse attention (no indexer metadata hook or sparse "
              "MLA; {} top-k entries of k {} refused); use 'reference' or 'cpu'",
              name(), topk.size(), k);
}

void AttentionBackend::select_index_topk(LayerId layer, const IndexerQuery& /*q*/, int k,
                                         std::span<int32_t> /*topk*/, std::span<float> /*scores*/) {
  throw_error(ErrorCode::kUnsupported,
              "backend '{}' has no DeepSeek sparse attention indexer (select_index_topk for "
              "layer {}, k {}); use 'reference' or 'cpu'",
              name(), layer.value(), k);
}

void AttentionBackend::apply_index_topk(LayerId layer, const IndexerQuery& q, int k) {
  const IndexerMetadata* meta = get_indexer_metadata();
  PAGODA_REQUIRE(meta != nullptr, kFailedPrecondition,
                 "backend '{}': apply_index_topk without indexer metadata (the pool has no index "
                 "keys, or init_forward_metadata was not called)",
                 name());
  PAGODA_REQUIRE(k >= 1, kInvalidArgument, "apply_index_topk: k {} must be >= 1", k);
  std::vector<int32_t> topk(meta->row_request.size() * static_cast<size_t>(k));
  select_index_topk(layer, q, k, topk, {});
  set_sparse_topk(topk, k);
}

void AttentionBackend::save_kv(const TensorView& /*k*/, const TensorView& /*v*/,
                               const AttentionLayer& layer, const ForwardBatch& batch) {
  throw_error(ErrorCode::kUnsupported,
              "backend '{}' has no ragged attention (save_kv of layer {}, {} tokens); use "
              "'reference', 'cpu' or 'cuda'",
              name(), layer.layer_id, batch.num_tokens());
}

void AttentionBackend::gather_kv(const AttentionLayer& layer, const ForwardBatch& batch,
                                 const KeyWindows& /*windows*/, const TensorView& /*k_out*/,
                                 const TensorView& /*v_out*/) {
  throw_error(ErrorCode::kUnsupported,
              "backend '{}' has no ragged attention (gather_kv of layer {}, {} requests); use "
              "'reference', 'cpu' or 'cuda'",
              name(), layer.layer_id, batch.batch_size);
}

void AttentionBackend::forward_ragged(const TensorView& /*q*/, const TensorView& /*k*/,
                                      const TensorView& /*v*/, const AttentionLayer& layer,
                                      const ForwardBatch& batch, const KeyWindows& /*windows*/,
                                      const TensorView& /*out*/, const TensorView& /*lse*/) {
  throw_error(ErrorCode::kUnsupported,
              "backend '{}' has no ragged attention (forward_ragged of layer {}, {} tokens); use "
              "'reference', 'cpu' or 'cuda'",
              name(), layer.layer_id, batch.num_tokens());
}

void AttentionBackend::init_cuda_graph_state(int max_bs, int max_num_tokens) {
  throw_error(ErrorCode::kUnsupported,
              "backend '{}' does not support CUDA graphs (init_cuda_graph_state({}, {})); use a "
              "backend whose capabilities().cuda_graph is true, e.g. 'cuda'",
              name(), max_bs, max_num_tokens);
}

void AttentionBackend::init_forward_metadata_capture_cuda_graph(const ForwardBatch& batch) {
  throw_error(ErrorCode::kUnsupported,
              "backend '{}' does not support CUDA-graph capture (mode {}, bs {})", name(),
              forward_mode_name(batch.mode), batch.batch_size);
}

void AttentionBackend::init_forward_metadata_replay_cuda_graph(const ForwardBatch& batch) {
  throw_error(ErrorCode::kUnsupported,
              "backend '{}' does not support CUDA-graph replay (mode {}, bs {})", name(),
              forward_mode_name(batch.mode), batch.batch_size);
}

}  // namespace pagoda::attention
