#include "pagoda/model/cuda/cuda_ops.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"
#include "pagoda/kernels/cuda/launch.h"
#include "pagoda/model/cuda/dense_kernels.h"
#include "pagoda/model/cuda/dsa_kernels.h"
#include "pagoda/model/cuda/family_kernels.h"
#include "pagoda/model/cuda/gemv_kernels.h"
#include "pagoda/model/cuda/mla_kernels.h"
#include "pagoda/model/cuda/sampling_kernels.h"
#include "pagoda/model/cuda/topk_kernels.h"
#include "pagoda/platform/cuda/cuda_check.h"

namespace pagoda::model {

namespace ck = cuda_kernels;
using platform::cuda_check;

static_assert(sizeof(SampleRow) == sizeof(ck::SamplingRowParams));
static_assert(offsetof(SampleRow, temperature) == offsetof(ck::SamplingRowParams, temperature));
static_assert(offsetof(SampleRow, top_k) == offsetof(ck::SamplingRowParams, top_k));
static_assert(offsetof(SampleRow, top_p) == offsetof(ck::SamplingRowParams, top_p));
static_assert(offsetof(SampleRow, min_p) == offsetof(ck::SamplingRowParams, min_p));
static_assert(offsetof(SampleRow, seed) == offsetof(ck::SamplingRowParams, seed));
static_assert(offsetof(SampleRow, step) == offsetof(ck::SamplingRowParams, step));
static_assert(sizeof(LogitAdjust) == sizeof(ck::LogitAdjustEntry));
static_assert(offsetof(LogitAdjust, row) == offsetof(ck::LogitAdjustEntry, row));
static_assert(offsetof(LogitAdjust, token) == offsetof(ck::LogitAdjustEntry, token));
static_assert(offsetof(LogitAdjust, bias) == offsetof(ck::LogitAdjustEntry, bias));
static_assert(offsetof(LogitAdjust, rep) == offsetof(ck::LogitAdjustEntry, rep));
static_assert(offsetof(LogitAdjust, sub) == offsetof(ck::LogitAdjustEntry, sub));

namespace {

constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

void cublas_check(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw_error(ErrorCode::kInternal, "{} failed: {} ({})", what, cublasGetStatusString(s),
              static_cast<int>(s));
}

ck::ActDType act_of(DType t) {
  switch (t) {
    case DType::kF32: return ck::ActDType::kF32;
    case DType::kF16: return ck::ActDType::kF16;
    case DType::kBF16: return ck::ActDType::kBF16;
    default: break;
  }
  throw_error(ErrorCode::kUnsupported, "the CUDA model computes in f32, f16 or bf16 (not {})",
              dtype_name(t));
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

cudaDataType_t cuda_type_of(DType t) {
  switch (t) {
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

class CudaGraph final : public ModelOps::Graph {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
  ~CudaGraph() override { (void)cudaGraphExecDestroy(exec_); }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  void replay() override { cuda_check(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch"); }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

class CudaOps final : public ModelOps {
 public:
  CudaOps(platform::Platform& platform, DType dtype)
      : platform_(&platform), dtype_(dtype), act_(act_of(dtype)) {
    stream_ = static_cast<cudaStream_t>(platform.native_stream());
    PAGODA_REQUIRE(stream_ != nullptr, kUnsupported,
                   "the CUDA model path needs a CUDA platform (got '{}')", platform.name());
    cublas_check(cublasCreate(&cublas_), "cublasCreate");
    try {
      cublas_check(cublasSetStream(cublas_, stream_), "cublasSetStream");
      // After cublasSetStream (which resets it): a fixed workspace keeps captures allocation-free.
      workspace_ = platform::make_buffer(platform.allocator(), kCublasWorkspaceBytes);
      cublas_check(cublasSetWorkspace(cublas_, workspace_.get(), kCublasWorkspaceBytes),
                   "cublasSetWorkspace");
      cublas_check(cublasSetMathMode(cublas_, dtype == DType::kF32 ? CUBLAS_PEDANTIC_MATH
                                                                   : CUBLAS_DEFAULT_MATH),
                   "cublasSetMathMode");
    } catch (...) {
      (void)cublasDestroy(cublas_);
      throw;
    }
  }
  ~CudaOps() override {
    (void)cudaStreamSynchronize(stream_);
    if (move_done_ != nullptr) (void)cudaEventDestroy(move_done_);
    (void)cublasDestroy(cublas_);
  }
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  DType dtype() const override { return dtype_; }
  platform::Platform& platform() const override { return *platform_; }

  void* upload(std::span<const float> host) override {
    const size_t n = host.size();
    const size_t es = dtype_size(dtype_);
    std::vector<uint8_t> bytes(std::max<size_t>(n, 1) * es);
    if (dtype_ == DType::kF32) {
      std::memcpy(bytes.data(), host.data(), n * sizeof(float));
    } else {
      for (size_t i = 0; i < n; ++i) {
        const uint16_t b = dtype_ == DType::kBF16 ? f32_to_bf16_bits(host[i])
                                                  : f32_to_f16_bits(host[i]);
        std::memcpy(bytes.data() + 2 * i, &b, 2);
      }
    }
    return keep(bytes.data(), bytes.size());
  }
  float* upload_f32(std::span<const float> host) override {
    return static_cast<float*>(keep(host.data(), std::max<size_t>(host.size(), 1) * 4));
  }
  /// A bf16 model takes the bits as they are (the bytes upload() would make from their widened
  /// values); another dtype widens them through upload().
  void* upload_bf16(std::span<const uint16_t> host) override {
    if (dtype_ != DType::kBF16) return ModelOps::upload_bf16(host);
    return keep(host.data(), std::max<size_t>(host.size(), 1) * sizeof(uint16_t));
  }

  void embed(const void* table, const int32_t* ids, void* out, int64_t rows, int64_t hidden,
             int64_t vocab_begin, int64_t vocab_rows) override {
    cuda_check(ck::embed_rows(act_, table, ids, out, rows, hidden, stream_, vocab_begin,
                              vocab_rows),
               "embed_rows");
  }
  void copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width,
               int64_t height) override {
    if (width <= 0 || height <= 0) return;
    cuda_check(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_pitch), src,
                                 static_cast<size_t>(src_pitch), static_cast<size_t>(width),
                                 static_cast<size_t>(height), cudaMemcpyDeviceToDevice, stream_),
               "cudaMemcpy2DAsync");
  }
  void add_rms_norm(const void* x, float* residual, const void* weight, void* out, int64_t rows,
                    int64_t hidden, float eps, bool first) override {
    cuda_check(ck::add_rms_norm(act_, x, residual, weight, out, rows, hidden, eps,
                                first ? ck::ResidualOp::kAssign : ck::ResidualOp::kAdd, stream_),
               "add_rms_norm");
  }
  void rms_norm_rows(const float* residual, const int32_t* row_index, const void* weight,
                     void* out, int64_t rows, int64_t hidden, float eps) override {
    cuda_check(ck::rms_norm_rows(act_, residual, row_index, weight, out, rows, hidden, eps,
                                 stream_),
               "rms_norm_rows");
  }
  void linear(const void* x, const void* w, void* y, int64_t m, int64_t n, int64_t k,
              bool f32_out) override {
    if (m == 0 || n == 0) return;
    if (use_small_m(x, w, m, n, k, f32_out)) {
      cuda_check(ck::small_m_gemm(act_, x, w, y, f32_out, /*swiglu=*/false, m, n, k, stream_),
                 "small_m_gemm");
      return;
    }
    // Row-major y[m, n] = x[m, k] · w[n, k]ᵀ is column-major yᵀ[n, m] = wᵀ · xᵀ.
    const float alpha = 1.f, beta = 0.f;
    const cudaDataType_t in = cuda_type_of(dtype_);
    const cudaDataType_t out = f32_out ? CUDA_R_32F : in;
    const cublasComputeType_t compute = compute_type();
    cublas_check(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n),
                              static_cast<int>(m), static_cast<int>(k), &alpha, w, in,
                              static_cast<int>(k), x, in, static_cast<int>(k), &beta, y, out,
                              static_cast<int>(n), compute, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  }
  /// cuBLAS's accumulation for dtype(): f32, pedantic (no TF32) for an f32 model.
  cublasComputeType_t compute_type() const {
    return dtype_ == DType::kF32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
  }
  /// Whether a decode GEMM goes to small_m_gemm rather than cuBLAS. gemv_bench on the H200
  /// (git show 1f78aca:bench/results/engine_real_h200/gemv_bench.txt): small_m_gemm wins at
  /// m = 1 on matrices up to ~64 M elements (1B q/k/v 5.1 vs 6.1 µs, down 10.2 vs 13.4) and on
  /// the f32-output LM head (118 vs 126 µs), at m = 2 up to ~25 M elements; cuBLAS wins on the
  /// large m <= 2 matrices (8B gate_up 62 vs 56 µs) and from m = 4 on. small_m_gemm needs
  /// 16-byte aligned x and w (scratch rows at odd offsets may not be): cuBLAS takes the rest.
  bool use_small_m(const void* x, const void* w, int64_t m, int64_t n, int64_t k,
                   bool f32_out) const {
    if (m > kSmallMMaxRows || !ck::small_m_gemm_supported(act_, m, n, k) || !aligned16(x) ||
        !aligned16(w))
      return false;
    return f32_out || n * k <= (m == 1 ? kSmallM1MaxElems : kSmallM2MaxElems);
  }
  void qkv_rope(const void* qkv, const void* bias, const int32_t* positions,
                const float* inv_freq, void* q, void* k, void* v, int64_t rows, int hq, int hkv,
                int head_dim) override {
    cuda_check(ck::qkv_bias_rope(act_, qkv, bias, positions, inv_freq, q, k, v, rows, hq, hkv,
                                 head_dim, stream_),
               "qkv_bias_rope");
  }
  bool swiglu_linear(const void* gate_up, const void* w, void* y, int64_t m, int64_t n,
                     int64_t k) override {
    if (m == 0 || m > kSwigluFuseMaxRows || (m > 1 && n * k > kSmallM2MaxElems) ||
        !ck::small_m_gemm_supported(act_, m, n, k) || !aligned16(gate_up) || !aligned16(w))
      return false;
    cuda_check(ck::small_m_gemm(act_, gate_up, w, y, /*f32_out=*/false, /*swiglu=*/true, m, n, k,
                                stream_),
               "small_m_gemm (swiglu)");
    return true;
  }
  bool qkv_rope_store(const void* qkv, const void* bias, const int32_t* positions,
                      const float* inv_freq, void* q, const KvStore& cache, int64_t rows, int hq,
                      int hkv, int head_dim) override {
    const ck::KvCacheWrite w{.k_cache = cache.k_cache,
                             .v_cache = cache.v_cache,
                             .out_cache_loc = cache.out_cache_loc,
                             .num_slots = cache.num_slots};
    cuda_check(ck::qkv_bias_rope_store(act_, qkv, bias, positions, inv_freq, q, nullptr, nullptr,
                                       w, rows, hq, hkv, head_dim, stream_),
               "qkv_bias_rope_store");
    return true;
  }
  void silu_mul(const void* gate_up, void* out, int64_t rows, int64_t inter) override {
    cuda_check(ck::silu_mul(act_, gate_up, out, rows, inter, stream_), "silu_mul");
  }
  void soft_cap(float* x, int64_t n, float cap) override {
    cuda_check(ck::soft_cap_inplace(x, n, cap, stream_), "soft_cap");
  }
  bool supports_gemma_ops() const override { return true; }
  void scale(void* x, int64_t n, float s) override {
    cuda_check(ck::scale_inplace(act_, x, n, s, stream_), "scale");
  }
  void rms_norm_groups(void* x, int64_t rows, int64_t row_stride, int64_t groups, int64_t dim,
                       const void* weight, float eps) override {
    cuda_check(ck::rms_norm_groups(act_, x, rows, row_stride, groups, dim, weight, eps, stream_),
               "rms_norm_groups");
  }
  void gelu_tanh_mul(const void* gate_up, void* out, int64_t rows, int64_t inter) override {
    cuda_check(ck::gelu_tanh_mul(act_, gate_up, out, rows, inter, stream_), "gelu_tanh_mul");
  }
  bool supports_mamba_ops() const override { return true; }
  void add_bias(void* x, DType x_dtype, const float* bias, int64_t rows, int64_t n) override {
    cuda_check(ck::add_bias_rows(act_of(x_dtype), x, bias, rows, n, stream_), "add_bias_rows");
  }
  void gated_rms_norm(const float* y, const float* z, int64_t z_stride, const float* weight,
                      void* out, int64_t rows, int64_t dim, int64_t groups, float eps) override {
    cuda_check(ck::gated_rms_norm(act_, y, z, z_stride, weight, out, rows, dim, groups, eps,
                                  stream_),
               "gated_rms_norm");
  }
  bool supports_mla_ops() const override { return true; }
  /// One strided-batched cuBLAS GEMM: group g is yᵀ_g [n, m] = w_gᵀ · xᵀ_g in column-major terms,
  /// the pitches as leading dimensions and the group offsets as batch strides (no copies).
  void linear_groups(const void* x, int64_t x_pitch, int64_t x_group, const void* w, void* y,
                     int64_t y_pitch, int64_t y_group, int64_t m, int64_t n, int64_t k,
                     int64_t groups) override {
    if (m == 0 || n == 0 || groups == 0) return;
    const float alpha = 1.f, beta = 0.f;
    const cudaDataType_t t = cuda_type_of(dtype_);
    const cublasComputeType_t compute = compute_type();
    cublas_check(cublasGemmStridedBatchedEx(
                     cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                     static_cast<int>(k), &alpha, w, t, static_cast<int>(k), n * k, x, t,
                     static_cast<int>(x_pitch), x_group, &beta, y, t, static_cast<int>(y_pitch),
                     y_group, static_cast<int>(groups), compute, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmStridedBatchedEx");
  }
  void rope_interleaved(void* x, int64_t rows, int64_t row_stride, int64_t groups,
                        int64_t group_stride, int64_t dim, const int32_t* positions,
                        const float* inv_freq, float factor) override {
    cuda_check(ck::rope_interleaved(act_, x, rows, row_stride, groups, group_stride, dim,
                                    positions, inv_freq, factor, stream_),
               "rope_interleaved");
  }
  bool supports_dsa_ops() const override { return true; }
  void layer_norm_f32(float* x, int64_t rows, int64_t dim, const float* weight, const float* bias,
                      float eps) override {
    cuda_check(ck::layer_norm_f32(x, rows, dim, weight, bias, eps, stream_), "layer_norm_f32");
  }
  void rope_neox_f32(float* x, int64_t rows, int64_t groups, int64_t dim, int64_t rope,
                     const int32_t* positions, const float* inv_freq, float factor) override {
    cuda_check(ck::rope_neox_f32(x, rows, groups, dim, rope, positions, inv_freq, factor, stream_),
               "rope_neox_f32");
  }
  void merge_attention(const void* part_o, const float* part_lse, float* acc_o, float* acc_lse,
                       void* out, int64_t rows, int64_t heads, int64_t dv, bool first) override {
    cuda_check(ck::merge_attention(act_, part_o, part_lse, acc_o, acc_lse, out, rows, heads, dv,
                                   first, stream_),
               "merge_attention");
  }
  void scale_f32(float* x, int64_t n, float s) override {
    cuda_check(ck::scale_inplace(ck::ActDType::kF32, x, n, s, stream_), "scale_f32");
  }
  void store_index_keys(const float* k, const int32_t* loc, int64_t rows, int64_t dim,
                        void* index_rows, int64_t row_bytes) override {
    cuda_check(ck::store_index_keys(k, loc, rows, dim, index_rows, row_bytes, stream_),
               "store_index_keys");
  }
  void adjust_logits(float* logits, int64_t vocab, const LogitAdjust* adj, int64_t n) override {
    cuda_check(ck::adjust_logits(logits, vocab, reinterpret_cast<const ck::LogitAdjustEntry*>(adj),
                                 n, stream_),
               "adjust_logits");
  }
  void mask_logits(float* logits, int64_t vocab, const int32_t* rows, const uint32_t* mask,
                   const int32_t* count, int64_t max_rows) override {
    cuda_check(ck::mask_logits(logits, vocab, rows, mask, count, max_rows, stream_),
               "mask_logits");
  }
  void sample(const float* logits, const SampleRow* params, int32_t* out_ids, int64_t rows,
              int64_t vocab) override {
    PAGODA_REQUIRE(vocab <= ck::kMaxSampleVocab, kUnsupported,
                   "the GPU sampler supports vocabularies up to {} (got {})",
                   ck::kMaxSampleVocab, vocab);
    const size_t ws = ck::sample_tokens_workspace_bytes(static_cast<int>(rows),
                                                        static_cast<int>(vocab));
    if (ws > sample_ws_bytes_) {  // grows outside graph capture (the worker warms up first)
      sample_ws_ = platform::make_buffer(platform_->allocator(), ws);
      sample_ws_bytes_ = ws;
    }
    cuda_check(ck::sample_tokens(logits, vocab,
                                 reinterpret_cast<const ck::SamplingRowParams*>(params),
                                 static_cast<int>(rows), static_cast<int>(vocab), out_ids,
                                 sample_ws_.get(), sample_ws_bytes_, stream_),
               "sample_tokens");
  }

  bool top_k_logprobs(const float* logits, int64_t rows, int64_t vocab, int k, int32_t* ids,
                      float* logprobs) override {
    cuda_check(ck::launch_topk_logprobs(logits, rows, vocab, k, ids, logprobs, stream_),
               "topk_logprobs");
    return true;
  }

  bool move_rows(std::span<void* const> bases, size_t row_bytes, std::span<const int32_t> src,
                 std::span<const int32_t> dst) override {
    PAGODA_REQUIRE(src.size() == dst.size(), kInvalidArgument,
                   "move_rows got {} sources and {} destinations", src.size(), dst.size());
    if (src.empty() || bases.empty() || row_bytes == 0) return true;
    // Staging: [bases (u64) | src | dst], pinned, one async upload; scratch for the gather.
    const size_t nb = bases.size(), np = src.size();
    const size_t bytes = nb * sizeof(uint64_t) + 2 * np * sizeof(int32_t);
    if (move_stage_bytes_ < bytes) {
      platform_->synchronize_stream();  // queued moves may still read the old buffers
      move_stage_bytes_ = std::max(bytes, 2 * move_stage_bytes_);
      move_host_ = platform::make_buffer(platform_->pinned_allocator(), move_stage_bytes_);
      move_dev_ = platform::make_buffer(platform_->allocator(), move_stage_bytes_);
    }
    if (move_scratch_bytes_ < nb * np * row_bytes) {
      platform_->synchronize_stream();
      move_scratch_bytes_ = std::max(nb * np * row_bytes, 2 * move_scratch_bytes_);
      move_scratch_ = platform::make_buffer(platform_->allocator(), move_scratch_bytes_);
    }
    if (move_pending_) {  // the previous upload may still read the pinned buffer
      cuda_check(cudaEventSynchronize(move_done_), "cudaEventSynchronize");
    } else if (move_done_ == nullptr) {
      cuda_check(cudaEventCreateWithFlags(&move_done_, cudaEventDisableTiming), "cudaEventCreate");
    }
    auto* h = static_cast<unsigned char*>(move_host_.get());
    for (size_t i = 0; i < nb; ++i) {
      const uint64_t a = reinterpret_cast<uintptr_t>(bases[i]);
      std::memcpy(h + i * sizeof(uint64_t), &a, sizeof(a));
    }
    std::memcpy(h + nb * sizeof(uint64_t), src.data(), src.size_bytes());
    std::memcpy(h + nb * sizeof(uint64_t) + src.size_bytes(), dst.data(), dst.size_bytes());
    cuda_check(cudaMemcpyAsync(move_dev_.get(), h, bytes, cudaMemcpyHostToDevice, stream_),
               "move_rows upload");
    cuda_check(cudaEventRecord(move_done_, stream_), "cudaEventRecord");
    move_pending_ = true;
    auto* d = static_cast<unsigned char*>(move_dev_.get());
    kernels::cuda::MoveRowsArgs a;
    a.bases = reinterpret_cast<const uint64_t*>(d);
    a.num_bases = static_cast<int>(nb);
    a.row_bytes = static_cast<int64_t>(row_bytes);
    a.src = reinterpret_cast<const int32_t*>(d + nb * sizeof(uint64_t));
    a.dst = a.src + np;
    a.num_pairs = static_cast<int>(np);
    a.scratch = static_cast<unsigned char*>(move_scratch_.get());
    kernels::cuda::launch_move_rows(a, stream_).throw_if_error();
    return true;
  }

  bool supports_graphs() const override { return true; }
  std::unique_ptr<Graph> capture(const std::function<void()>& body) override {
    cuda_check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
               "cudaStreamBeginCapture");
    cudaGraph_t graph = nullptr;
    try {
      body();
    } catch (...) {
      (void)cudaStreamEndCapture(stream_, &graph);
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
      throw;
    }
    cuda_check(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
    (void)cudaGraphDestroy(graph);
    cuda_check(inst, "cudaGraphInstantiate");
    return std::make_unique<CudaGraph>(exec, stream_);
  }

 private:
  void* keep(const void* host, size_t bytes) {
    platform::DeviceBuffer buf = platform::make_buffer(platform_->allocator(), bytes);
    platform_->allocator().copy_to_device(buf.get(), host, bytes);
    void* p = buf.get();
    owned_.push_back(std::move(buf));
    return p;
  }

  platform::Platform* platform_;
  DType dtype_;
  ck::ActDType act_;
  /// The use_small_m / swiglu_linear limits: rows, and weight elements at m = 1 and m = 2
  /// (measured with bench/cuda/gemv_bench on the H200, docs/design/engine.md; wider limits ran
  /// slower, e.g. m <= 4 off cuBLAS cost self-drafting 5 %, bench/results/spec_h200.md).
  static constexpr int64_t kSmallMMaxRows = 2;
  static constexpr int64_t kSwigluFuseMaxRows = 2;
  static constexpr int64_t kSmallM1MaxElems = int64_t{64} << 20;
  static constexpr int64_t kSmallM2MaxElems = int64_t{25} << 20;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  platform::DeviceBuffer workspace_;
  platform::DeviceBuffer sample_ws_;
  size_t sample_ws_bytes_ = 0;
  std::vector<platform::DeviceBuffer> owned_;
  // move_rows: pinned staging + device copy of [bases | src | dst], gather scratch.
  platform::DeviceBuffer move_host_, move_dev_, move_scratch_;
  size_t move_stage_bytes_ = 0, move_scratch_bytes_ = 0;
  cudaEvent_t move_done_ = nullptr;
  bool move_pending_ = false;
};

}  // namespace

std::unique_ptr<ModelOps> make_cuda_ops(platform::Platform& platform, DType dtype) {
  return std::make_unique<CudaOps>(platform, dtype);
}

}  // namespace pagoda::model
