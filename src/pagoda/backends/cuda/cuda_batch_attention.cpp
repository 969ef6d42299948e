#include "pagoda/backends/cuda/cuda_batch_attention.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/kernels/cuda/launch.h"

namespace pagoda::backends::cuda {

namespace kc = pagoda::kernels::cuda;
using attention::AttentionShape;
using attention::PagedPlanInput;
using attention::RunParams;

/// Byte offsets of the arrays in the device arena (and the identical pinned staging buffer).
struct CudaBatchAttention::Layout {
  size_t counts = 0, qo_indptr = 0, kv_indptr = 0, kv_last = 0;
  size_t item_req = 0, item_a = 0, item_b = 0, item_partial = 0;
  size_t merge_req = 0, merge_begin = 0, merge_count = 0, merge_tok = 0;
  size_t kv_indices = 0, mask_indptr = 0, mask_free = 0, mask_qpos = 0, mask = 0, cache_loc = 0,
         total = 0;
  /// (offset, bytes) of every array, in the order above (the same order for every capacity).
  std::vector<std::pair<size_t, size_t>> regions;

  Layout(int bs, int items, int tokens, int64_t pages, int64_t mask_bytes) {
    AlignedRegions r;
    auto take = [&](size_t bytes) { return r.add(bytes); };
    counts = take(16);
    qo_indptr = take(4 * size_t(bs + 1));
    kv_indptr = take(4 * size_t(bs + 1));
    kv_last = take(4 * size_t(bs));
    item_req = take(4 * size_t(items));
    item_a = take(4 * size_t(items));
    item_b = take(4 * size_t(items));
    item_partial = take(4 * size_t(items));
    // Merge rows: one per request (decode) or per query token (prefill split).
    const size_t merges = size_t(std::max(bs, tokens));
    merge_req = take(4 * merges);
    merge_begin = take(4 * merges);
    merge_count = take(4 * merges);
    merge_tok = take(4 * merges);
    kv_indices = take(4 * size_t(pages));
    mask_indptr = take(8 * size_t(bs + 1));
    // mask_free and mask_qpos between mask_indptr and mask: one upload for all four
    mask_free = take(4 * size_t(bs));
    mask_qpos = take(4 * size_t(tokens));
    mask = take(size_t(mask_bytes));
    cache_loc = take(4 * size_t(tokens));
    total = r.total;
    regions = std::move(r.regions);
  }
};

CudaBatchAttention::CudaBatchAttention(cudaStream_t stream, const KernelOptions& options)
    : stream_(stream), options_(options) {
  int dev = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, dev),
             "cudaDeviceGetAttribute(SM count)");
  cuda_check(cudaEventCreateWithFlags(&upload_done_, cudaEventDisableTiming), "cudaEventCreate");
  ensure_capacity(16, 1024, 512, 0, 256);
}

CudaBatchAttention::~CudaBatchAttention() {
  (void)cudaStreamSynchronize(stream_);
  if (upload_done_ != nullptr) (void)cudaEventDestroy(upload_done_);
}

