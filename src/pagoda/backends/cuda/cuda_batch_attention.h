#pragma once
/// CudaBatchAttention: BatchAttention on an NVIDIA GPU (FlashInfer conventions, see
/// attention/batch_attention.h). plan() validates the CSR table on the host, builds the work
/// schedule (split-KV decode, tensor-core prefill or the generic kernel) and uploads it with one
/// or two async copies into a fixed-address device arena; run() only launches kernels (no
/// allocation, no host sync), so it can be captured into a CUDA graph and replayed after a later
/// plan() of the same or smaller batch (graph mode freezes the capacities).
///
/// Tensors given to run() must live on the GPU. Threading: one thread at a time; all work goes
/// to the stream given at construction.

#include <cuda_runtime_api.h>

#include <memory>
#include <unordered_map>
#include <vector>

#include "pagoda/attention/batch_attention.h"
#include "pagoda/backends/kernel_options.h"
#include "pagoda/backends/cuda/cuda_memory.h"
#include "pagoda/backends/cuda/cuda_schedule.h"
#include "pagoda/kernels/cuda/attention_params.h"

namespace pagoda::backends::cuda {

/// Fixed capacities for CUDA-graph use (all batches planned afterwards must fit).
struct GraphCapacity {
  int max_batch_size = 0;   ///< requests
  int max_tokens = 0;       ///< query rows (nnz_qo)
  int64_t max_pages = 0;    ///< total kv_indices entries
  int64_t max_mask_bytes = 0;
};

class CudaBatchAttention final : public attention::BatchAttention {
 public:
  /// Uses `stream` (nullptr = legacy default stream) on the current device. plan() chooses the
  /// kernels from the shape, what the device runs and `options` (the MLA decode and sm90 prefill
  /// kernels only where options allow them); run() passes options.cuda down as the launch
  /// variants. `options` must be valid (KernelOptions::validate).
  explicit CudaBatchAttention(cudaStream_t stream = nullptr, const KernelOptions& options = {});
  ~CudaBatchAttention() override;

  std::string name() const override { return "cuda"; }
  void plan(const attention::PagedPlanInput& input, const attention::AttentionShape& shape) override;
  /// plan(), whose kernels then read kv_indices from `device_kv_indices` (device memory, at
  /// least kv_indptr[bs] entries, written on the stream before run(): the DSA indexer's
  /// selected slots) instead of input.kv_indices, which is still validated and uploaded (any
  /// valid pages will do). The caller guarantees every device entry is a page below the caches'
  /// size: run() checks only the host ones. Until the next plan(). In graph mode the launches
  /// capture the pointer: a replay's plan must pass the one its capture had.
  void plan_with_device_indices(const attention::PagedPlanInput& input,
                                const attention::AttentionShape& shape,
                                const int32_t* device_kv_indices);
  void run(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
           const TensorView& out, const TensorView& lse, const attention::RunParams& params) override;
  /// run() without throwing (CUDA-graph paths): kInvalidArgument / kInternal on failure.
  Status try_run(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                 const TensorView& out, const TensorView& lse,
                 const attention::RunParams& params) noexcept;

  /// Freezes arena and workspace sizes (allocated now). Launches then use grids sized by
  /// graph_items_bound() of the planned batch, whose blocks read the real counts from the arena
  /// and exit past them. Requires a later plan() per step. A captured launch keeps the grid of
  /// the batch it was captured on, so a replayed plan must be of a batch with no more requests
  /// and query rows (the workers pad a replay to its graph's captured batch).
  void enable_graph_mode(const GraphCapacity& cap, const attention::AttentionShape& shape);
  bool graph_mode() const { return graph_mode_; }
  /// Later plans take the prefill path even for one query per request (ScheduleConfig).
  void set_force_prefill(bool on) { force_prefill_ = on; }

  /// Device slots for this step's out_cache_loc (the backend's KV append); capacity max_tokens.
  /// Uploaded with the plan by upload_cache_loc().
  void upload_cache_loc(std::span<const int32_t> loc);
  const int32_t* device_cache_loc() const;

  /// Kernel path of the current plan ("decode", "prefill", "generic", "mla_decode"); run() may
  /// still fall back to the generic kernel for layouts the tuned kernels cannot read.
  KernelPath path() const { return schedule_.path; }
  /// Kernel path the last run() launched: path(), or the generic kernel where the views' layout
  /// made run() fall back to it (kGeneric before any run()).
  KernelPath run_path() const { return run_path_; }
  /// Keys per split-KV chunk of the planned step (0 = not split).
  int split_chunk() const { return schedule_.chunk_tokens; }
  const Schedule& schedule() const { return schedule_; }
  cudaStream_t stream() const { return stream_; }

 private:
  struct Layout;  // arena offsets for the current capacities
  void ensure_capacity(int bs, int64_t pages, int items, int64_t mask_bytes, int tokens);
  void ensure_workspace(int partials, int hq, int dv);
  /// The planner's inputs for `shape` on this device with these options (no capacities).
  ScheduleConfig schedule_config(const attention::AttentionShape& shape) const;
  /// Graph mode: the most work items a plan of `shape` (`cfg`: its schedule_config) over `bs`
  /// requests and `tokens` query rows can have (a schedule never exceeds it: decode items fit
  /// one wave, prefill items are row tiles of >= 64 rows unless a split, which plan() caps at
  /// this bound); monotone in bs and tokens.
  int graph_items_bound(const attention::AttentionShape& shape, const ScheduleConfig& cfg, int bs,
                        int tokens) const;
  const float* device_sinks(std::span<const float> sinks, Status& st) noexcept;

  cudaStream_t stream_ = nullptr;
  KernelOptions options_;
  int sm_count_ = 132;
  bool graph_mode_ = false;
  bool force_prefill_ = false;
  KernelPath run_path_ = KernelPath::kGeneric;
  // capacities
  int cap_bs_ = 0, cap_items_ = 0, cap_tokens_ = 0;
  int64_t cap_pages_ = 0, cap_mask_ = 0;
  int64_t cap_partial_floats_ = 0;
  CudaBuffer arena_;
  PinnedBuffer staging_;
  CudaBuffer partial_o_, partial_lse_;
  cudaEvent_t upload_done_ = nullptr;
  /// Device copies of attention sinks, keyed by the host address and checked against the host
  /// values on every run (a caller may reuse an address for other values).
  struct SinksCopy {
    CudaBuffer buffer;
    std::vector<float> values;
  };
  std::unordered_map<const float*, SinksCopy> sinks_cache_;
  std::vector<CudaBuffer> retired_sinks_;  ///< replaced copies (queued work or graphs may read them)
  // current plan
  attention::AttentionShape shape_{};
  Schedule schedule_;
  int page_size_ = 1;
  int batch_size_ = 0;
  int nnz_qo_ = 0;
  int grid_items_ = 0;  ///< graph mode: graph_items_bound of this plan's batch
  int32_t max_page_id_ = -1;
  const int32_t* device_kv_indices_ = nullptr;  ///< plan_with_device_indices' (else the arena's)
  bool has_mask_ = false;
  /// Custom mask: the most visible keys a row has past its request's mask-free columns (a tree
  /// row's depth); a window shorter than this is refused (mask_rows.h: window_start).
  int32_t max_mask_tail_ = 0;
  bool planned_ = false;
  std::unique_ptr<Layout> layout_;
};

/// A CUDA BatchAttention on the default stream with `options`.
std::unique_ptr<attention::BatchAttention> make_cuda_batch_attention(
    const KernelOptions& options = {});

}  // namespace pagoda::backends::cuda
