#include "pagoda/backends/cuda/cuda_backend.h"

#include <algorithm>

#include "pagoda/attention/dsa.h"
#include "pagoda/attention/host_paged_backend.h"
#include "pagoda/attention/kv_access.h"
#include "pagoda/core/error.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/kernels/cuda/launch.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/platform/cuda/cuda_platform.h"

namespace pagoda::backends {

using namespace pagoda::attention;

CudaBackend::CudaBackend(const BackendContext& ctx, const KernelOptions& kernels)
    : ctx_(ctx), kernels_(kernels) {
  PAGODA_REQUIRE(ctx.kv_pool != nullptr && ctx.req_to_token != nullptr, kInvalidArgument,
                 "backend 'cuda' needs a KvPool and a ReqToTokenTable in its BackendContext");
  PAGODA_REQUIRE(ctx.kv_pool->device().is_cuda(), kUnsupported,
                 "backend 'cuda' needs a KvPool on a CUDA device (pool is on {}); build the pool "
                 "with the CUDA platform's allocator, or use 'reference' / 'cpu'",
                 ctx.kv_pool->device().to_string());
  if (ctx.platform != nullptr && ctx.platform->native_stream() != nullptr) {
    stream_ = static_cast<cudaStream_t>(ctx.platform->native_stream());
  } else {
    cuda::cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                     "cudaStreamCreate");
    own_stream_ = true;
  }
  attn_ = std::make_unique<cuda::CudaBatchAttention>(stream_, kernels);
}

CudaBackend::~CudaBackend() {
  attn_.reset();
  sparse_attn_.reset();
  ragged_dev_.clear();
  if (own_stream_) (void)cudaStreamDestroy(stream_);
}

BackendCapabilities CudaBackend::static_capabilities() {
  BackendCapabilities c = full_feature_capabilities();
  c.cuda_graph = true;
  c.dsa = true;          // sparse MLA on the gather plan (cuda_backend.h), graphable decode
  c.dsa_indexer = true;  // tensor-core scores + a radix select (kernels/cuda/dsa_indexer.h)
  c.ragged = true;       // eager extend steps (cuda_backend.h)
  c.device = "cuda";
  return c;
}

const BackendCapabilities& CudaBackend::capabilities() const {
  static const BackendCapabilities caps = static_capabilities();
  return caps;
}

void CudaBackend::init_forward_metadata(const ForwardBatch& batch) {
  plan_step(batch, batch.out_cache_loc);
}

void CudaBackend::plan_step(const ForwardBatch& batch, std::span<const int32_t> cache_loc) {
  PagedPlan plan = build_paged_plan(batch, *ctx_.req_to_token, ctx_.kv_pool->page_size());
  if (last_shape_) attn_->plan(plan.input(), *last_shape_);
  attn_->upload_cache_loc(cache_loc);
  shape_ = last_shape_;
  plan_ = std::move(plan);
  planned_ = true;
  planned_mode_ = batch.mode;
  planned_tokens_ = batch.num_tokens();
  indexer_.reset();
  sparse_next_ = false;
  sparse_on_device_ = false;
  sparse_shape_k_ = 0;
  sparse_planned_.reset();
  ragged_.clear();
  if (ctx_.kv_pool->config().index_head_dim > 0) {
    // No per-token slots: the kernels read the page table (set_sparse_topk fills them).
    indexer_ = build_indexer_metadata(batch, *ctx_.req_to_token, /*slots=*/false);
    upload_indexer_metadata();
  }
}

bool CudaBackend::capturing() const {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  cuda::cuda_check(cudaStreamIsCapturing(stream_, &cs), "cudaStreamIsCapturing");
  return cs != cudaStreamCaptureStatusNone;
}

AttentionShape CudaBackend::shape_for(const AttentionLayer& layer, const TensorView& q,
                                      const TensorView& out) const {
  return AttentionShape{.num_qo_heads = layer.num_q_heads,
                        .num_kv_heads = layer.num_kv_heads,
                        .head_dim_qk = layer.head_dim_qk,
                        .head_dim_v = layer.head_dim_v,
                        .q_dtype = q.dtype(),
                        .kv_dtype = ctx_.kv_pool->config().dtype,
                        .out_dtype = out.dtype()};
}