void CudaBatchAttention::ensure_capacity(int bs, int64_t pages, int items, int64_t mask_bytes,
                                         int tokens) {
  if (layout_ && bs <= cap_bs_ && pages <= cap_pages_ && items <= cap_items_ &&
      mask_bytes <= cap_mask_ && tokens <= cap_tokens_) {
    return;
  }
  PAGODA_REQUIRE(!graph_mode_, kResourceExhausted,
                 "CUDA-graph capacity exceeded: batch {} (max {}), pages {} (max {}), work items "
                 "{} (max {}), mask bytes {} (max {}), tokens {} (max {})",
                 bs, cap_bs_, pages, cap_pages_, items, cap_items_, mask_bytes, cap_mask_, tokens,
                 cap_tokens_);
  auto grow = [](int64_t want, int64_t have) { return std::max(want, have) * 3 / 2 + 16; };
  const int nbs = static_cast<int>(bs > cap_bs_ ? grow(bs, cap_bs_) : cap_bs_);
  const int64_t npages = pages > cap_pages_ ? grow(pages, cap_pages_) : cap_pages_;
  const int nitems = static_cast<int>(items > cap_items_ ? grow(items, cap_items_) : cap_items_);
  const int64_t nmask = mask_bytes > cap_mask_ ? grow(mask_bytes, cap_mask_) : cap_mask_;
  const int ntok = static_cast<int>(tokens > cap_tokens_ ? grow(tokens, cap_tokens_) : cap_tokens_);
  auto layout = std::make_unique<Layout>(nbs, nitems, ntok, npages, nmask);
  // Work still queued may read the old arena.
  cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  CudaBuffer arena(layout->total);
  // On stream_ (a legacy-stream cudaMemset is not ordered before stream_'s later uploads).
  cuda_check(cudaMemsetAsync(arena.get(), 0, layout->total, stream_), "cudaMemsetAsync(arena)");
  // Keep what the old arena holds: this step's out_cache_loc may already be uploaded when plan()
  // grows the arena (and the plan when upload_cache_loc() grows it). Every array keeps its
  // index layout; only its capacity grows.
  if (layout_) {
    auto* dst = static_cast<unsigned char*>(arena.get());
    const auto* src = static_cast<const unsigned char*>(arena_.get());
    for (size_t i = 0; i < layout->regions.size(); ++i) {
      const size_t n = std::min(layout_->regions[i].second, layout->regions[i].second);
      if (n == 0) continue;
      cuda_check(cudaMemcpyAsync(dst + layout->regions[i].first, src + layout_->regions[i].first, n,
                                 cudaMemcpyDeviceToDevice, stream_),
                 "arena copy");
    }
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");  // before the old frees
  }
  staging_.reset(layout->total);
  std::memset(staging_.get(), 0, layout->total);
  arena_ = std::move(arena);
  layout_ = std::move(layout);
  cap_bs_ = nbs;
  cap_pages_ = npages;
  cap_items_ = nitems;
  cap_mask_ = nmask;
  cap_tokens_ = ntok;
}

void CudaBatchAttention::ensure_workspace(int partials, int hq, int dv) {
  const int64_t need = int64_t(std::max(partials, 1)) * hq * std::max(dv, 1);
  if (need <= cap_partial_floats_ && partial_lse_.bytes() >= size_t(std::max(partials, 1)) * hq * 4) {
    return;
  }
  PAGODA_REQUIRE(!graph_mode_, kResourceExhausted,
                 "CUDA-graph split-KV workspace exceeded ({} floats needed, {} reserved)", need,
                 cap_partial_floats_);
  cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  const int64_t n = need * 3 / 2;
  partial_o_.reset(size_t(n) * sizeof(float));
  partial_lse_.reset(size_t(n / std::max(dv, 1) + hq) * sizeof(float));
  cap_partial_floats_ = n;
}

int CudaBatchAttention::graph_items_bound(const AttentionShape& shape, const ScheduleConfig& cfg,
                                          int bs, int tokens) const {
  // Without a tuned decode kernel (the generic path) the split rules differ: a wave of 8
  // blocks per SM.
  const int wave = cfg.fast_path || cfg.mla_decode ? decode_wave_items(shape, cfg) : sm_count_ * 8;
  return schedule_items_bound(bs, tokens, shape.num_qo_heads / std::max(shape.num_kv_heads, 1),
                              wave);
}

void CudaBatchAttention::enable_graph_mode(const GraphCapacity& cap, const AttentionShape& shape) {
  PAGODA_REQUIRE(cap.max_batch_size > 0 && cap.max_tokens > 0 && cap.max_pages > 0,
                 kInvalidArgument, "graph capacity needs positive batch, tokens and pages");
  graph_mode_ = false;
  // A captured launch covers graph_items_bound items; a looser bound only launches blocks that
  // exit at once (on the H200, 8,448 empty blocks cost a 1-request decode ~12 µs per layer; on
  // the H100 the batch-wide capacity's 784 x 8 blocks cost a 1-request decode 14.5 µs a layer
  // at 1de75ef).
  const int items =
      graph_items_bound(shape, schedule_config(shape), cap.max_batch_size, cap.max_tokens);
  ensure_capacity(cap.max_batch_size, cap.max_pages, items, cap.max_mask_bytes, cap.max_tokens);
  ensure_workspace(cap_items_, shape.num_qo_heads, shape.head_dim_v);
  graph_mode_ = true;
}

