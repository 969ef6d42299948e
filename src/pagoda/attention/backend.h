#pragma once
/// AttentionBackend: SGLang's backend interface in C++ (ARCHITECTURE §3, sglang_spec §1).
///
/// Life cycle per engine step:
///   backend.init_forward_metadata(batch);            // plan once per step (host work)
///   for each layer: backend.forward(q, k, v, layer, batch, out);   // run per layer
/// forward() writes the step's new K/V into the pool at batch.out_cache_loc first (unless
/// SaveKv::kNo), then attends over the paged cache, which then includes the new tokens.
///
/// CUDA graphs: init_cuda_graph_state(max_bs, max_tokens) once; per bucket
/// init_forward_metadata_capture_cuda_graph(batch) before capture; before each replay
/// init_forward_metadata_replay_cuda_graph(batch) rewrites the persistent buffers in place.
/// Padded requests use req_to_token row 0, seq_len cuda_graph_seq_len_fill_value() (1) and slot 0.
///
/// Threading: a backend instance is used by one thread at a time.
/// Errors: unsupported features/shapes throw Error(kUnsupported) naming what would work; bad
/// shapes throw Error(kInvalidArgument). A backend never produces wrong numbers silently.

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pagoda/attention/forward_batch.h"
#include "pagoda/attention/layer.h"
#include "pagoda/core/dtype.h"
#include "pagoda/core/tensor_view.h"

namespace pagoda::platform {
class Platform;
}
namespace pagoda::kv {
class KvPool;
class ReqToTokenTable;
}  // namespace pagoda::kv

namespace pagoda::attention {

struct IndexerMetadata;
struct IndexerQuery;

/// What a backend supports, as data (validation and the conformance matrix read it).
struct BackendCapabilities {
  std::vector<int> page_sizes;       ///< empty = any page size
  std::vector<int> head_dims;        ///< supported Dqk (and Dv) values; empty = any
  std::vector<DType> q_dtypes;       ///< query/output dtypes
  std::vector<DType> kv_dtypes;      ///< KV storage dtypes
  bool mha_gqa_mqa = true;
  bool mla = false;                  ///< absorbed MLA (576 / 512)
  bool sliding_window = false;
  bool logit_cap = false;
  bool sinks = false;
  bool non_causal = false;
  bool custom_mask = false;          ///< tree-mask target verify
  int max_topk = 1;                  ///< multi-step draft branching supported
  bool multi_step_draft = false;
  bool mixed_batches = false;
  bool cuda_graph = false;
  bool lse = false;                  ///< can return the softmax LSE
  /// DeepSeek sparse attention: get_indexer_metadata and set_sparse_topk (attention/dsa.h).
  bool dsa = false;
  /// DSA's lightning indexer over the pool's index keys: select_index_topk.
  bool dsa_indexer = false;
  /// save_kv, gather_kv and forward_ragged (MLA's expanded prefill form, model/decoder.h).
  bool ragged = false;
  std::string device = "cpu";        ///< "cpu" or "cuda"
};

/// Everything a backend holds for its lifetime (sglang HEAD: pools are given at construction).
struct BackendContext {
  platform::Platform* platform = nullptr;
  kv::KvPool* kv_pool = nullptr;
  kv::ReqToTokenTable* req_to_token = nullptr;
};

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  virtual std::string name() const = 0;
  virtual const BackendCapabilities& capabilities() const = 0;

  /// Plans the step (host work: CSR page tables, split-KV schedule, masks). Must be called before
  /// forward() for every new batch; the plan stays valid for all layers of that step.
  virtual void init_forward_metadata(const ForwardBatch& batch) = 0;

  /// Runs one layer. q [num_tokens, Hq, Dqk]; k [num_tokens, Hkv, Dqk] and v [num_tokens, Hkv, Dv]
  /// are the new tokens' K/V (ignored with SaveKv::kNo; for MLA k is the latent row and v is
  /// empty); out [num_tokens, Hq, Dv] is written. Dispatches by batch.mode: kIdle does nothing,
  /// kDecode -> forward_decode, every other mode -> forward_extend.
  void forward(const TensorView& q, const TensorView& k, const TensorView& v,
               const AttentionLayer& layer, const ForwardBatch& batch, const TensorView& out,
               SaveKv save = SaveKv::kYes);

  /// Optional LSE output of the next forward: [num_tokens, Hq] f32 (base 2). Empty = none.
  void set_lse_output(const TensorView& lse) { lse_ = lse; }

