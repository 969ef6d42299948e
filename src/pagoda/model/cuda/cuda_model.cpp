#include "pagoda/model/cuda/cuda_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "pagoda/core/error.h"
#include "pagoda/core/status.h"
#include "pagoda/model/cuda/model_kernels.h"
#include "pagoda/platform/cuda/cuda_platform.h"

namespace pagoda::model {

using attention::ForwardBatch;
using attention::ForwardMode;

namespace {

constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::ok();
  return Status(ErrorCode::kInternal, fmt::format("{} failed: {} ({})", what,
                                                  cudaGetErrorString(e), static_cast<int>(e)));
}

void cuda_check(cudaError_t e, const char* what) { cuda_status(e, what).throw_if_error(); }

void cublas_check(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw_error(ErrorCode::kInternal, "{} failed: {} ({})", what, cublasGetStatusString(s),
              static_cast<int>(s));
}

}  // namespace

/// Device activations; every pointer is valid for `tokens` query rows and `rows` logit rows.
struct CudaModelExecutor::Buffers {
  int64_t tokens = 0, rows = 0;
  platform::DeviceBuffer x, h, qkv, q, k, v, attn, mlp, act, sel, logits, ints;
  float* f(const platform::DeviceBuffer& b) const { return static_cast<float*>(b.get()); }
  int32_t* ids() const { return static_cast<int32_t*>(ints.get()); }
  int32_t* positions() const { return ids() + tokens; }
  int32_t* logit_rows() const { return ids() + 2 * tokens; }
};

struct CudaModelExecutor::Graph {
  cudaGraphExec_t exec = nullptr;
  ~Graph() {
    if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
  }
};