namespace {

void validate_input(const PagedPlanInput& in, const AttentionShape& shape) {
  PAGODA_REQUIRE(in.page_size >= 1, kInvalidArgument, "page_size must be >= 1, got {}",
                 in.page_size);
  PAGODA_REQUIRE(!in.qo_indptr.empty(), kInvalidArgument, "qo_indptr must have bs + 1 entries");
  const int bs = in.batch_size();
  PAGODA_REQUIRE(in.kv_indptr.size() == size_t(bs + 1) && in.kv_last_page_len.size() == size_t(bs),
                 kInvalidArgument,
                 "kv_indptr has {} entries and kv_last_page_len {}; expected {} and {}",
                 in.kv_indptr.size(), in.kv_last_page_len.size(), bs + 1, bs);
  PAGODA_REQUIRE(in.qo_indptr[0] == 0 && in.kv_indptr[0] == 0, kInvalidArgument,
                 "indptrs must start at 0");
  for (int b = 0; b < bs; ++b) {
    PAGODA_REQUIRE(in.qo_indptr[b + 1] >= in.qo_indptr[b] && in.kv_indptr[b + 1] >= in.kv_indptr[b],
                   kInvalidArgument, "indptrs must be non-decreasing (request {})", b);
    const int pages = in.kv_indptr[b + 1] - in.kv_indptr[b];
    const int last = in.kv_last_page_len[b];
    PAGODA_REQUIRE(pages == 0 ? (last == 0 || last <= in.page_size)
                              : (last >= 1 && last <= in.page_size),
                   kOutOfRange, "request {}: kv_last_page_len {} outside [1, {}]", b, last,
                   in.page_size);
  }
  PAGODA_REQUIRE(in.kv_indices.size() >= size_t(in.kv_indptr[bs]), kInvalidArgument,
                 "kv_indices has {} entries, kv_indptr needs {}", in.kv_indices.size(),
                 in.kv_indptr[bs]);
  for (int32_t i = 0; i < in.kv_indptr[bs]; ++i) {
    PAGODA_REQUIRE(in.kv_indices[i] >= 0, kOutOfRange, "page id {} at {} is negative",
                   in.kv_indices[i], i);
  }
  if (!in.custom_mask.empty()) {
    PAGODA_REQUIRE(in.mask_indptr.size() == size_t(bs + 1), kInvalidArgument,
                   "mask_indptr needs {} entries, has {}", bs + 1, in.mask_indptr.size());
    const auto len = kv_lengths(in);
    for (int b = 0; b < bs; ++b) {
      const int64_t bits = int64_t(in.qo_indptr[b + 1] - in.qo_indptr[b]) * len[b];
      PAGODA_REQUIRE(in.mask_indptr[b + 1] - in.mask_indptr[b] >= (bits + 7) / 8 &&
                         in.mask_indptr[b] >= 0,
                     kInvalidArgument, "request {}: custom mask segment too short for {} bits", b,
                     bits);
    }
    PAGODA_REQUIRE(in.mask_indptr[bs] <= int64_t(in.custom_mask.size()), kInvalidArgument,
                   "mask_indptr ends at {} beyond the {} mask bytes", in.mask_indptr[bs],
                   in.custom_mask.size());
  }
  PAGODA_REQUIRE(shape.num_qo_heads > 0 && shape.num_kv_heads > 0 &&
                     shape.num_qo_heads % shape.num_kv_heads == 0,
                 kInvalidArgument, "Hq {} must be a positive multiple of Hkv {}",
                 shape.num_qo_heads, shape.num_kv_heads);
  PAGODA_REQUIRE(shape.head_dim_qk > 0 && shape.head_dim_v > 0 && shape.head_dim_qk <= 1024 &&
                     shape.head_dim_v <= 1024,
                 kUnsupported, "head dims must be in [1, 1024], got {}/{}", shape.head_dim_qk,
                 shape.head_dim_v);
  PAGODA_REQUIRE(dtype_is_float(shape.q_dtype) && !dtype_is_fp8(shape.q_dtype) &&
                     dtype_is_float(shape.kv_dtype) && dtype_is_float(shape.out_dtype) &&
                     !dtype_is_fp8(shape.out_dtype),
                 kUnsupported, "dtypes q {} kv {} out {} unsupported (q/out: f32/f16/bf16)",
                 shape.q_dtype, shape.kv_dtype, shape.out_dtype);
}

template <typename T>
void put(unsigned char* base, size_t off, std::span<const T> v) {
  if (!v.empty()) std::memcpy(base + off, v.data(), v.size_bytes());
}

}  // namespace