  // ---- DeepSeek sparse attention (capabilities().dsa; attention/dsa.h) ----
  /// The step's indexer metadata, built by init_forward_metadata when the pool holds index
  /// keys (KvPoolConfig::index_head_dim > 0); nullptr otherwise and on backends without DSA
  /// (the default), which a DSA model refuses.
  virtual const IndexerMetadata* get_indexer_metadata() const { return nullptr; }
  /// Restricts the next forward (one layer) to the positions the indexer selected: topk is
  /// [num_tokens, k] row-major, entries are positions < the row's visible count, -1 = unused.
  /// The default throws Error(kUnsupported)
  /// naming the backend (no sparse MLA).
  virtual void set_sparse_topk(std::span<const int32_t> topk, int k);
  /// The lightning indexer's selection for one layer of this step (capabilities().dsa_indexer):
  /// scores every position each row sees against the pool's stored index keys of `layer` and
  /// writes each row's k best positions to topk [num_tokens, k] and, when `scores` is not
  /// empty, their scores (attention/dsa.h index_topk_host states the math, the order and the
  /// padding). Call after init_forward_metadata; the result feeds set_sparse_topk. The default
  /// throws Error(kUnsupported) naming the backend.
  virtual void select_index_topk(LayerId layer, const IndexerQuery& q, int k,
                                 std::span<int32_t> topk, std::span<float> scores);
  /// The indexer's selection for `layer` applied to the next forward: select_index_topk, then
  /// set_sparse_topk with its result (their checks and errors). The default runs exactly those
  /// two through host memory; a GPU backend may keep the selection on its device (no host round
  /// trip: the cuda backend's).
  virtual void apply_index_topk(LayerId layer, const IndexerQuery& q, int k);

  // ---- Ragged attention (capabilities().ragged): K/V the caller computes from the pool ----
  // An extend step's attention over keys that are not the pool's rows as stored: MLA's
  // expanded (non-absorbed) prefill form expands the latent rows into per-head K/V through
  // kv_b_proj. Per layer: save_kv (the new rows into the pool), gather_kv (every key row the
  // step's requests see, out of the pool), the caller's transform, forward_ragged. kExtend and
  // kMixed steps only, planned by init_forward_metadata; the ragged plan (attention/paged_plan.h
  // build_ragged_plan) is built at the first gather_kv / forward_ragged of a step and of each
  // KeyWindows (a long prefix in windows: one plan per window, kept until another is asked for).
  // The defaults throw Error(kUnsupported) naming the backend.
  /// Writes the step's new K/V into the pool at batch.out_cache_loc, as forward() with
  /// SaveKv::kYes does first, and attends nothing (k, v as forward takes them).
  virtual void save_kv(const TensorView& k, const TensorView& v, const AttentionLayer& layer,
                       const ForwardBatch& batch);
  /// Copies the pool rows of the keys `windows` covers (forward_batch.h KeyWindows; all():
  /// every key the step's requests see) into k_out [n, Hkv, Dqk] and v_out [n, Hkv, Dv] (n = the
  /// windows' keys; request b's window positions in order, requests in batch order:
  /// build_ragged_plan's slots) in the pool's dtype, contiguous, on the pool's device. An MLA
  /// pool copies its latent rows [n, 1, kv_lora + rope] to k_out, and v_out must be empty.
  /// ForwardBatch::kv_start must be empty.
  virtual void gather_kv(const AttentionLayer& layer, const ForwardBatch& batch,
                         const KeyWindows& windows, const TensorView& k_out,
                         const TensorView& v_out);
  /// Attention of q [num_tokens, Hq, Dqk] over k [n, Hkv, Dqk] and v [n, Hkv, Dv] (gather_kv's
  /// rows for the same `windows`: request b's keys are rows [o_b, o_b + keys_b), o_b = Σ_{j<b}
  /// keys_j, in position order) into out [num_tokens, Hq, Dv], and into lse [num_tokens, Hq]
  /// (f32, base 2, BatchAttention's; empty: none), with the layer's window, soft cap and sinks:
  /// query i of request b (position extend_prefix_lens[b] + i) sees the keys at positions up to
  /// its own (every key of a prefix window). A query with no key gets out 0 and lse -inf, so
  /// the windows' states merge by LSE. k and v share a float dtype (their own, not the pool's;
  /// the layer's k_scale / v_scale are not applied) and may be strided per token and head with
  /// a contiguous last dimension; layer.is_mla must be false and its mask causal. Windows other
  /// than all() take no sinks or sliding window (kUnsupported: they do not split by keys). The
  /// pool is not read.
  virtual void forward_ragged(const TensorView& q, const TensorView& k, const TensorView& v,
                              const AttentionLayer& layer, const ForwardBatch& batch,
                              const KeyWindows& windows, const TensorView& out,
                              const TensorView& lse);

  virtual void forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                              const AttentionLayer& layer, const ForwardBatch& batch,
                              const TensorView& out, SaveKv save) = 0;
  virtual void forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                              const AttentionLayer& layer, const ForwardBatch& batch,
                              const TensorView& out, SaveKv save) = 0;

  // ---- CUDA-graph hooks (sglang_spec §7). Defaults throw Error(kUnsupported). ----
  /// Allocates persistent, address-stable buffers for batches up to max_bs requests and
  /// max_num_tokens query tokens.
  virtual void init_cuda_graph_state(int max_bs, int max_num_tokens);
  /// Plans a capture of `batch` (dummy lengths) into the persistent buffers.
  virtual void init_forward_metadata_capture_cuda_graph(const ForwardBatch& batch);
  /// Rewrites the persistent buffers in place for the real (padded) batch; no allocation.
  virtual void init_forward_metadata_replay_cuda_graph(const ForwardBatch& batch);
  /// seq_len written into padded rows of a graph batch.
  virtual int cuda_graph_seq_len_fill_value() const { return 1; }

 protected:
  TensorView lse_;
};

}  // namespace pagoda::attention
