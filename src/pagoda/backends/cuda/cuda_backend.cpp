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
  ragged_attn_.reset();
  if (own_stream_) (void)cudaStreamDestroy(stream_);
}

BackendCapabilities CudaBackend::static_capabilities() {
  BackendCapabilities c = full_feature_capabilities();
  c.cuda_graph = true;
  c.dsa = true;  // sparse MLA on the gather plan (cuda_backend.h), eager steps
  c.dsa_indexer = true;  // f32 scores + a stable segmented sort (kernels/cuda/dsa_indexer.h)
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
  ragged_.reset();
  ragged_planned_.reset();
  if (ctx_.kv_pool->config().index_head_dim > 0) {
    indexer_ = build_indexer_metadata(batch, *ctx_.req_to_token);
    upload_indexer_metadata();
  }
}

void CudaBackend::upload_indexer_metadata() {
  const IndexerMetadata& m = *indexer_;
  const size_t rows = m.row_request.size();
  const int tree = m.tree_size;
  // Per row: where its request's slots start and how many positions it sees.
  std::vector<int32_t> slot_begin(rows), seen(rows);
  for (size_t t = 0; t < rows; ++t) {
    slot_begin[t] = m.slot_indptr[static_cast<size_t>(m.row_request[t])];
    seen[t] = row_seen(m, static_cast<int64_t>(t));
  }
  cuda::AlignedRegions r;
  index_meta_.slots = r.add(m.slots.size() * 4);
  index_meta_.visible = r.add(rows * 4);
  index_meta_.slot_begin = r.add(rows * 4);
  index_meta_.seen = r.add(rows * 4);
  index_meta_.tree_begin = r.add(tree > 0 ? rows * 4 : 0);
  index_meta_.tree_bits = r.add(tree > 0 ? rows * tree : 0);
  if (index_meta_.buffer.bytes() < r.total) index_meta_.buffer.reset(r.total);
  auto* base = static_cast<unsigned char*>(index_meta_.buffer.get());
  auto upload = [&](size_t at, const void* src, size_t bytes) {
    if (bytes > 0)
      cuda::cuda_check(cudaMemcpyAsync(base + at, src, bytes, cudaMemcpyHostToDevice, stream_),
                       "cudaMemcpyAsync(indexer metadata)");
  };
  upload(index_meta_.slots, m.slots.data(), m.slots.size() * 4);
  upload(index_meta_.visible, m.row_visible.data(), rows * 4);
  upload(index_meta_.slot_begin, slot_begin.data(), rows * 4);
  upload(index_meta_.seen, seen.data(), rows * 4);
  if (tree > 0) {
    upload(index_meta_.tree_begin, m.row_tree_begin.data(), rows * 4);
    upload(index_meta_.tree_bits, m.row_tree_bits.data(), rows * tree);
  }
}

namespace {

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  cuda::cuda_check(cudaStreamIsCapturing(stream, &cs), "cudaStreamIsCapturing");
  return cs != cudaStreamCaptureStatusNone;
}

}  // namespace