ScheduleConfig CudaBatchAttention::schedule_config(const AttentionShape& shape) const {
  ScheduleConfig cfg;
  cfg.sm_count = sm_count_;
  cfg.force_prefill = force_prefill_;
  cfg.min_chunk_tokens = options_.decode_min_chunk;
  cfg.fast_path = kc::fast_path_supported(shape.q_dtype, shape.kv_dtype, shape.out_dtype,
                                          shape.head_dim_qk, shape.head_dim_v);
  if (cfg.fast_path) {
    cfg.decode_blocks_per_sm = kc::decode_blocks_per_sm(shape.q_dtype, shape.kv_dtype,
                                                        shape.head_dim_qk);
  }
  // The variants: what the device runs for this shape, where the options allow it.
  cfg.sm90_prefill = options_.sm90_prefill &&
                     kc::prefill_sm90_serves(shape.q_dtype, shape.kv_dtype, shape.out_dtype,
                                             shape.head_dim_qk, shape.head_dim_v, options_.cuda);
  cfg.mla_decode = options_.mla_decode &&
                   kc::mla_decode_usable(shape.q_dtype, shape.kv_dtype, shape.out_dtype,
                                         shape.num_kv_heads, shape.head_dim_qk, shape.head_dim_v);
  if (cfg.mla_decode) {
    cfg.decode_blocks_per_sm = 1;  // 165-226 KB of shared memory per block
    cfg.decode_heads_per_block = kc::mla_decode_block_heads(
        shape.q_dtype, shape.kv_dtype, shape.out_dtype, shape.num_qo_heads, options_.cuda);
  }
  return cfg;
}

void CudaBatchAttention::plan_with_device_indices(const PagedPlanInput& in,
                                                  const AttentionShape& shape,
                                                  const int32_t* device_kv_indices) {
  PAGODA_REQUIRE(device_kv_indices != nullptr, kInvalidArgument,
                 "plan_with_device_indices: null device kv_indices");
  plan(in, shape);
  device_kv_indices_ = device_kv_indices;
}

