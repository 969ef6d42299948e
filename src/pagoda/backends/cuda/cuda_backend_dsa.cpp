// CudaBackend's DeepSeek sparse attention (cuda_backend.h): the step's indexer metadata on the
// device, the indexer's launches, the device sparse plan, and their CUDA-graph capacities.
#include <algorithm>

#include "pagoda/attention/dsa.h"
#include "pagoda/backends/cuda/cuda_backend.h"
#include "pagoda/core/error.h"
#include "pagoda/kernels/cuda/launch.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/kv/req_to_token.h"

namespace pagoda::backends {

using namespace pagoda::attention;

namespace {

/// Rows per indexer launch: at most 2^24 scores (4 bytes each of scratch) and 65535 rows.
int launch_rows(int64_t rows, int64_t stride) {
  return static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>({rows, 65535, (int64_t{1} << 24) / std::max<int64_t>(stride, 1)})));
}

}  // namespace

void CudaBackend::upload_indexer_metadata() {
  const IndexerMetadata& m = *indexer_;
  const size_t rows = m.row_request.size();
  const int tree = m.tree_size;
  const bool graph = attn_->graph_mode();
  const auto pages = static_cast<size_t>(plan_.kv_indptr.back());
  PAGODA_REQUIRE(!graph || (tree == 0 && rows <= static_cast<size_t>(graph_max_tokens_) &&
                            pages <= static_cast<size_t>(graph_max_pages_)),
                 kUnsupported,
                 "backend 'cuda': DeepSeek sparse attention in a CUDA graph runs steps of at most "
                 "{} rows and {} pages without a draft tree (this one: {} rows, {} pages, tree {})",
                 graph_max_tokens_, graph_max_pages_, rows, pages, tree);
  // Per row: where its request's page-table entries start and how many positions it sees.
  std::vector<int32_t> page_begin(rows), seen(rows);
  for (size_t t = 0; t < rows; ++t) {
    page_begin[t] = plan_.kv_indptr[static_cast<size_t>(m.row_request[t])];
    seen[t] = row_seen(m, static_cast<int64_t>(t));
  }
  if (!index_meta_.fixed) {  // graph mode: laid out once for the capacities
    const size_t cap_rows = graph ? static_cast<size_t>(graph_max_tokens_) : rows;
    const size_t cap_pages = graph ? static_cast<size_t>(graph_max_pages_) : pages;
    cuda::AlignedRegions r;
    index_meta_.pages = r.add(cap_pages * 4);
    index_meta_.page_begin = r.add(cap_rows * 4);
    index_meta_.visible = r.add(cap_rows * 4);
    index_meta_.seen = r.add(cap_rows * 4);
    index_meta_.tree_begin = r.add(tree > 0 ? rows * 4 : 0);
    index_meta_.tree_bits = r.add(tree > 0 ? rows * static_cast<size_t>(tree) : 0);
    if (index_meta_.buffer.bytes() < r.total) index_meta_.buffer.reset(r.total);
    index_meta_.fixed = graph;
  }
  auto* base = static_cast<unsigned char*>(index_meta_.buffer.get());
  auto upload = [&](size_t at, const void* src, size_t bytes) {
    if (bytes > 0)
      cuda::cuda_check(cudaMemcpyAsync(base + at, src, bytes, cudaMemcpyHostToDevice, stream_),
                       "cudaMemcpyAsync(indexer metadata)");
  };
  upload(index_meta_.pages, plan_.kv_indices.data(), pages * 4);
  upload(index_meta_.page_begin, page_begin.data(), rows * 4);
  upload(index_meta_.visible, m.row_visible.data(), rows * 4);
  upload(index_meta_.seen, seen.data(), rows * 4);
  if (tree > 0) {
    upload(index_meta_.tree_begin, m.row_tree_begin.data(), rows * 4);
    upload(index_meta_.tree_bits, m.row_tree_bits.data(), rows * static_cast<size_t>(tree));
  }
}

void CudaBackend::set_sparse_topk(std::span<const int32_t> topk, int k) {
  PAGODA_REQUIRE(indexer_.has_value(), kFailedPrecondition,
                 "backend 'cuda': set_sparse_topk without indexer metadata (the pool has no index "
                 "keys, or init_forward_metadata was not called)");
  PAGODA_REQUIRE(!capturing(), kFailedPrecondition,
                 "backend 'cuda': set_sparse_topk (a host selection) in a CUDA graph");
  if (indexer_->slot_indptr.empty()) fill_indexer_slots();
  sparse_plan_ = sparse_gather_plan(*indexer_, topk, k);
  sparse_next_ = true;
  sparse_on_device_ = false;
}

