#pragma once
/// LlamaWorker: the ModelWorker of a Llama-family model on one device (ARCHITECTURE §1). It owns
/// the KV pool, the attention backend (plus a second instance of it that serves captured decode
/// graphs), the Decoder (weights on the device, in the ops' dtype), the activations and the
/// graphs; it samples on the device and copies back only the sampled ids (and logits on request).
///
/// Step (run):
///   validate → stage ids, positions, logit-row indices and sampling params (one async copy each
///   from pinned memory) → plan (backend.init_forward_metadata, or the graph backend's replay
///   plan for a padded decode batch) → forward + sample (eager, or one graph replay) → copy the
///   ids back → wait.
/// Decode batches of size ≤ max_running_requests replay a graph captured per bucket
/// (cuda_graph_batch_sizes) when the ops support graphs and the backend does. Padded rows use
/// row 0, slot 0 and the backend's fill seq_len.
/// Speculative batches (verify_graph_tokens > 0): a kTargetVerify batch whose requests all have
/// n = spec.num_draft_tokens query tokens and the same r logit rows replays a graph keyed by
/// (n, r, bucket) — a third backend instance and its own activations, sized for
/// verify_graph_tokens tokens. The graph is captured lazily on the first batch of its key, with
/// that batch padded (pad_verify_batch): warm-up and capture recompute exactly the K/V the replay
/// writes, so capturing on live data is harmless. At most kMaxVerifyGraphs graphs; everything
/// else runs eagerly.
///
/// Hybrid models (Mamba2 layers): the worker also owns the state pool (state_slots slots, in the
/// platform's memory: a device kv::StatePool on CUDA) and the linear-attention backend of the
/// selection (make_linear_backend; f32 views on the platform's device); every batch names each
/// sequence's slot (WorkerBatch::state_slots). No graphs are captured for them, whatever
/// cuda_graph says: every step runs eagerly (no linear backend has capture / replay hooks).
/// DeepSeek sparse attention (DSA) models run eagerly too: each layer's top-k comes back to the
/// host, where the backend builds its sparse plan (model/dsa_indexer.h).
///
/// Thread rules: one thread. The model, ops, platform and table must outlive the worker.

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "pagoda/attention/registry.h"
#include "pagoda/backends/builtin.h"
#include "pagoda/dist/communicator.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/kv/swa_pages.h"
#include "pagoda/kv/swa_table.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/model/decoder.h"
#include "pagoda/model/llama.h"
#include "pagoda/model/model_ops.h"
#include "pagoda/model/worker.h"

namespace pagoda::model {

struct WorkerConfig {
  int32_t page_size = 16;
  int32_t num_pages = 2048;  ///< usable pages (page 0 is added on top)
  /// KV storage dtype; kF32 / kF16 / kBF16 / fp8 (per-layer scales 1). Must be supported by the
  /// backend.
  DType kv_dtype = DType::kF32;
  backends::BackendSelection backend{};
  /// Steps may mix extends and decodes (kMixed).
  bool mixed_batches = true;
  /// Capture decode graphs (only where the ops and the backend support them).
  bool cuda_graph = true;
  /// The largest decode batch (graph buckets up to it).
  int32_t max_batch_size = 64;
  /// Graphs for uniform kTargetVerify batches (verify and draft steps of speculative decoding)
  /// of at most this many query tokens (bucket × n); 0 = none. Needs cuda_graph and graph
  /// support. Costs activations for this many tokens and logit rows.
  int32_t verify_graph_tokens = 0;
  /// Hybrid models: the state pool's slots, one per running request plus the radix cache's
  /// state snapshots (engine: EngineConfig::max_mamba_cache_size); 0 = max_batch_size.
  int32_t state_slots = 0;
  /// Tensor parallelism: this rank's communicator (world size > 1; must outlive the worker).
  /// The worker then holds its rank's shard (Decoder) and a KV pool of Hkv/N heads. Every rank's
  /// worker must be given the same batches in the same order (TpLeaderWorker does that).
  dist::Communicator* comm = nullptr;
  /// The sliding-window pool (docs/design/kv.md §SWA): when set, layers with a window keep their
  /// K/V in a second KvPool of swa->swa().num_pages() pages and attend through a second backend
  /// over a second request table that holds SWA slots (full slot s -> swa->swa_slot(s)); the
  /// full layers keep the pool above. The scheduler keeps every position a window layer reads
  /// mapped. Not with `comm` or CUDA graphs (refused / off). Must outlive the worker.
  const kv::SwaPages* swa = nullptr;
  /// The GEMM mode of the CPU ops a worker factory builds for this worker (engine's
  /// make_model_ops; tensor-parallel ranks build their own). The worker itself takes its ops
  /// ready-made and does not read it.
  CpuGemm cpu_gemm = CpuGemm::kOpenBlas;
  /// MLA models: how extend steps are computed, and the expanded form's keys per window
  /// (Decoder::set_mla_prefill).
  MlaPrefill mla_prefill = MlaPrefill::kAuto;
  int64_t mla_window_keys = 0;
};

class LlamaWorker final : public ModelWorker {
 public:
  /// Builds the pool, backend(s), decoder and graphs. Throws Error naming what is wrong (a
  /// backend that cannot serve the model lists those that would).
  LlamaWorker(const LlamaModel& model, std::unique_ptr<ModelOps> ops, const WorkerConfig& config,
              kv::ReqToTokenTable& table);
  ~LlamaWorker() override;
  LlamaWorker(const LlamaWorker&) = delete;
  LlamaWorker& operator=(const LlamaWorker&) = delete;