void CudaBatchAttention::plan(const PagedPlanInput& in, const AttentionShape& shape) {
  device_kv_indices_ = nullptr;
  validate_input(in, shape);
  const int bs = in.batch_size();
  ScheduleConfig cfg = schedule_config(shape);
  // Graph mode: a split must fit the frozen arena and workspace, and the launch grid of the
  // batch's graph (the bound of this batch: a replay is padded to its captured batch).
  const int grid_items =
      graph_mode_
          ? std::min(cap_items_, graph_items_bound(shape, cfg, bs, bs > 0 ? in.qo_indptr[bs] : 0))
          : 0;
  if (graph_mode_) {
    cfg.max_items = grid_items;
    cfg.max_partial_floats = cap_partial_floats_;
  }
  Schedule sched = build_schedule(in, shape, cfg);
  PAGODA_REQUIRE(!graph_mode_ || sched.num_items() <= grid_items, kInternal,
                 "CUDA-graph plan: {} work items exceed the bound {} of a batch of {} requests",
                 sched.num_items(), grid_items, bs);
  const int64_t pages = in.kv_indptr[bs];
  const int64_t mask_bytes = in.custom_mask.empty() ? 0 : in.mask_indptr[bs];
  const std::vector<int32_t> mask_free = mask_bytes > 0 ? mask_free_columns(in)
                                                        : std::vector<int32_t>();
  const std::vector<int32_t> mask_qpos = mask_bytes > 0 ? mask_positions(in, mask_free)
                                                        : std::vector<int32_t>();
  ensure_capacity(bs, pages, sched.num_items(), mask_bytes, std::max(sched.nnz_qo, 1));
  ensure_workspace(sched.num_partials, shape.num_qo_heads, shape.head_dim_v);

  // Commit: the staging buffer may still be read by the previous upload.
  cuda_check(cudaEventSynchronize(upload_done_), "cudaEventSynchronize");
  auto* host = static_cast<unsigned char*>(staging_.get());
  const Layout& L = *layout_;
  const int32_t counts[4] = {bs, sched.num_items(), sched.num_merges(),
                             sched.path == KernelPath::kPrefill ? sched.chunk_tokens : 0};
  std::memcpy(host + L.counts, counts, sizeof(counts));
  put(host, L.qo_indptr, in.qo_indptr);
  put(host, L.kv_indptr, in.kv_indptr);
  put(host, L.kv_last, in.kv_last_page_len);
  put(host, L.item_req, std::span<const int32_t>(sched.item_req));
  put(host, L.item_a, std::span<const int32_t>(sched.item_a));
  put(host, L.item_b, std::span<const int32_t>(sched.item_b));
  put(host, L.item_partial, std::span<const int32_t>(sched.item_partial));
  put(host, L.merge_req, std::span<const int32_t>(sched.merge_req));
  put(host, L.merge_begin, std::span<const int32_t>(sched.merge_begin));
  put(host, L.merge_count, std::span<const int32_t>(sched.merge_count));
  put(host, L.merge_tok, std::span<const int32_t>(sched.merge_tok));
  put(host, L.kv_indices, in.kv_indices.subspan(0, size_t(pages)));
  auto* dev = static_cast<unsigned char*>(arena_.get());
  cuda_check(cudaMemcpyAsync(dev, host, L.kv_indices + size_t(pages) * 4, cudaMemcpyHostToDevice,
                             stream_),
             "plan upload");
  if (mask_bytes > 0) {
    put(host, L.mask_indptr, in.mask_indptr);
    put(host, L.mask_free, std::span<const int32_t>(mask_free));
    put(host, L.mask_qpos, std::span<const int32_t>(mask_qpos));
    put(host, L.mask, in.custom_mask.subspan(0, size_t(mask_bytes)));
    cuda_check(cudaMemcpyAsync(dev + L.mask_indptr, host + L.mask_indptr,
                               L.mask + size_t(mask_bytes) - L.mask_indptr, cudaMemcpyHostToDevice,
                               stream_),
               "mask upload");
  }
  cuda_check(cudaEventRecord(upload_done_, stream_), "cudaEventRecord");

  int32_t max_page = -1;
  for (int64_t i = 0; i < pages; ++i) max_page = std::max(max_page, in.kv_indices[i]);
  int32_t max_tail = 0;
  for (int b = 0; b < bs && mask_bytes > 0; ++b) {
    for (int32_t t = in.qo_indptr[b]; t < in.qo_indptr[b + 1]; ++t) {
      max_tail = std::max(max_tail, mask_qpos[size_t(t)] + 1 - mask_free[size_t(b)]);
    }
  }
  shape_ = shape;
  schedule_ = std::move(sched);
  page_size_ = in.page_size;
  batch_size_ = bs;
  nnz_qo_ = schedule_.nnz_qo;
  grid_items_ = grid_items;
  max_page_id_ = max_page;
  has_mask_ = mask_bytes > 0;
  max_mask_tail_ = max_tail;
  planned_ = true;
}

void CudaBatchAttention::upload_cache_loc(std::span<const int32_t> loc) {
  ensure_capacity(1, 0, 0, 0, static_cast<int>(loc.size()));
  if (loc.empty()) return;
  cuda_check(cudaEventSynchronize(upload_done_), "cudaEventSynchronize");
  auto* host = static_cast<unsigned char*>(staging_.get());
  put(host, layout_->cache_loc, loc);
  cuda_check(cudaMemcpyAsync(static_cast<unsigned char*>(arena_.get()) + layout_->cache_loc,
                             host + layout_->cache_loc, loc.size_bytes(), cudaMemcpyHostToDevice,
                             stream_),
             "out_cache_loc upload");
  cuda_check(cudaEventRecord(upload_done_, stream_), "cudaEventRecord");
}

