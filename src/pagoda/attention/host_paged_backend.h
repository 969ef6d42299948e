#pragma once
/// HostPagedBackend: an AttentionBackend for host KV pools over any BatchAttention. It is the
/// whole backend logic the reference and cpu backends share:
///   init_forward_metadata: build_paged_plan (ForwardBatch + ReqToTokenTable -> CSR), once/step;
///   forward (per layer):   validate tensors, write the new K/V (save_new_kv), plan the
///                          BatchAttention for the layer's shape (only when it differs from the
///                          last one planned this step), run it over the pool's paged views.
/// With index keys in the pool (DSA) init_forward_metadata also builds the IndexerMetadata, and a
/// forward after set_sparse_topk plans the BatchAttention once more for that layer's selection
/// (attention/dsa.h), on the backend's SparseAttentionPath: the step's plan with the custom mask
/// of the selected positions (kMask), or the gather plan over the selected slots only, the pool
/// viewed token-granular (kGather, O(k) per row). Either way every BatchAttention serves sparse
/// MLA unchanged; a sparse forward of a layer with a sliding window is Error(kUnsupported).
/// select_index_topk runs the indexer's scores and top-k on the host (index_topk_host).
/// Ragged attention (backend.h): save_kv is save_new_kv; gather_kv copies the pool rows of the
/// step's build_ragged_plan (built at the first call of the step and windows); forward_ragged plans
/// the BatchAttention on that plan (once per step and shape while no forward re-plans it) over the
/// caller's K/V viewed as page-size-1 caches (the next forward re-plans the step's paged plan).
/// A backend is a name, its capabilities and the BatchAttention that does the arithmetic.
/// One caller thread at a time; no CUDA graphs (the hooks throw Error(kUnsupported)).

#include <memory>
#include <optional>
#include <string>

#include "pagoda/attention/backend.h"
#include "pagoda/attention/batch_attention.h"
#include "pagoda/attention/dsa.h"
#include "pagoda/attention/paged_plan.h"

namespace pagoda::attention {

/// Capabilities of a backend that implements every BatchAttention feature: f32/f16/bf16 queries,
/// f32/f16/bf16/fp8 KV, MLA, window, soft cap, sinks, non-causal, tree mask, multi-step draft
/// with any topk, mixed batches, LSE, DSA, any page size and head dim; device "cpu", no CUDA graphs
/// (a device backend sets those two on top).
BackendCapabilities full_feature_capabilities();

class HostPagedBackend : public AttentionBackend {
 public:
  /// `ctx.kv_pool` and `ctx.req_to_token` must be non-null host objects that outlive the backend
  /// (Error(kInvalidArgument) otherwise; Error(kUnsupported) for a device pool).
  /// `sparse_path`: how a forward after set_sparse_topk runs (the reference backend keeps
  /// kMask, the cpu backend takes kGather).
  /// `indexer_faults`: the conformance mutants' indexer faults (none by default).
  HostPagedBackend(const BackendContext& ctx, std::string name, BackendCapabilities caps,
                   std::unique_ptr<BatchAttention> attention,
                   SparseAttentionPath sparse_path = SparseAttentionPath::kMask,
                   IndexerFaults indexer_faults = {});

  std::string name() const override { return name_; }
  const BackendCapabilities& capabilities() const override { return caps_; }
  /// Builds the step's PagedPlan; throws on bad input, keeping the previous plan.
  void init_forward_metadata(const ForwardBatch& batch) override;
  void forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                      const AttentionLayer& layer, const ForwardBatch& batch,
                      const TensorView& out, SaveKv save) override;
  void forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                      const AttentionLayer& layer, const ForwardBatch& batch,
                      const TensorView& out, SaveKv save) override;
  const IndexerMetadata* get_indexer_metadata() const override {
    return indexer_ ? &*indexer_ : nullptr;
  }
  void set_sparse_topk(std::span<const int32_t> topk, int k) override;
  void save_kv(const TensorView& k, const TensorView& v, const AttentionLayer& layer,
               const ForwardBatch& batch) override;
  void gather_kv(const AttentionLayer& layer, const ForwardBatch& batch, const KeyWindows& windows,
                 const TensorView& k_out, const TensorView& v_out) override;
  void forward_ragged(const TensorView& q, const TensorView& k, const TensorView& v,
                      const AttentionLayer& layer, const ForwardBatch& batch,
                      const KeyWindows& windows, const TensorView& out,
                      const TensorView& lse) override;
  /// index_topk_host over the context's pool and this step's indexer metadata.
  void select_index_topk(LayerId layer, const IndexerQuery& q, int k, std::span<int32_t> topk,
                         std::span<float> scores) override;

 private:
  /// Error(kFailedPrecondition) unless init_forward_metadata planned `batch` (`what` names the
  /// call).
  void require_planned(const ForwardBatch& batch, const char* what) const;
  /// The index in ragged_ of the step's plan for `windows` (built on first use).
  size_t ragged(const ForwardBatch& batch, const KeyWindows& windows);
  void run(const TensorView& q, const TensorView& k, const TensorView& v,
           const AttentionLayer& layer, const ForwardBatch& batch, const TensorView& out,
           SaveKv save);

  BackendContext ctx_;
  std::string name_;
  std::string who_;  ///< "backend '<name>'", the start of the ragged calls' messages
  BackendCapabilities caps_;
  std::unique_ptr<BatchAttention> attn_;
  SparseAttentionPath sparse_path_;
  IndexerFaults indexer_faults_;
  PagedPlan plan_;
  bool planned_ = false;
  std::optional<AttentionShape> planned_shape_;  ///< shape attn_ is planned for this step
  ForwardMode planned_mode_ = ForwardMode::kIdle;
  int planned_tokens_ = 0;
  std::optional<IndexerMetadata> indexer_;  ///< DSA pools only
  bool sparse_next_ = false;                 ///< the next forward uses sparse_plan_
  PagedPlan sparse_plan_;  ///< the selection's plan (kMask: plan_ + mask; kGather: per row)
  RaggedPlans ragged_;     ///< this step's, one per windows a ragged call asked for
  /// The ragged plan (index in ragged_) and shape attn_ holds.
  std::optional<std::pair<size_t, AttentionShape>> ragged_planned_;
};

}  // namespace pagoda::attention