void CudaBackend::append_kv(const AttentionLayer& layer, const TensorView& k, const TensorView& v,
                            int num_tokens) {
  kv::KvPool& pool = *ctx_.kv_pool;
  PAGODA_REQUIRE(layer.k_scale == pool.k_scale(layer.layer_id) &&
                     layer.v_scale == pool.v_scale(layer.layer_id),
                 kInvalidArgument, "layer {} scales ({}, {}) differ from the pool's ({}, {})",
                 layer.layer_id, layer.k_scale, layer.v_scale, pool.k_scale(layer.layer_id),
                 pool.v_scale(layer.layer_id));
  auto write = [&](const TensorView& src, const TensorView& cache, float scale, const char* what) {
    PAGODA_REQUIRE(src.device().is_cuda() && src.rank() == 3 && src.size(0) == num_tokens &&
                       src.size(1) == cache.size(2) && src.size(2) == cache.size(3) &&
                       src.stride(2) == 1,
                   kInvalidArgument, "new {} {} must be a CUDA [{}, {}, {}] view", what,
                   src.describe(), num_tokens, cache.size(2), cache.size(3));
    kernels::cuda::AppendArgs a;
    a.src = src.data();
    a.src_stride_n = src.stride(0);
    a.src_stride_h = src.stride(1);
    PAGODA_REQUIRE(kernels::cuda::to_elem_type(src.dtype(), a.src_dtype) &&
                       kernels::cuda::to_elem_type(cache.dtype(), a.cache_dtype),
                   kInvalidArgument, "KV append needs float dtypes ({} -> {})", src.dtype(),
                   cache.dtype());
    a.cache = cache.data();
    a.page_stride = cache.stride(0);
    a.token_stride = cache.stride(1);
    a.head_stride = cache.stride(2);
    a.loc = attn_->device_cache_loc();
    a.n = num_tokens;
    a.num_heads = static_cast<int>(cache.size(2));
    a.head_dim = static_cast<int>(cache.size(3));
    a.page_size = static_cast<int>(cache.size(1));
    a.scale = scale;
    platform::cuda_append_kv(a, stream_).throw_if_error();
  };
  write(k, pool.k_view(layer.layer_id), layer.k_scale, "k");
  if (!layer.is_mla) write(v, pool.v_view(layer.layer_id), layer.v_scale, "v");
}

void CudaBackend::require_planned(const ForwardBatch& batch, const char* what) const {
  PAGODA_REQUIRE(planned_ && planned_mode_ == batch.mode && planned_tokens_ == batch.num_tokens(),
                 kFailedPrecondition,
                 "backend 'cuda': {}({}, {} tokens) without init_forward_metadata for it", what,
                 forward_mode_name(batch.mode), batch.num_tokens());
}

size_t CudaBackend::ragged(const ForwardBatch& batch, const KeyWindows& windows) {
  PAGODA_REQUIRE(!capturing(), kFailedPrecondition,
                 "backend 'cuda': ragged attention runs eagerly, not in a CUDA graph");
  bool built = false;
  const size_t i = ragged_.find_or_build(batch, *ctx_.req_to_token, windows, built);
  if (i == ragged_dev_.size()) ragged_dev_.emplace_back();
  if (built) {
    RaggedDevice& d = ragged_dev_[i];
    const std::vector<int32_t>& slots = ragged_[i].slots;
    const size_t bytes = std::max<size_t>(slots.size(), 1) * 4;
    if (d.slots.bytes() < bytes) d.slots.reset(bytes);
    if (!slots.empty())
      cuda::cuda_check(cudaMemcpyAsync(d.slots.get(), slots.data(), slots.size() * 4,
                                       cudaMemcpyHostToDevice, stream_),
                       "cudaMemcpyAsync(ragged slots)");
    d.planned.reset();
  }
  return i;
}

void CudaBackend::save_kv(const TensorView& k, const TensorView& v, const AttentionLayer& layer,
                          const ForwardBatch& batch) {
  require_planned(batch, "save_kv");
  PAGODA_REQUIRE(layer.is_mla == (ctx_.kv_pool->config().layout == kv::KvLayout::kMla),
                 kInvalidArgument, "layer {} is {} but the pool is {}", layer.layer_id,
                 layer.is_mla ? "MLA" : "MHA", layer.is_mla ? "MHA" : "MLA");
  if (batch.num_tokens() > 0) append_kv(layer, k, v, batch.num_tokens());
}