const int32_t* CudaBatchAttention::device_cache_loc() const {
  return reinterpret_cast<const int32_t*>(static_cast<unsigned char*>(arena_.get()) +
                                          layout_->cache_loc);
}

const float* CudaBatchAttention::device_sinks(std::span<const float> sinks, Status& st) noexcept {
  if (sinks.empty()) return nullptr;
  auto it = sinks_cache_.find(sinks.data());
  if (it != sinks_cache_.end() && it->second.values.size() == sinks.size() &&
      std::equal(sinks.begin(), sinks.end(), it->second.values.begin())) {
    return static_cast<const float*>(it->second.buffer.get());
  }
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  (void)cudaStreamIsCapturing(stream_, &cs);
  if (cs != cudaStreamCaptureStatusNone) {
    st = Status(ErrorCode::kFailedPrecondition,
                "attention sinks first seen during CUDA-graph capture; run the layer eagerly "
                "once before capturing");
    return nullptr;
  }
  try {
    CudaBuffer buf(sinks.size_bytes());
    // On stream_: a plain cudaMemcpy from pageable memory may return before its DMA lands, and
    // the legacy stream does not order the non-blocking stream_'s kernels after it.
    st = cuda_status(cudaMemcpyAsync(buf.get(), sinks.data(), sinks.size_bytes(),
                                     cudaMemcpyHostToDevice, stream_),
                     "sinks upload");
    if (!st.is_ok()) return nullptr;
    if (it != sinks_cache_.end()) retired_sinks_.push_back(std::move(it->second.buffer));
    auto [pos, _] = sinks_cache_.insert_or_assign(
        sinks.data(), SinksCopy{std::move(buf), std::vector<float>(sinks.begin(), sinks.end())});
    return static_cast<const float*>(pos->second.buffer.get());
  } catch (const Error& e) {
    st = Status(e.code(), e.message());
    return nullptr;
  }
}

namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

Status check_view(const TensorView& t, const char* what, std::initializer_list<int64_t> dims,
                  DType dtype) {
  if (!t.device().is_cuda()) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("{} {} must live on a CUDA device", what, t.describe()));
  }
  bool ok = t.rank() == static_cast<int>(dims.size()) && t.dtype() == dtype &&
            t.stride(t.rank() - 1) == 1;
  int i = 0;
  for (int64_t d : dims) {
    if (ok && d >= 0 && t.size(i) != d) ok = false;
    ++i;
  }
  if (!ok) {
    std::string want;
    for (int64_t d : dims) want += (want.empty() ? "" : ", ") + (d < 0 ? std::string("*") : std::to_string(d));
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("{} is {}; expected [{}] {} with unit inner stride", what,
                              t.describe(), want, dtype));
  }
  return Status::ok();
}

}  // namespace

