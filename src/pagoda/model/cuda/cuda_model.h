#pragma once
/// CudaModelExecutor: the CUDA path of the model (engine.md §7). Weights and activations live on
/// the GPU (f32, uploaded once through the platform's allocator); GEMMs run through cuBLAS
/// (cublasGemmEx, f32 in/out, CUBLAS_COMPUTE_32F_PEDANTIC: no TF32, so greedy tokens track the
/// f32 host path); RMSNorm, RoPE, SwiGLU, embedding and soft cap are small kernels
/// (model_kernels.h); residual adds are GEMMs with beta = 1; attention goes through the selected
/// backend with device tensors. Logits [rows, vocab] are copied to the host for sampling.
///
/// CUDA graphs (sglang_spec §7): with a graph backend, the constructor captures one graph per
/// batch-size bucket (cuda_graph_batch_sizes(max_bs), largest first) over fixed-address buffers:
/// each capture runs on a dummy decode batch (row 0, slot 0, seq_len = fill value), after one
/// eager forward (the backend learns the layer shape) and two warm-ups. A decode step of
/// bs <= max_bs is padded to its bucket (pad_decode_batch), re-planned in place with
/// init_forward_metadata_replay_cuda_graph, and replayed; the padded rows' logits are dropped.
/// Every other step runs eagerly on the eager backend. The graph backend is a second instance of
/// the same backend (same pool, table and stream) so its frozen graph capacities never limit
/// eager extend steps.
///
/// Requirements: a CudaPlatform; both backends enqueue on its stream. One thread; not copyable.

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "pagoda/attention/backend.h"
#include "pagoda/model/llama.h"
#include "pagoda/model/model_runner.h"
#include "pagoda/platform/platform.h"

namespace pagoda::model {

struct CudaExecutorStats {
  int64_t eager_steps = 0;
  int64_t graph_steps = 0;   ///< decode steps served by a graph replay
  int64_t padded_rows = 0;   ///< dummy rows added by padding, summed over replays
  int num_graphs = 0;        ///< captured buckets
};

class CudaModelExecutor final : public StepExecutor {
 public:
  /// Uploads the weights of `model` and, when `graph_backend` is non-null, captures the decode
  /// graphs for buckets up to `graph_max_bs` (>= 1). `platform` must be a CudaPlatform; all
  /// arguments must outlive the executor. Throws Error (kUnsupported without a CUDA platform,
  /// kInternal naming the failed CUDA / cuBLAS call).
  CudaModelExecutor(const LlamaModel& model, platform::Platform& platform,
                    attention::AttentionBackend& backend,
                    attention::AttentionBackend* graph_backend = nullptr, int graph_max_bs = 0);
  ~CudaModelExecutor() override;
  CudaModelExecutor(const CudaModelExecutor&) = delete;
  CudaModelExecutor& operator=(const CudaModelExecutor&) = delete;

  /// One step (StepExecutor contract). Decode batches within the captured buckets replay a
  /// graph; everything else runs eagerly. Blocks until the logits are on the host.
  void run(const attention::ForwardBatch& batch, std::span<const int32_t> input_ids,
           std::span<const int32_t> logit_rows, std::span<float> logits) override;

  bool graphs_enabled() const { return !graphs_.empty(); }
  /// The captured buckets, ascending (empty without graphs).
  const std::vector<int>& graph_batch_sizes() const { return buckets_; }
  const CudaExecutorStats& stats() const { return stats_; }

 private:
  struct Buffers;  // device activations of one path (eager: grow-only; graph: fixed)
  struct Graph;

  void upload_weights();
  void ensure(Buffers& b, int64_t tokens, int64_t rows);
  void stage_inputs(Buffers& b, std::span<const int32_t> ids, std::span<const int32_t> positions,
                    std::span<const int32_t> rows);
  /// Enqueues the whole forward over `b` (no sync; capturable).
  void forward_device(Buffers& b, const attention::ForwardBatch& batch,
                      attention::AttentionBackend& backend, int64_t tokens, int64_t rows);
  void gemm(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
            float beta);
  void copy_logits(const Buffers& b, int64_t rows, std::span<float> logits);
  void capture_graphs(int max_bs);

  const LlamaModel* model_;
  platform::Platform* platform_;
  platform::Allocator* alloc_;
  attention::AttentionBackend* backend_;
  attention::AttentionBackend* graph_backend_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::vector<platform::DeviceBuffer> weights_;  ///< owners of every device weight
  struct LayerPtrs {
    const float *input_norm, *qkv, *o_proj, *post_norm, *gate_up, *down;
  };
  std::vector<LayerPtrs> layers_;
  const float* embed_ = nullptr;
  const float* lm_head_ = nullptr;
  const float* final_norm_ = nullptr;
  const float* inv_freq_ = nullptr;
  platform::DeviceBuffer cublas_workspace_;
  std::unique_ptr<Buffers> eager_, graph_bufs_;
  std::vector<int> buckets_;
  std::vector<std::unique_ptr<Graph>> graphs_;  ///< parallel to buckets_
  std::vector<int32_t> host_ints_;
  CudaExecutorStats stats_;
};

}  // namespace pagoda::model