void CudaBackend::gather_kv(const AttentionLayer& layer, const ForwardBatch& batch,
                            const KeyWindows& windows, const TensorView& k_out,
                            const TensorView& v_out) {
  require_planned(batch, "gather_kv");
  const kv::KvPool& pool = *ctx_.kv_pool;
  const size_t i = ragged(batch, windows);
  const auto n = static_cast<int64_t>(ragged_[i].slots.size());
  check_gather_outputs(pool, layer.layer_id, n, k_out, v_out, "backend 'cuda' gather_kv");
  PAGODA_REQUIRE(n <= 0x7fffffff, kOutOfRange, "backend 'cuda': gather_kv of {} rows", n);
  auto gather = [&](const TensorView& cache, int64_t row_elems, const TensorView& out) {
    kernels::cuda::GatherRowsArgs a;
    a.src = static_cast<const unsigned char*>(cache.data());
    a.row_bytes = row_elems * static_cast<int64_t>(dtype_size(cache.dtype()));
    a.rows = static_cast<const int32_t*>(ragged_dev_[i].slots.get());
    a.n = static_cast<int>(n);
    a.dst = static_cast<unsigned char*>(out.data());
    kernels::cuda::launch_gather_rows(a, stream_).throw_if_error();
  };
  gather(pool.k_view(layer.layer_id), pool.k_row_elems(), k_out);
  if (pool.config().layout != kv::KvLayout::kMla)
    gather(pool.v_view(layer.layer_id), pool.v_row_elems(), v_out);
}

void CudaBackend::forward_ragged(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const AttentionLayer& layer, const ForwardBatch& batch,
                                 const KeyWindows& windows, const TensorView& out,
                                 const TensorView& lse) {
  require_planned(batch, "forward_ragged");
  PAGODA_REQUIRE(!sparse_next_, kFailedPrecondition,
                 "backend 'cuda': forward_ragged after a DSA selection (sparse attention reads "
                 "the pool: use forward)");
  const size_t i = ragged(batch, windows);
  RaggedDevice& d = ragged_dev_[i];
  const RaggedRun run = ragged_run(layer, ragged_[i], q, k, v, out, "backend 'cuda'");
  if (!d.attn) d.attn = std::make_unique<cuda::CudaBatchAttention>(stream_, kernels_);
  if (d.planned != run.shape) {
    d.attn->plan(ragged_[i].plan.input(), run.shape);
    d.planned = run.shape;
  }
  d.attn->run(q, as_token_pages(k), as_token_pages(v), out, lse, run.params);
}

void CudaBackend::run(const TensorView& q, const TensorView& k, const TensorView& v,
                      const AttentionLayer& layer, const ForwardBatch& batch,
                      const TensorView& out, SaveKv save) {
  const TensorView lse = lse_;
  lse_ = TensorView();
  require_planned(batch, "forward");
  kv::KvPool& pool = *ctx_.kv_pool;
  PAGODA_REQUIRE(layer.is_mla == (pool.config().layout == kv::KvLayout::kMla), kInvalidArgument,
                 "layer {} is {} but the pool is {}", layer.layer_id, layer.is_mla ? "MLA" : "MHA",
                 layer.is_mla ? "MHA" : "MLA");
  const bool sparse = sparse_next_;
  sparse_next_ = false;  // a selection applies to one forward
  PAGODA_REQUIRE(!sparse || layer.sliding_window < 0, kUnsupported,
                 "backend 'cuda': DeepSeek sparse attention with a sliding window (layer {}, "
                 "window {}) is not implemented",
                 layer.layer_id, layer.sliding_window);
  const AttentionShape shape = shape_for(layer, q, out);
  last_shape_ = shape;
  PAGODA_REQUIRE(q.rank() == 3 && q.size(0) == batch.num_tokens(), kInvalidArgument,
                 "q {} does not have {} rows", q.describe(), batch.num_tokens());
  if (sparse) {  // this layer's selection, on sparse_attn_ (the dense plan stays in attn_)
    if (!sparse_on_device_) {
      PAGODA_REQUIRE(!capturing(), kFailedPrecondition,
                     "backend 'cuda': a host DSA selection (set_sparse_topk) in a CUDA graph");
      if (!sparse_attn_)
        sparse_attn_ = std::make_unique<cuda::CudaBatchAttention>(stream_, kernels_);
      sparse_attn_->plan(sparse_plan_.input(), shape);
      sparse_planned_.reset();
    } else if (sparse_planned_ != shape) {
      PAGODA_REQUIRE(!capturing(), kFailedPrecondition,
                     "layer {} has a shape the captured sparse plan was not made for",
                     layer.layer_id);
      plan_device_sparse(shape);
    }
  } else if (shape_ != shape) {
    PAGODA_REQUIRE(!capturing(), kFailedPrecondition,
                   "layer {} has a shape the captured plan was not made for; run one eager "
                   "forward of this shape before capturing",
                   layer.layer_id);
    attn_->plan(plan_.input(), shape);
    shape_ = shape;
  }
  // The append reads the step's out_cache_loc (attn_'s, which a re-plan keeps).
  if (save == SaveKv::kYes && batch.num_tokens() > 0) append_kv(layer, k, v, batch.num_tokens());
  // Sparse plans are token-granular (page size 1).
  const PagedCacheViews views = paged_cache_views(pool, layer, sparse ? 1 : plan_.page_size);
  (sparse ? *sparse_attn_ : *attn_).run(q, views.k, views.v, out, lse, run_params_for(layer));
}