void CudaBackend::fill_indexer_slots() {
  IndexerMetadata& m = *indexer_;
  const int bs = plan_.batch_size();
  // Request b's keys: the longest of its rows' visible ranges (its last row sees them all).
  std::vector<int32_t> keys(static_cast<size_t>(bs), 0);
  for (size_t t = 0; t < m.row_request.size(); ++t) {
    int32_t& kb = keys[static_cast<size_t>(m.row_request[t])];
    kb = std::max(kb, m.row_visible[t]);
  }
  m.slot_indptr.assign(1, 0);
  const int ps = plan_.page_size;
  for (int b = 0; b < bs; ++b) {
    PAGODA_REQUIRE(keys[static_cast<size_t>(b)] <= plan_.kv_len(b), kInternal,
                   "backend 'cuda': request {} sees {} positions, its plan holds {}", b,
                   keys[static_cast<size_t>(b)], plan_.kv_len(b));
    const int32_t* pages = plan_.kv_indices.data() + plan_.kv_indptr[static_cast<size_t>(b)];
    for (int32_t p = 0; p < keys[static_cast<size_t>(b)]; ++p)
      m.slots.push_back(pages[p / ps] * ps + p % ps);
    m.slot_indptr.push_back(static_cast<int32_t>(m.slots.size()));
  }
}

void CudaBackend::select_index_topk(LayerId layer, const IndexerQuery& q, int k,
                                    std::span<int32_t> topk, std::span<float> scores) {
  PAGODA_REQUIRE(!capturing(), kFailedPrecondition,
                 "backend 'cuda': select_index_topk (results to the host) in a CUDA graph");
  check_indexer_call(q, k, topk.size(), scores.size());
  index_topk(layer, q, k, topk, scores, nullptr);
}

void CudaBackend::apply_index_topk(LayerId layer, const IndexerQuery& q, int k) {
  check_indexer_call(q, k, indexer_ ? indexer_->row_request.size() * static_cast<size_t>(k) : 0, 0);
  if (sparse_shape_k_ != k) {
    PAGODA_REQUIRE(!capturing(), kFailedPrecondition,
                   "backend 'cuda': a DSA selection of k {} in a CUDA graph whose step was "
                   "planned for k {} (run the step once before capturing it)",
                   k, sparse_shape_k_);
    prepare_sparse_shape(k);
  }
  if (attn_->graph_mode()) graph_dsa_k_ = k;
  index_topk(layer, q, k, {}, {}, static_cast<const int32_t*>(sparse_device_.get()));
  sparse_next_ = true;
  sparse_on_device_ = true;
}

void CudaBackend::prepare_sparse_shape(int k) {
  const IndexerMetadata& m = *indexer_;
  sparse_shape_ = sparse_gather_shape(m, k);
  sparse_shape_k_ = k;
  sparse_planned_.reset();
  const size_t rows = m.row_request.size();
  const bool graph = attn_->graph_mode();
  const size_t cap_rows = graph ? static_cast<size_t>(graph_max_tokens_) : rows;
  const size_t slots = graph ? cap_rows * static_cast<size_t>(k) : sparse_shape_.kv_indices.size();
  const size_t bytes = (cap_rows + 1 + std::max<size_t>(slots, 1)) * 4;
  if (sparse_device_.bytes() < bytes) sparse_device_.reset(bytes);
  cuda::cuda_check(cudaMemcpyAsync(sparse_device_.get(), sparse_shape_.kv_indptr.data(),
                                   (rows + 1) * 4, cudaMemcpyHostToDevice, stream_),
                   "cudaMemcpyAsync(sparse kv_indptr)");
}