  WorkerOutput run(const WorkerBatch& batch) override;
  kv::KvPool& kv_pool() override { return *pool_; }
  /// A hybrid model's state pool: WorkerConfig::state_slots slots, one layer per Mamba2 layer.
  kv::StatePool* state_pool() override { return state_pool_.get(); }
  /// ModelOps::move_rows over every layer's K and V buffers when the ops have it (CUDA: two
  /// launches, no host sync), else KvPool::move_kv.
  void move_kv(std::span<const SlotIndex> src, std::span<const SlotIndex> dst) override;
  std::string backend_name() const override { return backend_->name(); }
  WorkerStats stats() const override { return stats_; }
  /// Captured speculative (kTargetVerify) graphs.
  int num_verify_graphs() const { return static_cast<int>(verify_graphs_.size()); }
  static constexpr int kMaxVerifyGraphs = 48;
  /// Largest WorkerBatch::top_k.
  static constexpr int kMaxTopK = 16;

 private:
  struct Staging;
  void validate(const WorkerBatch& b) const;
  /// Host → device copies of ids, positions, row indices, params and token masks
  /// (WorkerBatch::mask_rows / token_mask; at most a.rows) into `a`.
  void stage(Activations& a, std::span<const int32_t> ids, std::span<const int32_t> positions,
             std::span<const int32_t> cache_loc, std::span<const int32_t> rows,
             std::span<const SampleRow> params, std::span<const int32_t> mask_rows,
             std::span<const uint32_t> mask);
  /// Copies the sampled ids back (plus the logits / top-k the batch asks for) and waits.
  WorkerOutput finish(Activations& a, int64_t rows, const WorkerBatch& b);
  /// Applies b.logit_adjust to a's logits (uploaded through adjust_dev_); nothing when empty.
  void adjust_logits(Activations& a, const WorkerBatch& b);
  void capture_graphs();
  /// Captures forward + sample of `f` (already staged in `a`) on `backend`: one eager forward
  /// first unless `shape_known` (then set), the capture hook, two warm-ups, the capture.
  std::unique_ptr<ModelOps::Graph> capture_step(Activations& a, const attention::ForwardBatch& f,
                                                attention::AttentionBackend& backend, int64_t t,
                                                int64_t rows, bool& shape_known);
  /// The Mamba2 layers' side of `b` (null for a model without them); valid until the next call.
  const StateSide* state_side(const WorkerBatch& b);
  /// An eager step that also copies WorkerBatch::hidden_layers out (EAGLE features).
  WorkerOutput run_with_hidden(const WorkerBatch& b, int64_t t, int64_t nrows);
  /// The graph path of a uniform verify batch; false (nothing done) when it does not apply.
  bool run_verify_graph(const WorkerBatch& b, int64_t nrows, WorkerOutput& out);

  /// With an SWA pool: brings the SWA table's rows of `f`'s requests up to date (kv::SwaTable,
  /// incremental) and returns the window layers' batch (out_cache_loc in SWA slots, kv_start at
  /// each request's window's first page except in a verify step).
  const attention::ForwardBatch& window_batch(const attention::ForwardBatch& f);