void CudaBackend::forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const AttentionLayer& layer, const ForwardBatch& batch,
                                 const TensorView& out, SaveKv save) {
  run(q, k, v, layer, batch, out, save);
}

void CudaBackend::forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const AttentionLayer& layer, const ForwardBatch& batch,
                                 const TensorView& out, SaveKv save) {
  run(q, k, v, layer, batch, out, save);
}

void CudaBackend::init_cuda_graph_state(int max_bs, int max_num_tokens) {
  PAGODA_REQUIRE(max_bs > 0 && max_num_tokens > 0, kInvalidArgument,
                 "init_cuda_graph_state needs positive sizes, got {} / {}", max_bs, max_num_tokens);
  graph_max_bs_ = max_bs;
  graph_max_tokens_ = max_num_tokens;
}

void CudaBackend::init_forward_metadata_capture_cuda_graph(const ForwardBatch& batch) {
  PAGODA_REQUIRE(graph_max_bs_ > 0, kFailedPrecondition,
                 "init_cuda_graph_state must come before a capture");
  if (!attn_->graph_mode()) {
    PAGODA_REQUIRE(last_shape_.has_value(), kFailedPrecondition,
                   "backend 'cuda' needs one eager forward (to learn the layer shape) before the "
                   "first CUDA-graph capture");
    const int64_t ctx_len = ctx_.req_to_token->max_context_len();
    const int ps = ctx_.kv_pool->page_size();
    cuda::GraphCapacity cap;
    cap.max_batch_size = graph_max_bs_;
    cap.max_tokens = graph_max_tokens_;
    cap.max_pages = int64_t(graph_max_tokens_) * ((ctx_len + ps - 1) / ps + graph_max_tokens_);
    graph_max_pages_ = cap.max_pages;
    cap.max_mask_bytes = int64_t(graph_max_tokens_) * (ctx_len + graph_max_tokens_) / 8 + graph_max_bs_;
    attn_->enable_graph_mode(cap, *last_shape_);
  }
  plan_graph_step(batch);
}

void CudaBackend::init_forward_metadata_replay_cuda_graph(const ForwardBatch& batch) {
  plan_graph_step(batch);
}

void CudaBackend::plan_graph_step(const ForwardBatch& batch) {
  if (batch.mode != ForwardMode::kDraftExtend) {
    plan_step(batch, batch.out_cache_loc);
    plan_graph_sparse();
    return;
  }
  // A draft-extend graph keeps the prefill kernel it captured, whatever the accepted counts
  // (all ones would plan the decode kernel); its replay may carry fewer tokens than the capture,
  // so the append's rows past the batch's write the padding slot 0.
  std::vector<int32_t> loc(batch.out_cache_loc.begin(), batch.out_cache_loc.end());
  loc.resize(std::max(loc.size(), static_cast<size_t>(graph_max_tokens_)), 0);
  attn_->set_force_prefill(true);
  try {
    plan_step(batch, loc);
  } catch (...) {
    attn_->set_force_prefill(false);
    throw;
  }
  attn_->set_force_prefill(false);
}

void register_cuda_backend(BackendRegistry& registry, const KernelOptions& kernels) {
  registry.add("cuda",
               "NVIDIA GPU: split-KV decode, tensor-core prefill/extend, generic fallback "
               "(MLA, f32, e5m2), CUDA graphs",
               CudaBackend::static_capabilities(),
               [kernels](const BackendContext& ctx) {
                 return std::make_unique<CudaBackend>(ctx, kernels);
               });
}

}  // namespace pagoda::backends