void CudaBackend::set_sparse_topk(std::span<const int32_t> topk, int k) {
  PAGODA_REQUIRE(indexer_.has_value(), kFailedPrecondition,
                 "backend 'cuda': set_sparse_topk without indexer metadata (the pool has no index "
                 "keys, or init_forward_metadata was not called)");
  PAGODA_REQUIRE(!capturing(stream_), kFailedPrecondition,
                 "backend 'cuda': DeepSeek sparse attention runs eagerly, not in a CUDA graph");
  sparse_plan_ = sparse_gather_plan(*indexer_, topk, k);
  sparse_next_ = true;
  sparse_on_device_ = false;
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

const RaggedPlan& CudaBackend::ragged(const ForwardBatch& batch) {
  if (ragged_) return *ragged_;
  PAGODA_REQUIRE(!capturing(stream_), kFailedPrecondition,
                 "backend 'cuda': ragged attention runs eagerly, not in a CUDA graph");
  RaggedPlan r = build_ragged_plan(batch, *ctx_.req_to_token);
  const size_t bytes = std::max<size_t>(r.slots.size(), 1) * 4;
  if (ragged_slots_.bytes() < bytes) ragged_slots_.reset(bytes);
  if (!r.slots.empty())
    cuda::cuda_check(cudaMemcpyAsync(ragged_slots_.get(), r.slots.data(), r.slots.size() * 4,
                                     cudaMemcpyHostToDevice, stream_),
                     "cudaMemcpyAsync(ragged slots)");
  ragged_ = std::move(r);
  return *ragged_;
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
                            const TensorView& k_out, const TensorView& v_out) {
  require_planned(batch, "gather_kv");
  const kv::KvPool& pool = *ctx_.kv_pool;
  const RaggedPlan& r = ragged(batch);
  const auto n = static_cast<int64_t>(r.slots.size());
  check_gather_outputs(pool, layer.layer_id, n, k_out, v_out, "backend 'cuda' gather_kv");
  PAGODA_REQUIRE(n <= 0x7fffffff, kOutOfRange, "backend 'cuda': gather_kv of {} rows", n);
  auto gather = [&](const TensorView& cache, int64_t row_elems, const TensorView& out) {
    kernels::cuda::GatherRowsArgs a;
    a.src = static_cast<const unsigned char*>(cache.data());
    a.row_bytes = row_elems * static_cast<int64_t>(dtype_size(cache.dtype()));
    a.rows = static_cast<const int32_t*>(ragged_slots_.get());
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
                                 const TensorView& out) {
  require_planned(batch, "forward_ragged");
  PAGODA_REQUIRE(!sparse_next_, kFailedPrecondition,
                 "backend 'cuda': forward_ragged after a DSA selection (sparse attention reads "
                 "the pool: use forward)");
  const RaggedPlan& r = ragged(batch);
  const RaggedRun run = ragged_run(layer, q, k, v, out, static_cast<int64_t>(r.slots.size()),
                                   "backend 'cuda'");
  if (!ragged_attn_) ragged_attn_ = std::make_unique<cuda::CudaBatchAttention>(stream_, kernels_);
  if (ragged_planned_ != run.shape) {
    ragged_attn_->plan(r.plan.input(), run.shape);
    ragged_planned_ = run.shape;
  }
  ragged_attn_->run(q, as_token_pages(k), as_token_pages(v), out, TensorView(), run.params);
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
  if (!sparse && (shape_ != shape)) {
    PAGODA_REQUIRE(!capturing(stream_), kFailedPrecondition,
                   "layer {} has a shape the captured plan was not made for; run one eager "
                   "forward of this shape before capturing", layer.layer_id);
    attn_->plan(plan_.input(), shape);
    shape_ = shape;
    sparse_planned_.reset();
  }
  last_shape_ = shape;
  PAGODA_REQUIRE(q.rank() == 3 && q.size(0) == batch.num_tokens(), kInvalidArgument,
                 "q {} does not have {} rows", q.describe(), batch.num_tokens());
  // The append reads the step's out_cache_loc, which a re-plan keeps (the arena's regions).
  if (save == SaveKv::kYes && batch.num_tokens() > 0) append_kv(layer, k, v, batch.num_tokens());
  if (sparse) {  // this layer's selection; a dense forward after it re-plans the dense plan
    PAGODA_REQUIRE(!capturing(stream_), kFailedPrecondition,
                   "backend 'cuda': DeepSeek sparse attention runs eagerly, not in a CUDA graph");
    if (!sparse_on_device_) {
      attn_->plan(sparse_plan_.input(), shape);
      sparse_planned_.reset();
    } else if (sparse_planned_ != shape) {
      // The step's one sparse plan: every layer's selected slots are written in its place.
      attn_->plan_with_device_indices(sparse_shape_.input(), shape, sparse_slots());
      sparse_planned_ = shape;
    }
    shape_.reset();
  }
  // Sparse plans are token-granular (page size 1).
  const PagedCacheViews views = paged_cache_views(pool, layer, sparse ? 1 : plan_.page_size);
  attn_->run(q, views.k, views.v, out, lse, run_params_for(layer));
}

void CudaBackend::select_index_topk(LayerId layer, const IndexerQuery& q, int k,
                                    std::span<int32_t> topk, std::span<float> scores) {
  check_indexer_call(q, k, topk.size(), scores.size());
  index_topk(layer, q, k, topk, scores, nullptr);
}

void CudaBackend::apply_index_topk(LayerId layer, const IndexerQuery& q, int k) {
  check_indexer_call(q, k, indexer_ ? indexer_->row_request.size() * static_cast<size_t>(k) : 0, 0);
  const IndexerMetadata& m = *indexer_;
  if (sparse_shape_k_ != k) {  // the step's sparse plan for this k, its kv_indptr on the device
    sparse_shape_ = sparse_gather_shape(m, k);
    sparse_shape_k_ = k;
    sparse_planned_.reset();
    const size_t rows = m.row_request.size(), total = sparse_shape_.kv_indices.size();
    const size_t bytes = (rows + 1 + std::max<size_t>(total, 1)) * 4;
    if (sparse_device_.bytes() < bytes) sparse_device_.reset(bytes);
    cuda::cuda_check(cudaMemcpyAsync(sparse_device_.get(), sparse_shape_.kv_indptr.data(),
                                     (rows + 1) * 4, cudaMemcpyHostToDevice, stream_),
                     "cudaMemcpyAsync(sparse kv_indptr)");
  }
  index_topk(layer, q, k, {}, {}, static_cast<const int32_t*>(sparse_device_.get()));
  sparse_next_ = true;
  sparse_on_device_ = true;
}

int32_t* CudaBackend::sparse_slots() {
  return static_cast<int32_t*>(sparse_device_.get()) + indexer_->row_request.size() + 1;
}

void CudaBackend::check_indexer_call(const IndexerQuery& q, int k, size_t topk_size,
                                     size_t scores_size) const {
  PAGODA_REQUIRE(indexer_.has_value(), kFailedPrecondition,
                 "backend 'cuda': the DSA indexer without indexer metadata (the pool has no "
                 "index keys, or init_forward_metadata was not called)");
  PAGODA_REQUIRE(!capturing(stream_), kFailedPrecondition,
                 "backend 'cuda': the DSA indexer runs eagerly, not in a CUDA graph");
  check_index_query(*ctx_.kv_pool, *indexer_, q, k, topk_size, scores_size, ctx_.kv_pool->device());
}

void CudaBackend::index_topk(LayerId layer, const IndexerQuery& q, int k, std::span<int32_t> topk,
                             std::span<float> scores, const int32_t* slot_out_begin) {
  const kv::KvPool& pool = *ctx_.kv_pool;
  const IndexerMetadata& m = *indexer_;
  const bool q_on_device = q.device.is_cuda();  // the CUDA ops' indexer: read in place
  const int rows = static_cast<int>(m.row_request.size());
  if (rows == 0) return;
  const int maxv = m.max_visible, heads = q.heads, dim = q.dim;
  // Rows in chunks of at most 2^24 scores (4 bytes each of scratch) and 65535 rows.
  const int chunk = std::max(1, std::min({rows, 65535, (1 << 24) / std::max(maxv, 1)}));
  cuda::AlignedRegions r;
  const size_t o_q = r.add(q_on_device ? 0 : size_t(chunk) * heads * dim * 4),
               o_w = r.add(q_on_device ? 0 : size_t(chunk) * heads * 4),
               o_scores = r.add(size_t(chunk) * maxv * 4), o_topk = r.add(size_t(chunk) * k * 4),
               o_topk_scores = r.add(size_t(chunk) * k * 4);
  if (index_scratch_.bytes() < r.total) index_scratch_.reset(r.total);
  auto* base = static_cast<unsigned char*>(index_scratch_.get());
  const auto* meta = static_cast<const unsigned char*>(index_meta_.buffer.get());
  auto upload = [&](size_t at, const void* src, size_t bytes) {
    if (bytes > 0)
      cuda::cuda_check(cudaMemcpyAsync(base + at, src, bytes, cudaMemcpyHostToDevice, stream_),
                       "cudaMemcpyAsync(indexer)");
  };
  auto meta_at = [&](size_t region, int r0) {
    return reinterpret_cast<const int32_t*>(meta + region) + r0;
  };
  const size_t host_out = slot_out_begin != nullptr ? 0 : static_cast<size_t>(chunk) * k;
  std::vector<int32_t> out_topk(host_out);
  std::vector<float> out_scores(host_out);
  for (int r0 = 0; r0 < rows; r0 += chunk) {
    const int n = std::min(chunk, rows - r0);
    if (!q_on_device) {
      upload(o_q, q.q + size_t(r0) * heads * dim, size_t(n) * heads * dim * 4);
      upload(o_w, q.w + size_t(r0) * heads, size_t(n) * heads * 4);
    }
    kernels::cuda::DsaIndexArgs a;
    a.index_rows = static_cast<const unsigned char*>(pool.index_data(layer));
    a.row_bytes = pool.index_row_bytes();
    a.page_size = plan_.page_size;  // page-granular rows are page-contiguous (build_paged_plan)
    a.dim = dim;
    a.heads = heads;
    a.rows = n;
    a.max_visible = maxv;
    a.k = k;
    a.q = q_on_device ? q.q + size_t(r0) * heads * dim : reinterpret_cast<const float*>(base + o_q);
    a.w = q_on_device ? q.w + size_t(r0) * heads : reinterpret_cast<const float*>(base + o_w);
    a.visible = meta_at(index_meta_.visible, r0);
    a.slot_begin = meta_at(index_meta_.slot_begin, r0);
    a.slots = meta_at(index_meta_.slots, 0);
    a.seen = meta_at(index_meta_.seen, r0);
    a.tree_size = m.tree_size;
    a.tree_begin = meta_at(index_meta_.tree_begin, r0);
    a.tree_bits = meta + index_meta_.tree_bits + size_t(r0) * m.tree_size;
    a.scores = reinterpret_cast<float*>(base + o_scores);
    a.topk = reinterpret_cast<int32_t*>(base + o_topk);
    a.topk_scores = reinterpret_cast<float*>(base + o_topk_scores);
    if (slot_out_begin != nullptr) {
      a.slot_out = sparse_slots();
      a.slot_out_begin = slot_out_begin + r0;
    }
    const Status st = kernels::cuda::launch_dsa_index_topk(a, stream_);
    if (!st.is_ok()) throw_error(st.code(), "backend 'cuda': DSA indexer: {}", st.message());
    if (slot_out_begin != nullptr) continue;  // the selection stays on the device
    cuda::cuda_check(cudaMemcpyAsync(out_topk.data(), a.topk, size_t(n) * k * 4,
                                     cudaMemcpyDeviceToHost, stream_),
                     "cudaMemcpyAsync(indexer top-k)");
    cuda::cuda_check(cudaMemcpyAsync(out_scores.data(), a.topk_scores, size_t(n) * k * 4,
                                     cudaMemcpyDeviceToHost, stream_),
                     "cudaMemcpyAsync(indexer scores)");
    cuda::cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(indexer)");
    std::copy_n(out_topk.begin(), size_t(n) * k, topk.begin() + size_t(r0) * k);
    if (!scores.empty())
      std::copy_n(out_scores.begin(), size_t(n) * k, scores.begin() + size_t(r0) * k);
  }
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