  const LlamaModel* model_;
  std::unique_ptr<ModelOps> ops_;
  WorkerConfig config_;
  platform::Platform* platform_;
  std::unique_ptr<kv::KvPool> pool_;
  std::unique_ptr<kv::StatePool> state_pool_;  ///< hybrid models only
  /// Hybrid models only: the Mamba2 layers' recurrence (backends::make_linear_backend).
  std::unique_ptr<attention::LinearAttentionBackend> linear_backend_;
  std::vector<Mamba2Seq> state_seqs_;          ///< the step's StateSide sequences
  StateSide state_side_;
  attention::BackendRegistry registry_;
  std::unique_ptr<attention::AttentionBackend> backend_;
  std::unique_ptr<attention::AttentionBackend> graph_backend_;
  std::unique_ptr<Decoder> decoder_;
  /// The SWA side (config.swa): pool, table of SWA slots, backend, the step's window batch.
  std::unique_ptr<kv::KvPool> swa_pool_;
  std::unique_ptr<kv::SwaTable> swa_table_;
  std::unique_ptr<attention::AttentionBackend> swa_backend_;
  attention::ForwardBatch swa_batch_;
  int swa_window_ = 0;  ///< the largest window_left of the model's layers
  Activations eager_, graph_acts_;
  std::unique_ptr<Staging> staging_;
  std::vector<int> buckets_;
  std::vector<std::unique_ptr<ModelOps::Graph>> graphs_;  ///< parallel to buckets_
  /// Speculative graphs: key (n tokens per request, r logit rows per request, bucket).
  std::unique_ptr<attention::AttentionBackend> verify_backend_;
  Activations verify_acts_;
  std::map<std::array<int, 3>, std::unique_ptr<ModelOps::Graph>> verify_graphs_;
  bool verify_shape_known_ = false;
  /// Device buffer of captured hidden states (run_with_hidden; grow-only).
  platform::DeviceBuffer hidden_buf_;
  size_t hidden_cap_ = 0;
  platform::DeviceBuffer topk_dev_;  ///< top-k ids then log-probs of the last step's rows
  size_t topk_dev_bytes_ = 0;
  platform::DeviceBuffer adjust_dev_;  ///< the last step's WorkerBatch::logit_adjust (grow-only)
  size_t adjust_dev_bytes_ = 0;
  // Host scratch, reused per step.
  std::vector<int32_t> rows_, ids_;
  std::vector<SampleRow> params_;
  WorkerStats stats_;
};

/// The backend requirements of `model` with activations `q_dtype` and KV `kv_dtype`.
attention::BackendRequirements worker_backend_requirements(const LlamaModel& model,
                                                           const WorkerConfig& config,
                                                           DType q_dtype,
                                                           const std::string& device);

/// SGLang's decode CUDA-graph batch sizes without speculative decoding (sglang_spec §7):
/// [1, 2, 4, 8, 12] + 16..256 step 8 + 272..511 step 16 + 512..max step 32, truncated to
/// max_bs, with max_bs appended when missing. Requires max_bs >= 1.
std::vector<int> cuda_graph_batch_sizes(int max_bs);

/// Pads a kDecode batch to `bucket_bs` requests: padded rows use req_to_token row 0, seq_len
/// `fill_seq_len`, position fill_seq_len - 1 and slot 0 (the reserved dummy). Requires
/// bucket_bs >= batch.batch_size and a kDecode batch (Error(kInvalidArgument) otherwise).
void pad_decode_batch(attention::ForwardBatch& batch, int bucket_bs, int fill_seq_len);

/// Pads a uniform kTargetVerify batch (every extend_seq_len == spec.num_draft_tokens = n,
/// batch_size >= 1) to `bucket_bs` requests: each padded request repeats request 0's row,
/// lengths, positions and tree-mask block (so its plan is valid for any page size), with input
/// slots 0 (the reserved dummy) for its n tokens. The padded requests read request 0's K/V and
/// write only slot 0. Error(kInvalidArgument) for another mode, a non-uniform or empty batch,
/// or bucket_bs < batch_size.
void pad_verify_batch(attention::ForwardBatch& batch, int bucket_bs);

}  // namespace pagoda::model
