#include "pagoda/attention/host_paged_backend.h"

#include "pagoda/attention/kv_access.h"
#include "pagoda/core/error.h"
#include "pagoda/kv/kv_pool.h"

namespace pagoda::attention {
BackendCapabilities full_feature_capabilities() {
  BackendCapabilities c;
  c.q_dtypes = {DType::kF32, DType::kF16, DType::kBF16};
  c.kv_dtypes = {DType::kF32, DType::kF16, DType::kBF16, DType::kFp8E4M3, DType::kFp8E5M2};
  c.mla = true;
  c.sliding_window = true;
  c.logit_cap = true;
  c.sinks = true;
  c.non_causal = true;
  c.custom_mask = true;
  c.max_topk = 1 << 20;
  c.multi_step_draft = true;
  c.mixed_batches = true;
  c.cuda_graph = false;
  c.lse = true;
  c.dsa = true;
  c.dsa_indexer = true;
  c.ragged = true;
  c.device = "cpu";
  return c;
}

HostPagedBackend::HostPagedBackend(const BackendContext& ctx, std::string name,
                                   BackendCapabilities caps,
                                   std::unique_ptr<BatchAttention> attention,
                                   SparseAttentionPath sparse_path, IndexerFaults indexer_faults)
    : ctx_(ctx),
      name_(std::move(name)),
      who_(fmt::format("backend '{}'", name_)),
      caps_(std::move(caps)),
      attn_(std::move(attention)),
      sparse_path_(sparse_path),
      indexer_faults_(indexer_faults) {
  PAGODA_REQUIRE(ctx.kv_pool != nullptr && ctx.req_to_token != nullptr, kInvalidArgument,
                 "backend '{}' needs a KvPool and a ReqToTokenTable in its BackendContext", name_);
  PAGODA_REQUIRE(ctx.kv_pool->device().is_cpu(), kUnsupported,
                 "backend '{}' runs on host pools only (pool is on {}); use 'cuda'", name_,
                 ctx.kv_pool->device().to_string());
}

void HostPagedBackend::init_forward_metadata(const ForwardBatch& batch) {
  plan_ = build_paged_plan(batch, *ctx_.req_to_token, ctx_.kv_pool->page_size());
  planned_ = true;
  planned_shape_.reset();  // the BatchAttention is planned on the first layer of the step
  planned_mode_ = batch.mode;
  planned_tokens_ = batch.num_tokens();
  indexer_.reset();
  sparse_next_ = false;
  ragged_.clear();
  ragged_planned_.reset();
  if (ctx_.kv_pool->config().index_head_dim > 0)
    indexer_ = build_indexer_metadata(batch, *ctx_.req_to_token);
}

void HostPagedBackend::set_sparse_topk(std::span<const int32_t> topk, int k) {
  PAGODA_REQUIRE(indexer_.has_value(), kFailedPrecondition,
                 "backend '{}': set_sparse_topk without indexer metadata (the pool has no index "
                 "keys, or init_forward_metadata was not called)",
                 name_);
  if (sparse_path_ == SparseAttentionPath::kGather) {
    sparse_plan_ = sparse_gather_plan(*indexer_, topk, k);
  } else {
    PagedPlan masked = plan_;
    apply_sparse_mask(masked, *indexer_, topk, k);
    sparse_plan_ = std::move(masked);
  }
  sparse_next_ = true;
}

void HostPagedBackend::select_index_topk(LayerId layer, const IndexerQuery& q, int k,
                                         std::span<int32_t> topk, std::span<float> scores) {
  PAGODA_REQUIRE(indexer_.has_value(), kFailedPrecondition,
                 "backend '{}': select_index_topk without indexer metadata (the pool has no "
                 "index keys, or init_forward_metadata was not called)",
                 name_);
  index_topk_host(*ctx_.kv_pool, layer, *indexer_, q, k, topk, scores, indexer_faults_);
}

void HostPagedBackend::forward_extend(const TensorView& q, const TensorView& k,
                                      const TensorView& v, const AttentionLayer& layer,
                                      const ForwardBatch& batch, const TensorView& out,
                                      SaveKv save) {
  run(q, k, v, layer, batch, out, save);
}

void HostPagedBackend::forward_decode(const TensorView& q, const TensorView& k,
                                      const TensorView& v, const AttentionLayer& layer,
                                      const ForwardBatch& batch, const TensorView& out,
                                      SaveKv save) {
  run(q, k, v, layer, batch, out, save);
}

void HostPagedBackend::require_planned(const ForwardBatch& batch, const char* what) const {
  PAGODA_REQUIRE(planned_ && planned_mode_ == batch.mode && planned_tokens_ == batch.num_tokens(),
                 kFailedPrecondition,
                 "backend '{}': {}({}, {} tokens) without init_forward_metadata for it", name_,
                 what, forward_mode_name(batch.mode), batch.num_tokens());
}

size_t HostPagedBackend::ragged(const ForwardBatch& batch, const KeyWindows& windows) {
  bool built = false;
  return ragged_.find_or_build(batch, *ctx_.req_to_token, windows, built);
}

void HostPagedBackend::save_kv(const TensorView& k, const TensorView& v,
                               const AttentionLayer& layer, const ForwardBatch& batch) {
  require_planned(batch, "save_kv");
  save_new_kv(*ctx_.kv_pool, layer, batch, k, v);
}

void HostPagedBackend::gather_kv(const AttentionLayer& layer, const ForwardBatch& batch,
                                 const KeyWindows& windows, const TensorView& k_out,
                                 const TensorView& v_out) {
  require_planned(batch, "gather_kv");
  gather_pool_rows(*ctx_.kv_pool, layer.layer_id, ragged_[ragged(batch, windows)].slots, k_out,
                   v_out, who_);
}

void HostPagedBackend::forward_ragged(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const AttentionLayer& layer, const ForwardBatch& batch,
                                      const KeyWindows& windows, const TensorView& out,
                                      const TensorView& lse) {
  require_planned(batch, "forward_ragged");
  PAGODA_REQUIRE(!sparse_next_, kFailedPrecondition,
                 "backend '{}': forward_ragged after set_sparse_topk (sparse attention reads the "
                 "pool: use forward)",
                 name_);
  const size_t i = ragged(batch, windows);
  const RaggedRun run = ragged_run(layer, ragged_[i], q, k, v, out, who_);
  if (ragged_planned_ != std::pair(i, run.shape)) {  // once per plan and shape while unchanged
    attn_->plan(ragged_[i].plan.input(), run.shape);
    ragged_planned_ = std::pair(i, run.shape);
    planned_shape_.reset();  // the next forward plans the step's paged plan again
  }
  attn_->run(q, as_token_pages(k), as_token_pages(v), out, lse, run.params);
}

void HostPagedBackend::run(const TensorView& q, const TensorView& k, const TensorView& v,
                           const AttentionLayer& layer, const ForwardBatch& batch,
                           const TensorView& out, SaveKv save) {
  const TensorView lse = lse_;
  lse_ = TensorView();  // the LSE output applies to one forward only
  const bool sparse = sparse_next_;
  sparse_next_ = false;  // so does the sparse selection
  require_planned(batch, "forward");
  kv::KvPool& pool = *ctx_.kv_pool;
  PAGODA_REQUIRE(layer.is_mla == (pool.config().layout == kv::KvLayout::kMla), kInvalidArgument,
                 "layer {} is {} but the pool is {}", layer.layer_id, layer.is_mla ? "MLA" : "MHA",
                 layer.is_mla ? "MHA" : "MLA");
  PAGODA_REQUIRE(!layer.is_mla || layer.num_kv_heads == 1, kInvalidArgument,
                 "MLA layer {} must have one kv head, has {}", layer.layer_id, layer.num_kv_heads);
  const AttentionShape shape{.num_qo_heads = layer.num_q_heads,
                             .num_kv_heads = layer.num_kv_heads,
                             .head_dim_qk = layer.head_dim_qk,
                             .head_dim_v = layer.head_dim_v,
                             .q_dtype = q.dtype(),
                             .kv_dtype = pool.config().dtype,
                             .out_dtype = out.dtype()};
  PAGODA_REQUIRE(!sparse || layer.sliding_window < 0, kUnsupported,
                 "backend '{}': DeepSeek sparse attention with a sliding window (layer {}, window "
                 "{}) is not implemented",
                 name_, layer.layer_id, layer.sliding_window);
  if (sparse) {  // this layer's selection: plan it, and replan dense after it
    attn_->plan(sparse_plan_.input(), shape);
    planned_shape_.reset();
    ragged_planned_.reset();
  } else if (planned_shape_ != shape) {
    attn_->plan(plan_.input(), shape);
    planned_shape_ = shape;
    ragged_planned_.reset();
  }
  const PagedCacheViews views =
      paged_cache_views(pool, layer, sparse ? sparse_plan_.page_size : plan_.page_size);
  // Validate the run's tensors before mutating the pool, then write the new K/V, then attend.
  PAGODA_REQUIRE(q.rank() == 3 && q.size(0) == batch.num_tokens() &&
                     q.size(1) == layer.num_q_heads && q.size(2) == layer.head_dim_qk,
                 kInvalidArgument, "q {} is not [{}, {}, {}]", q.describe(), batch.num_tokens(),
                 layer.num_q_heads, layer.head_dim_qk);
  PAGODA_REQUIRE(out.rank() == 3 && out.size(0) == batch.num_tokens() &&
                     out.size(1) == layer.num_q_heads && out.size(2) == layer.head_dim_v,
                 kInvalidArgument, "out {} is not [{}, {}, {}]", out.describe(),
                 batch.num_tokens(), layer.num_q_heads, layer.head_dim_v);
  if (save == SaveKv::kYes) save_new_kv(pool, layer, batch, k, v);
  attn_->run(q, views.k, views.v, out, lse, run_params_for(layer));
}

}  // namespace pagoda::attention
