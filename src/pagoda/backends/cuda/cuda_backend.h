#pragma once
/// CudaBackend: the AttentionBackend of the GPU (ARCHITECTURE §3) over CudaBatchAttention.
///
/// init_forward_metadata builds the CSR table with build_paged_plan on the host and uploads it
/// (plus out_cache_loc) once per step into persistent device buffers; forward() appends the new
/// K/V with the CUDA append kernel (fp8 pools store x / scale) and runs the planned kernel.
/// The split-KV schedule depends on the layer shape (heads, dims, dtypes): it is planned in
/// init_forward_metadata with the shape of the last forward, or at the first forward of a step.
///
/// CUDA graphs: init_cuda_graph_state(max_bs, max_tokens) records capacities; the first
/// capture hook freezes them (needs one eager forward before, so the layer shape is known);
/// capture and replay hooks re-plan into the same addresses; launches use capacity-sized grids
/// whose blocks read the real counts. Capture on stream(). Not thread-safe.
/// Graphable modes: kDecode, kTargetVerify, kIdle and kDraftExtend. A kDraftExtend graph is
/// captured for a bucket of B requests and N tokens (e.g. B * (num_steps + 1)); a replay batch
/// has at most B requests (padded with row-0, 1-token requests) and at most N tokens, any
/// accepted counts: the prefill kernel is kept (never the decode one, even when every request
/// accepted one token), and the captured K/V append's rows past the batch's tokens write slot 0
/// (N must not exceed init_cuda_graph_state's max_num_tokens).
///
/// DeepSeek sparse attention (attention/dsa.h): with a pool of index keys, init_forward_metadata
/// also builds the step's IndexerMetadata and uploads what the indexer kernels read (the step's
/// page table, per row its offset in it, visible and seen counts, tree bits: no per-token
/// array). After set_sparse_topk (host selection) or apply_index_topk (device selection) the
/// next forward runs a second CudaBatchAttention on a gather plan (each query row a request of
/// its own over its selected slots, page size 1; MLA: the decode kernels), so the dense plan
/// stays planned. CUDA graphs (decode steps, cuda_backend_dsa.cpp): in graph mode the indexer
/// always selects (IndexerMetadata::always_select), its buffers have the graph's capacities
/// (the score rows strided by the request table's context length), and the capture and replay
/// hooks plan the step's device sparse plan, so a captured DSA layer replays at any context.
/// set_sparse_topk and select_index_topk stay eager (host round trips).
///
/// Ragged attention (backend.h; eager extend steps): save_kv is the append kernel; gather_kv
/// uploads the build_ragged_plan slots of each KeyWindows once a step (at its first ragged call)
/// and copies the pool rows with one gather launch per buffer; forward_ragged runs a
/// CudaBatchAttention of that plan, planned once per step and shape (the 192/128 MLA prefill:
/// the sm90 prefill kernel). Each distinct windows of the step keeps its plan, slots and
/// CudaBatchAttention (reused across steps), so the expanded form's key windows re-plan nothing
/// across layers (a re-plan waits for the stream's earlier work: once per window and layer it
/// would serialise the host and the GPU).

#include <cuda_runtime_api.h>

#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "pagoda/attention/backend.h"
#include "pagoda/attention/dsa.h"
#include "pagoda/attention/paged_plan.h"
#include "pagoda/attention/registry.h"
#include "pagoda/backends/cuda/cuda_batch_attention.h"
#include "pagoda/backends/cuda/cuda_memory.h"