Status CudaBatchAttention::try_run(const TensorView& q, const TensorView& k_cache,
                                   const TensorView& v_cache, const TensorView& out,
                                   const TensorView& lse, const RunParams& params) noexcept {
  if (!planned_) return Status(ErrorCode::kFailedPrecondition, "run() before plan()");
  const AttentionShape& s = shape_;
  Status st = check_view(q, "q", {nnz_qo_, s.num_qo_heads, s.head_dim_qk}, s.q_dtype);
  if (st.is_ok()) st = check_view(k_cache, "k_cache", {-1, page_size_, s.num_kv_heads, s.head_dim_qk}, s.kv_dtype);
  if (st.is_ok()) st = check_view(v_cache, "v_cache", {-1, page_size_, s.num_kv_heads, s.head_dim_v}, s.kv_dtype);
  if (st.is_ok()) st = check_view(out, "out", {nnz_qo_, s.num_qo_heads, s.head_dim_v}, s.out_dtype);
  if (st.is_ok() && !lse.empty()) st = check_view(lse, "lse", {nnz_qo_, s.num_qo_heads}, DType::kF32);
  if (!st.is_ok()) return st;
  if (max_page_id_ >= k_cache.size(0) || max_page_id_ >= v_cache.size(0)) {
    return Status(ErrorCode::kOutOfRange,
                  fmt::format("page id {} beyond the cache's {} pages", max_page_id_,
                              std::min(k_cache.size(0), v_cache.size(0))));
  }
  if (has_mask_ && params.window_left >= 0 && params.window_left < max_mask_tail_) {
    return Status(ErrorCode::kUnsupported,
                  fmt::format("sliding window {} under a custom mask whose rows see up to {} keys "
                              "past the columns every row sees (a tree deeper than the window)",
                              params.window_left, max_mask_tail_));
  }
  if (!params.sinks.empty() && params.sinks.size() != size_t(s.num_qo_heads)) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("sinks has {} entries, expected Hq = {}", params.sinks.size(),
                              s.num_qo_heads));
  }
  const float* sinks = device_sinks(params.sinks, st);
  if (!st.is_ok()) return st;

  const auto* base = static_cast<const unsigned char*>(arena_.get());
  const Layout& L = *layout_;
  kc::AttentionArgs a;
  a.variants = options_.cuda;
  auto i32 = [&](size_t off) { return reinterpret_cast<const int32_t*>(base + off); };
  a.plan.counts = i32(L.counts);
  a.plan.qo_indptr = i32(L.qo_indptr);
  a.plan.kv_indptr = i32(L.kv_indptr);
  a.plan.kv_indices = device_kv_indices_ != nullptr ? device_kv_indices_ : i32(L.kv_indices);
  a.plan.kv_last_page_len = i32(L.kv_last);
  a.plan.custom_mask = has_mask_ ? base + L.mask : nullptr;
  a.plan.mask_indptr = reinterpret_cast<const int64_t*>(base + L.mask_indptr);
  a.plan.item_req = i32(L.item_req);
  a.plan.item_a = i32(L.item_a);
  a.plan.item_b = i32(L.item_b);
  a.plan.item_partial = i32(L.item_partial);
  a.plan.merge_req = i32(L.merge_req);
  a.plan.merge_begin = i32(L.merge_begin);
  a.plan.merge_count = i32(L.merge_count);
  a.plan.merge_tok = i32(L.merge_tok);
  a.plan.mask_free_cols = has_mask_ ? i32(L.mask_free) : nullptr;
  a.plan.mask_qpos = has_mask_ ? i32(L.mask_qpos) : nullptr;
  a.page_size = page_size_;
  a.q = q.data();
  a.q_stride_n = q.stride(0);
  a.q_stride_h = q.stride(1);
  a.out = out.data();
  a.o_stride_n = out.stride(0);
  a.o_stride_h = out.stride(1);
  a.lse = lse.empty() ? nullptr : lse.data_as<float>();
  a.lse_stride_n = lse.empty() ? 0 : lse.stride(0);
  a.lse_stride_h = lse.empty() ? 0 : lse.stride(1);
  a.k = {k_cache.data(), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.size(0)};
  a.v = {v_cache.data(), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), v_cache.size(0)};
  a.num_qo_heads = s.num_qo_heads;
  a.num_kv_heads = s.num_kv_heads;
  a.head_dim_qk = s.head_dim_qk;
  a.head_dim_v = s.head_dim_v;
  if (!kc::to_elem_type(s.q_dtype, a.q_dtype) || !kc::to_elem_type(s.kv_dtype, a.kv_dtype) ||
      !kc::to_elem_type(s.out_dtype, a.out_dtype)) {
    return Status(ErrorCode::kUnsupported, "non-float dtype in the attention shape");
  }
  a.sm_scale = params.sm_scale;
  a.logit_cap = params.logit_cap;
  a.window_left = params.window_left;
  a.causal = params.mask == attention::MaskKind::kCausal;
  a.sinks = sinks;
  a.k_scale = params.k_scale;
  a.v_scale = params.v_scale;
  a.partial_o = static_cast<float*>(partial_o_.get());
  a.partial_lse = static_cast<float*>(partial_lse_.get());
  // A graph's launch is frozen at capture: its grids cover any plan of the captured batch (the
  // merge kernel strides over its rows, so one block per request suffices).
  const int graph_bs = std::max(batch_size_, 1);
  a.grid_items = graph_mode_ ? grid_items_ : schedule_.num_items();
  a.grid_rows = graph_mode_ ? cap_tokens_ : nnz_qo_;
  a.grid_merge = graph_mode_ ? std::min(cap_bs_, graph_bs) : schedule_.num_merges();
  // The merge block follows the mean partials per row: this plan's, or in a graph the grid's
  // items over its requests.
  a.merge_parts =
      graph_mode_ ? (grid_items_ + graph_bs - 1) / graph_bs
      : schedule_.num_merges() > 0
          ? (schedule_.num_partials + schedule_.num_merges() - 1) / schedule_.num_merges()
          : 0;
  a.prefill_sm90 = schedule_.sm90_prefill;

  // The tuned kernels need 16-byte rows; anything else takes the generic kernel.
  const int64_t vec = 8;
  const bool fast_layout =
      aligned16(q.data()) && aligned16(k_cache.data()) && aligned16(v_cache.data()) &&
      (reinterpret_cast<uintptr_t>(out.data()) & 3u) == 0 && q.stride(0) % vec == 0 &&
      q.stride(1) % vec == 0 && out.stride(0) % 2 == 0 && out.stride(1) % 2 == 0 &&
      k_cache.stride(0) % vec == 0 && k_cache.stride(1) % vec == 0 &&
      k_cache.stride(2) % vec == 0 && v_cache.stride(0) % vec == 0 &&
      v_cache.stride(1) % vec == 0 && v_cache.stride(2) % vec == 0;
  KernelPath path = schedule_.path;
  if (!fast_layout) path = KernelPath::kGeneric;
  // The decode kernel and the sm90 prefill (fp8 at D 128) copy fp8 rows in 16-byte chunks: every
  // fp8 stride must be a multiple of 16.
  if ((path == KernelPath::kDecode || (path == KernelPath::kPrefill && schedule_.sm90_prefill)) &&
      dtype_size(s.kv_dtype) == 1) {
    bool ok16 = true;
    for (int i = 0; i < 3; ++i) ok16 &= k_cache.stride(i) % 16 == 0 && v_cache.stride(i) % 16 == 0;
    if (!ok16) path = KernelPath::kGeneric;
  }
  // The MLA kernel reads V from K's storage (the MLA pool's V is a view of the latent row) and
  // copies 16-byte chunks of the latent rows.
  if (path == KernelPath::kMlaDecode) {
    const int64_t chunk = 16 / int64_t(dtype_size(s.kv_dtype));
    const bool same = v_cache.data() == k_cache.data() && v_cache.stride(0) == k_cache.stride(0) &&
                      v_cache.stride(1) == k_cache.stride(1);
    if (!same || k_cache.stride(0) % chunk != 0 || k_cache.stride(1) % chunk != 0) {
      path = KernelPath::kGeneric;
    }
  }
  run_path_ = path;
  switch (path) {
    case KernelPath::kMlaDecode:
      st = kc::launch_mla_decode(a, stream_);
      if (st.is_ok() && (graph_mode_ || schedule_.num_merges() > 0)) st = kc::launch_merge(a, stream_);
      return st;
    case KernelPath::kDecode:
      st = kc::launch_decode(a, stream_);
      if (st.is_ok() && (graph_mode_ || schedule_.num_merges() > 0)) st = kc::launch_merge(a, stream_);
      return st;
    case KernelPath::kPrefill:
      st = kc::launch_prefill(a, stream_);
      if (st.is_ok() && (graph_mode_ || schedule_.num_merges() > 0)) st = kc::launch_merge(a, stream_);
      return st;
    case KernelPath::kGeneric:
      return kc::launch_generic(a, stream_);
  }
  return Status(ErrorCode::kInternal, "unknown kernel path");
}

void CudaBatchAttention::run(const TensorView& q, const TensorView& k_cache,
                             const TensorView& v_cache, const TensorView& out,
                             const TensorView& lse, const RunParams& params) {
  try_run(q, k_cache, v_cache, out, lse, params).throw_if_error();
}

std::unique_ptr<attention::BatchAttention> make_cuda_batch_attention(const KernelOptions& options) {
  return std::make_unique<CudaBatchAttention>(nullptr, options);
}

}  // namespace pagoda::backends::cuda