void CudaBackend::plan_device_sparse(const AttentionShape& shape) {
  if (!sparse_attn_) sparse_attn_ = std::make_unique<cuda::CudaBatchAttention>(stream_, kernels_);
  if (attn_->graph_mode() && !sparse_attn_->graph_mode()) {
    cuda::GraphCapacity cap;  // each row a request of at most k keys, page size 1
    cap.max_batch_size = graph_max_tokens_;
    cap.max_tokens = graph_max_tokens_;
    cap.max_pages = int64_t{graph_max_tokens_} * sparse_shape_k_;
    sparse_attn_->enable_graph_mode(cap, shape);
  }
  // The step's one sparse plan: every layer's selected slots are written in its place.
  sparse_attn_->plan_with_device_indices(sparse_shape_.input(), shape, sparse_slots());
  sparse_planned_ = shape;
  if (attn_->graph_mode()) graph_sparse_shape_ = shape;
}

void CudaBackend::plan_graph_sparse() {
  if (!indexer_) return;
  indexer_->always_select = true;
  if (graph_dsa_k_ == 0 || !graph_sparse_shape_) return;  // a capture's warm-up plans it
  prepare_sparse_shape(graph_dsa_k_);
  plan_device_sparse(*graph_sparse_shape_);
}

int32_t* CudaBackend::sparse_slots() {
  const size_t rows =
      attn_->graph_mode() ? static_cast<size_t>(graph_max_tokens_) : indexer_->row_request.size();
  return static_cast<int32_t*>(sparse_device_.get()) + rows + 1;
}

void CudaBackend::check_indexer_call(const IndexerQuery& q, int k, size_t topk_size,
                                     size_t scores_size) const {
  PAGODA_REQUIRE(indexer_.has_value(), kFailedPrecondition,
                 "backend 'cuda': the DSA indexer without indexer metadata (the pool has no "
                 "index keys, or init_forward_metadata was not called)");
  PAGODA_REQUIRE(!attn_->graph_mode() || q.device.is_cuda(), kFailedPrecondition,
                 "backend 'cuda': the DSA indexer in a CUDA graph reads its queries on the "
                 "device (the CUDA model ops'), not from {}",
                 q.device.to_string());
  check_index_query(*ctx_.kv_pool, *indexer_, q, k, topk_size, scores_size, ctx_.kv_pool->device());
}

void CudaBackend::index_topk(LayerId layer, const IndexerQuery& q, int k, std::span<int32_t> topk,
                             std::span<float> scores, const int32_t* slot_out_begin) {
  const kv::KvPool& pool = *ctx_.kv_pool;
  const IndexerMetadata& m = *indexer_;
  const bool q_on_device = q.device.is_cuda();  // the CUDA ops' indexer: read in place
  const int rows = static_cast<int>(m.row_request.size());
  if (rows == 0) return;
  const int heads = q.heads, dim = q.dim;
  // Score rows strided by the step's longest row, or in graph mode by the context capacity (a
  // replay's rows may be longer than the capture's).
  const bool graph = attn_->graph_mode();
  const int64_t stride = graph ? ctx_.req_to_token->max_context_len() : m.max_visible;
  const int chunk = launch_rows(rows, stride);
  const int cap = graph ? launch_rows(graph_max_tokens_, stride) : chunk;
  cuda::AlignedRegions r;
  const size_t o_q = r.add(q_on_device ? 0 : size_t(cap) * heads * dim * 4),
               o_w = r.add(q_on_device ? 0 : size_t(cap) * heads * 4),
               o_scores = r.add(size_t(cap) * size_t(stride) * 4),
               o_topk = r.add(size_t(cap) * k * 4), o_topk_scores = r.add(size_t(cap) * k * 4);
  if (index_scratch_.bytes() < r.total) {
    PAGODA_REQUIRE(!capturing(), kFailedPrecondition,
                   "backend 'cuda': the DSA indexer's scratch grows while capturing (run the "
                   "largest step once before capturing)");
    index_scratch_.reset(r.total);
  }
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
    a.dim = dim;
    a.heads = heads;
    a.rows = n;
    a.max_visible = static_cast<int>(stride);
    a.k = k;
    a.q = q_on_device ? q.q + size_t(r0) * heads * dim : reinterpret_cast<const float*>(base + o_q);
    a.w = q_on_device ? q.w + size_t(r0) * heads : reinterpret_cast<const float*>(base + o_w);
    a.visible = meta_at(index_meta_.visible, r0);
    a.page_begin = meta_at(index_meta_.page_begin, r0);
    a.pages = meta_at(index_meta_.pages, 0);
    a.page_size = plan_.page_size;
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

}  // namespace pagoda::backends