CudaModelExecutor::CudaModelExecutor(const LlamaModel& model, platform::Platform& platform,
                                     attention::AttentionBackend& backend,
                                     attention::AttentionBackend* graph_backend, int graph_max_bs)
    : model_(&model),
      platform_(&platform),
      alloc_(&platform.allocator()),
      backend_(&backend),
      graph_backend_(graph_backend) {
  auto* cuda = dynamic_cast<platform::CudaPlatform*>(&platform);
  PAGODA_REQUIRE(cuda != nullptr, kUnsupported,
                 "the CUDA model path needs the CUDA platform (got '{}')", platform.name());
  PAGODA_REQUIRE(graph_backend == nullptr || graph_max_bs >= 1, kInvalidArgument,
                 "CUDA graphs need a max batch size >= 1 (got {})", graph_max_bs);
  stream_ = cuda->stream();
  cublas_check(cublasCreate(&cublas_), "cublasCreate");
  try {
    cublas_check(cublasSetStream(cublas_, stream_), "cublasSetStream");
    // After cublasSetStream (which resets it): a fixed workspace keeps captures allocation-free.
    cublas_workspace_ = platform::make_buffer(*alloc_, kCublasWorkspaceBytes);
    cublas_check(cublasSetWorkspace(cublas_, cublas_workspace_.get(), kCublasWorkspaceBytes),
                 "cublasSetWorkspace");
    cublas_check(cublasSetMathMode(cublas_, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
    upload_weights();
    eager_ = std::make_unique<Buffers>();
    if (graph_backend_ != nullptr) capture_graphs(graph_max_bs);
  } catch (...) {
    graphs_.clear();
    (void)cublasDestroy(cublas_);
    throw;
  }
}

CudaModelExecutor::~CudaModelExecutor() {
  (void)cudaStreamSynchronize(stream_);
  graphs_.clear();
  (void)cublasDestroy(cublas_);
}

void CudaModelExecutor::upload_weights() {
  auto upload = [&](const std::vector<float>& host) -> const float* {
    const size_t bytes = std::max<size_t>(host.size(), 1) * sizeof(float);
    platform::DeviceBuffer buf = platform::make_buffer(*alloc_, bytes);
    if (!host.empty()) alloc_->copy_to_device(buf.get(), host.data(), host.size() * sizeof(float));
    const float* p = static_cast<const float*>(buf.get());
    weights_.push_back(std::move(buf));
    return p;
  };
  embed_ = upload(model_->embed_weights());
  lm_head_ = &model_->lm_head_weights() == &model_->embed_weights()
                 ? embed_
                 : upload(model_->lm_head_weights());
  final_norm_ = upload(model_->final_norm_weights());
  const auto& inv = model_->rope().inv_freq();
  inv_freq_ = upload(std::vector<float>(inv.begin(), inv.end()));
  for (const LlamaModel::PackedLayer& w : model_->packed_layers()) {
    layers_.push_back(LayerPtrs{.input_norm = upload(w.input_norm),
                                .qkv = upload(w.qkv_proj),
                                .o_proj = upload(w.o_proj),
                                .post_norm = upload(w.post_norm),
                                .gate_up = upload(w.gate_up),
                                .down = upload(w.down_proj)});
  }
}

void CudaModelExecutor::ensure(Buffers& b, int64_t tokens, int64_t rows) {
  if (tokens <= b.tokens && rows <= b.rows) return;
  const ModelConfig& c = model_->config();
  const int64_t t = std::max({tokens, b.tokens * 2, int64_t{16}});
  const int64_t r = std::max({rows, b.rows * 2, int64_t{16}});
  cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  auto make = [&](int64_t floats) {
    return platform::make_buffer(*alloc_, static_cast<size_t>(std::max<int64_t>(floats, 1)) * 4);
  };
  const int64_t hd = c.hidden_size, d = c.head_dim;
  b.x = make(t * hd);
  b.h = make(t * hd);
  b.qkv = make(t * (c.num_q_heads + 2 * c.num_kv_heads) * d);
  b.q = make(t * c.num_q_heads * d);
  b.k = make(t * c.num_kv_heads * d);
  b.v = make(t * c.num_kv_heads * d);
  b.attn = make(t * c.num_q_heads * d);
  b.mlp = make(t * 2 * c.intermediate_size);
  b.act = make(t * c.intermediate_size);
  b.sel = make(r * hd);
  b.logits = make(r * c.vocab_size);
  b.ints = make(2 * t + r);
  b.tokens = t;
  b.rows = r;
}

void CudaModelExecutor::stage_inputs(Buffers& b, std::span<const int32_t> ids,
                                     std::span<const int32_t> positions,
                                     std::span<const int32_t> rows) {
  host_ints_.assign(static_cast<size_t>(2 * b.tokens + static_cast<int64_t>(rows.size())), 0);
  std::copy(ids.begin(), ids.end(), host_ints_.begin());
  std::copy(positions.begin(), positions.end(), host_ints_.begin() + b.tokens);
  std::copy(rows.begin(), rows.end(), host_ints_.begin() + 2 * b.tokens);
  cuda_check(cudaMemcpyAsync(b.ids(), host_ints_.data(), host_ints_.size() * sizeof(int32_t),
                             cudaMemcpyHostToDevice, stream_),
             "cudaMemcpyAsync (step inputs)");
}

void CudaModelExecutor::gemm(const float* x, const float* w, float* y, int64_t m, int64_t n,
                             int64_t k, float beta) {
  if (m == 0 || n == 0) return;
  // Row-major y[m, n] = x[m, k] · w[n, k]ᵀ is column-major yᵀ[n, m] = wᵀ · xᵀ.
  const float alpha = 1.f;
  cublas_check(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n),
                            static_cast<int>(m), static_cast<int>(k), &alpha, w, CUDA_R_32F,
                            static_cast<int>(k), x, CUDA_R_32F, static_cast<int>(k), &beta, y,
                            CUDA_R_32F, static_cast<int>(n), CUBLAS_COMPUTE_32F_PEDANTIC,
                            CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

void CudaModelExecutor::forward_device(Buffers& b, const ForwardBatch& batch,
                                       attention::AttentionBackend& backend, int64_t t,
                                       int64_t rows) {
  namespace ck = cuda_kernels;
  const ModelConfig& c = model_->config();
  const int64_t hd = c.hidden_size, vocab = c.vocab_size, inter = c.intermediate_size;
  const int64_t hq = c.num_q_heads, hkv = c.num_kv_heads, d = c.head_dim;
  const int64_t qkv_w = (hq + 2 * hkv) * d;
  const Device dev = platform_->device();
  float* x = b.f(b.x);
  float* h = b.f(b.h);
  const TensorView q_view(b.q.get(), DType::kF32, {t, hq, d}, dev);
  const TensorView k_view(b.k.get(), DType::kF32, {t, hkv, d}, dev);
  const TensorView v_view(b.v.get(), DType::kF32, {t, hkv, d}, dev);
  const TensorView o_view(b.attn.get(), DType::kF32, {t, hq, d}, dev);
  cuda_status(ck::embed_rows(embed_, b.ids(), x, t, hd, stream_), "embed_rows").throw_if_error();
  const auto& attn_layers = model_->attention_layers();
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerPtrs& w = layers_[l];
    cuda_status(ck::rms_norm(x, nullptr, w.input_norm, h, t, hd, c.rms_norm_eps, stream_),
                "rms_norm")
        .throw_if_error();
    gemm(h, w.qkv, b.f(b.qkv), t, qkv_w, hd, 0.f);
    cuda_status(ck::split_qkv_rope(b.f(b.qkv), b.positions(), inv_freq_, b.f(b.q), b.f(b.k),
                                   b.f(b.v), t, static_cast<int>(hq), static_cast<int>(hkv),
                                   static_cast<int>(d), stream_),
                "split_qkv_rope")
        .throw_if_error();
    backend.forward(q_view, k_view, v_view, attn_layers[l], batch, o_view);
    gemm(b.f(b.attn), w.o_proj, x, t, hd, hq * d, 1.f);
    cuda_status(ck::rms_norm(x, nullptr, w.post_norm, h, t, hd, c.rms_norm_eps, stream_),
                "rms_norm")
        .throw_if_error();
    gemm(h, w.gate_up, b.f(b.mlp), t, 2 * inter, hd, 0.f);
    cuda_status(ck::silu_mul(b.f(b.mlp), b.f(b.act), t, inter, stream_), "silu_mul")
        .throw_if_error();
    gemm(b.f(b.act), w.down, x, t, hd, inter, 1.f);
  }
  cuda_status(ck::rms_norm(x, b.logit_rows(), final_norm_, b.f(b.sel), rows, hd, c.rms_norm_eps,
                           stream_),
              "rms_norm (final)")
      .throw_if_error();
  gemm(b.f(b.sel), lm_head_, b.f(b.logits), rows, vocab, hd, 0.f);
  if (c.final_logit_softcap > 0.f)
    cuda_status(ck::soft_cap(b.f(b.logits), rows * vocab, c.final_logit_softcap, stream_),
                "soft_cap")
        .throw_if_error();
}

void CudaModelExecutor::copy_logits(const Buffers& b, int64_t rows, std::span<float> logits) {
  const size_t bytes = static_cast<size_t>(rows * model_->config().vocab_size) * sizeof(float);
  if (bytes > 0)
    cuda_check(cudaMemcpyAsync(logits.data(), b.logits.get(), bytes, cudaMemcpyDeviceToHost,
                               stream_),
               "cudaMemcpyAsync (logits)");
  cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (step)");
}

void CudaModelExecutor::capture_graphs(int max_bs) {
  buckets_ = cuda_graph_batch_sizes(max_bs);
  const int fill = graph_backend_->cuda_graph_seq_len_fill_value();
  graph_backend_->init_cuda_graph_state(max_bs, max_bs);
  graph_bufs_ = std::make_unique<Buffers>();
  ensure(*graph_bufs_, max_bs, max_bs);
  std::vector<std::unique_ptr<Graph>> graphs(buckets_.size());
  bool shape_known = false;
  for (size_t i = buckets_.size(); i-- > 0;) {  // largest first, like SGLang
    const int bs = buckets_[i];
    ForwardBatch dummy;
    dummy.mode = ForwardMode::kDecode;
    pad_decode_batch(dummy, bs, fill);  // row 0, slot 0, seq_len = fill
    std::vector<int32_t> ids(static_cast<size_t>(bs), 0), rows(static_cast<size_t>(bs));
    std::iota(rows.begin(), rows.end(), 0);
    stage_inputs(*graph_bufs_, ids, dummy.positions, rows);
    if (!shape_known) {  // the backend learns the layer shape from one eager forward
      graph_backend_->init_forward_metadata(dummy);
      forward_device(*graph_bufs_, dummy, *graph_backend_, bs, bs);
      shape_known = true;
    }
    graph_backend_->init_forward_metadata_capture_cuda_graph(dummy);
    for (int warm = 0; warm < 2; ++warm) forward_device(*graph_bufs_, dummy, *graph_backend_, bs, bs);
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (warm-up)");
    cuda_check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
               "cudaStreamBeginCapture");
    cudaGraph_t graph = nullptr;
    try {
      forward_device(*graph_bufs_, dummy, *graph_backend_, bs, bs);
    } catch (...) {
      (void)cudaStreamEndCapture(stream_, &graph);
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
      throw;
    }
    cuda_check(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
    auto g = std::make_unique<Graph>();
    const cudaError_t inst = cudaGraphInstantiate(&g->exec, graph, 0);
    (void)cudaGraphDestroy(graph);
    cuda_check(inst, "cudaGraphInstantiate");
    graphs[i] = std::move(g);
  }
  cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (capture)");
  graphs_ = std::move(graphs);
  stats_.num_graphs = static_cast<int>(graphs_.size());
}

void CudaModelExecutor::run(const ForwardBatch& batch, std::span<const int32_t> input_ids,
                            std::span<const int32_t> logit_rows, std::span<float> logits) {
  const ModelConfig& c = model_->config();
  const int64_t t = batch.num_tokens();
  const int64_t vocab = c.vocab_size;
  const int64_t nrows = static_cast<int64_t>(logit_rows.size());
  PAGODA_REQUIRE(static_cast<int64_t>(input_ids.size()) == t, kInvalidArgument,
                 "{} input ids for a batch of {} tokens", input_ids.size(), t);
  PAGODA_REQUIRE(static_cast<int64_t>(batch.positions.size()) == t, kInvalidArgument,
                 "{} positions for a batch of {} tokens", batch.positions.size(), t);
  PAGODA_REQUIRE(static_cast<int64_t>(logits.size()) == nrows * vocab, kInvalidArgument,
                 "logits buffer has {} floats, need {} rows x {}", logits.size(), nrows, vocab);
  for (int32_t id : input_ids)
    PAGODA_REQUIRE(id >= 0 && id < vocab, kOutOfRange, "token id {} outside [0, {})", id, vocab);
  for (int32_t r : logit_rows)
    PAGODA_REQUIRE(r >= 0 && r < t, kOutOfRange, "logit row {} outside [0, {})", r, t);
  if (batch.mode == ForwardMode::kIdle || t == 0) return;

  bool all_rows = nrows == t;
  for (int64_t i = 0; all_rows && i < nrows; ++i) all_rows = logit_rows[i] == i;
  if (!graphs_.empty() && batch.mode == ForwardMode::kDecode && all_rows &&
      t <= buckets_.back()) {
    const size_t gi = static_cast<size_t>(
        std::lower_bound(buckets_.begin(), buckets_.end(), static_cast<int>(t)) - buckets_.begin());
    const int bs = buckets_[gi];
    ForwardBatch padded = batch;
    pad_decode_batch(padded, bs, graph_backend_->cuda_graph_seq_len_fill_value());
    std::vector<int32_t> ids(input_ids.begin(), input_ids.end());
    ids.resize(static_cast<size_t>(bs), 0);
    std::vector<int32_t> rows(static_cast<size_t>(bs));
    std::iota(rows.begin(), rows.end(), 0);
    graph_backend_->init_forward_metadata_replay_cuda_graph(padded);
    stage_inputs(*graph_bufs_, ids, padded.positions, rows);
    cuda_check(cudaGraphLaunch(graphs_[gi]->exec, stream_), "cudaGraphLaunch");
    copy_logits(*graph_bufs_, nrows, logits);
    ++stats_.graph_steps;
    stats_.padded_rows += bs - t;
    return;
  }
  ensure(*eager_, t, std::max<int64_t>(nrows, 1));
  stage_inputs(*eager_, input_ids, batch.positions, logit_rows);
  backend_->init_forward_metadata(batch);
  forward_device(*eager_, batch, *backend_, t, nrows);
  copy_logits(*eager_, nrows, logits);
  ++stats_.eager_steps;
}

}  // namespace pagoda::model