namespace pagoda::backends {

class CudaBackend final : public attention::AttentionBackend {
 public:
  /// `ctx.kv_pool` must live on a CUDA device and `ctx.req_to_token` be non-null (both outlive
  /// the backend); Error(kInvalidArgument / kUnsupported) otherwise. Uses the CudaPlatform's
  /// stream when ctx.platform is one, else its own stream. `kernels` chooses the kernel variants
  /// with the device's capabilities (CudaBatchAttention).
  explicit CudaBackend(const attention::BackendContext& ctx, const KernelOptions& kernels = {});
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  const attention::BackendCapabilities& capabilities() const override;
  void init_forward_metadata(const attention::ForwardBatch& batch) override;
  void forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                      const attention::AttentionLayer& layer, const attention::ForwardBatch& batch,
                      const TensorView& out, attention::SaveKv save) override;
  void forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                      const attention::AttentionLayer& layer, const attention::ForwardBatch& batch,
                      const TensorView& out, attention::SaveKv save) override;

  const attention::IndexerMetadata* get_indexer_metadata() const override {
    return indexer_ ? &*indexer_ : nullptr;
  }
  void set_sparse_topk(std::span<const int32_t> topk, int k) override;
  /// The indexer on the GPU (kernels/cuda/dsa_indexer.h: tensor-core scores at f32 precision, a
  /// radix select): the step's metadata is on the device since init_forward_metadata (uploaded
  /// once, read by every layer); q and w in host memory are uploaded, in device memory read in
  /// place; the results come back to the host with a stream synchronisation (an eager step);
  /// rows in chunks of at most 2^24 scores. kUnsupported past the kernels' limits
  /// (index_head_dim over 128 or not a multiple of 4, over 128 index heads, k over 4,096).
  void select_index_topk(LayerId layer, const attention::IndexerQuery& q, int k,
                         std::span<int32_t> topk, std::span<float> scores) override;
  /// The same kernels with the selection kept on the device: the top-k kernel writes each row's
  /// selected slots into the step's one sparse plan (attention/dsa.h sparse_gather_shape, planned
  /// at the first sparse forward of the step and kept while every forward is sparse), so a layer
  /// costs its kernels only: no host round trip, no synchronisation, no per-layer plan.
  void apply_index_topk(LayerId layer, const attention::IndexerQuery& q, int k) override;

  void save_kv(const TensorView& k, const TensorView& v, const attention::AttentionLayer& layer,
               const attention::ForwardBatch& batch) override;
  void gather_kv(const attention::AttentionLayer& layer, const attention::ForwardBatch& batch,
                 const attention::KeyWindows& windows, const TensorView& k_out,
                 const TensorView& v_out) override;
  void forward_ragged(const TensorView& q, const TensorView& k, const TensorView& v,
                      const attention::AttentionLayer& layer, const attention::ForwardBatch& batch,
                      const attention::KeyWindows& windows, const TensorView& out,
                      const TensorView& lse) override;

  void init_cuda_graph_state(int max_bs, int max_num_tokens) override;
  void init_forward_metadata_capture_cuda_graph(const attention::ForwardBatch& batch) override;
  void init_forward_metadata_replay_cuda_graph(const attention::ForwardBatch& batch) override;

  /// The stream every launch goes to (capture graphs on it).
  cudaStream_t stream() const { return stream_; }
  /// The kernel-level object (tests and benchmarks inspect the schedule).
  const cuda::CudaBatchAttention& batch_attention() const { return *attn_; }

  static attention::BackendCapabilities static_capabilities();

 private:
  /// Plans `batch` and uploads `cache_loc` (its out_cache_loc, or that padded with slot 0).
  void plan_step(const attention::ForwardBatch& batch, std::span<const int32_t> cache_loc);
  /// The capture / replay plan; kDraftExtend: the prefill kernel kept, out_cache_loc padded
  /// with slot 0 to the graph's token capacity.
  void plan_graph_step(const attention::ForwardBatch& batch);
  void run(const TensorView& q, const TensorView& k, const TensorView& v,
           const attention::AttentionLayer& layer, const attention::ForwardBatch& batch,
           const TensorView& out, attention::SaveKv save);
  attention::AttentionShape shape_for(const attention::AttentionLayer& layer, const TensorView& q,
                                      const TensorView& out) const;
  /// Error(kFailedPrecondition) unless `batch` is the planned step (`what` names the call).
  void require_planned(const attention::ForwardBatch& batch, const char* what) const;
  /// A ragged plan's device side: its slots and the attention that runs it (planned for
  /// `planned`); ragged_dev_[i] serves ragged_[i], and is kept for the next steps' plan i.
  struct RaggedDevice {
    cuda::CudaBuffer slots;
    std::unique_ptr<cuda::CudaBatchAttention> attn;
    std::optional<attention::AttentionShape> planned;
  };
  /// The index of the step's plan for `windows`, its slots uploaded when it is new (eager only).
  size_t ragged(const attention::ForwardBatch& batch, const attention::KeyWindows& windows);
  void append_kv(const attention::AttentionLayer& layer, const TensorView& k, const TensorView& v,
                 int num_tokens);

  attention::BackendContext ctx_;
  cudaStream_t stream_ = nullptr;
  bool own_stream_ = false;
  std::unique_ptr<cuda::CudaBatchAttention> attn_;
  attention::PagedPlan plan_;
  bool planned_ = false;
  attention::ForwardMode planned_mode_ = attention::ForwardMode::kIdle;
  int planned_tokens_ = 0;
  std::optional<attention::AttentionShape> shape_;      ///< shape of the uploaded schedule
  std::optional<attention::AttentionShape> last_shape_; ///< shape of the last forward
  int graph_max_bs_ = 0, graph_max_tokens_ = 0;
  int64_t graph_max_pages_ = 0;  ///< the dense plan's page capacity (graph mode)
  std::optional<attention::IndexerMetadata> indexer_;  ///< this step's (pools with index keys)
  attention::PagedPlan sparse_plan_;                    ///< set_sparse_topk's gather plan
  bool sparse_next_ = false;                            ///< the next forward runs sparse_plan_
  /// The step's indexer metadata on the device (upload_indexer_metadata): byte offsets of the
  /// arrays DsaIndexArgs reads, all rows; in graph mode laid out once for the capacities.
  struct IndexMetaDevice {
    cuda::CudaBuffer buffer;
    size_t pages = 0, page_begin = 0, visible = 0, seen = 0, tree_begin = 0, tree_bits = 0;
    bool fixed = false;  ///< graph mode: the layout of the capacities, never moved
  };
  void upload_indexer_metadata();
  /// The step's IndexerMetadata::slots from the dense plan's page table (init_forward_metadata
  /// builds it without them; set_sparse_topk's host plan needs them).
  void fill_indexer_slots();
  /// The step's device sparse plan for k (sparse_gather_shape; its kv_indptr uploaded to
  /// sparse_device_, which graph mode sizes for its capacities once).
  void prepare_sparse_shape(int k);
  /// Plans sparse_attn_ on the device sparse plan for `shape` (graph mode: its capacities first).
  void plan_device_sparse(const attention::AttentionShape& shape);
  /// Graph mode (capture and replay hooks, after plan_step): the indexer always selects, and
  /// once a capture has run a selection, the step's device sparse plan is planned here (a
  /// replay runs no host code in the forward).
  void plan_graph_sparse();
  /// Whether stream() is capturing a CUDA graph.
  bool capturing() const;
  /// select_index_topk's and apply_index_topk's checks.
  void check_indexer_call(const attention::IndexerQuery& q, int k, size_t topk_size,
                          size_t scores_size) const;
  /// The indexer's launches: results to the host spans, or (slot_out_begin: the sparse plan's
  /// kv_indptr on the device) the selected slots to sparse_slots() with no synchronisation.
  void index_topk(LayerId layer, const attention::IndexerQuery& q, int k, std::span<int32_t> topk,
                  std::span<float> scores, const int32_t* slot_out_begin);
  /// The device sparse plan's kv_indices (after its kv_indptr in sparse_device_).
  int32_t* sparse_slots();
  IndexMetaDevice index_meta_;
  bool sparse_on_device_ = false;      ///< the next sparse forward uses sparse_shape_
  attention::PagedPlan sparse_shape_;  ///< the step's device sparse plan (kv_indices on device)
  int sparse_shape_k_ = 0;             ///< its k (0: none this step)
  /// The shape sparse_shape_ is planned with in sparse_attn_ (reset by any other plan).
  std::optional<attention::AttentionShape> sparse_planned_;
  std::unique_ptr<cuda::CudaBatchAttention> sparse_attn_;  ///< sparse forwards' kernels
  int graph_dsa_k_ = 0;  ///< graph mode: the k of the captured selections (0: none yet)
  std::optional<attention::AttentionShape> graph_sparse_shape_;  ///< ... and their shape
  cuda::CudaBuffer sparse_device_;  ///< [rows + 1] kv_indptr, then the selected slots
  cuda::CudaBuffer index_scratch_;  ///< select_index_topk's per-layer arrays (q, w, scores, out)
  KernelOptions kernels_;
  attention::RaggedPlans ragged_;  ///< this step's, one per windows a ragged call asked for
  std::vector<RaggedDevice> ragged_dev_;
};

/// Registers "cuda" in `registry`; its factory builds CudaBackend(ctx, kernels) (and throws
/// Error(kUnsupported) without a GPU). One backend for every NVIDIA device: the Hopper kernels
/// are variants its plan chooses (docs/design/cuda_backend.md "Why one cuda backend").
void register_cuda_backend(attention::BackendRegistry& registry, const KernelOptions& kernels = {});

}  // namespace pagoda::backends
