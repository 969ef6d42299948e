#pragma once
/// Decoder: the Llama-family layer loop, written once over ModelOps (ARCHITECTURE §1). It owns
/// the model's weights as the ops store them (dtype and device of the ops) and runs
///
///   residual = embed[ids]·embed_scale; h = rms_norm(residual)·w_in           (layer 0)
///   per layer: qkv = h·Wqkvᵀ (+ bias); [q, k = rms_norm per head·w_q / w_k]; q, k = rope(q, k,
///              positions) with the layer's RoPE table;
///              o = backend.forward(q, k, v, layer, batch)   (writes K/V at out_cache_loc);
///              x = o·Woᵀ; [x = rms_norm(x)·w_attn_out]; residual += x;
///              h = rms_norm(residual)·w_post;
///              x = (act(h·Wgᵀ) * h·Wuᵀ)·Wdᵀ; [x = rms_norm(x)·w_mlp_out]; residual += x;
///              h = rms_norm(residual)·w_in(next)
///   logits[r] = soft_cap(rms_norm(residual[rows[r]])·W_lmᵀ)    (f32)
/// A hybrid model's Mamba2 layers (config.is_linear_layer: Bamba) replace those lines by the
/// Mamba2Mixer over the step's StateSide (x = mixer(h): its projections and norm here, the
/// recurrence on the side's linear-attention backend, reading and updating each sequence's
/// state slot); ops with the Mamba2 dense ops (ModelOps::supports_mamba_ops: the CPU and CUDA
/// ops) and no tensor parallelism only (Error(kUnsupported) at construction otherwise, naming
/// the hybrid state pool or the ops).
/// DeepSeek's MLA layers replace the qkv / rope / attention / o_proj lines by mla_attention
/// (decoder_mla.cpp): the absorbed form over the latent pool for decode, verify and draft steps,
/// and for extend steps the expanded form (per-head K/V from the gathered latent rows through
/// kv_b_proj, ragged attention) where expanded_mla_keys allows it (MlaPrefill); needs
/// ModelOps::supports_mla_ops; no tensor parallelism. DSA models (config.is_dsa()) run
/// DeepSeek-V3.2's lightning indexer first (dsa_indexer.h: index keys into the pool, top-k handed
/// to the backend's sparse hook); CPU ops and a KV pool only (Error(kUnsupported) at construction
/// otherwise). The bracketed steps are Gemma's (config.qk_norm, config.sandwich_norms; act is SiLU
/// or GeGLU per config.activation); they need ModelOps::supports_gemma_ops (Error(kUnsupported)
/// naming the device otherwise, at construction).
///
/// The residual stream is f32 whatever the weight dtype. forward() only enqueues work on the
/// ops' stream: it is capturable into a CUDA graph when the backend's plan is (the worker
/// captures it per decode bucket).
///
/// Tensor parallelism (a Communicator of world size N > 1; Megatron-style, as SGLang): rank r
/// keeps q heads [r·Hq/N, (r+1)·Hq/N) and the matching KV heads, gate/up rows and o/down
/// columns, and vocabulary rows [r·V/N, (r+1)·V/N) of the embedding and LM head. The embedding
/// (zeros outside the shard), o_proj and down_proj outputs are all-reduced (sum) over the group,
/// so every rank holds the full residual stream; the LM head's shard logits are all-gathered and
/// interleaved, so every rank holds the full logits. Requires Hq, Hkv, intermediate and vocab
/// divisible by N (Error(kUnsupported) naming the first that is not).
///
/// Thread rules: one thread; the model and ops must outlive the decoder.

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "pagoda/attention/backend.h"
#include "pagoda/attention/forward_batch.h"
#include "pagoda/dist/communicator.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/kv/state_pool.h"
#include "pagoda/model/llama.h"
#include "pagoda/model/mamba2_mixer.h"
#include "pagoda/model/model_ops.h"
#include "pagoda/platform/platform.h"

namespace pagoda::model {

class DsaIndexer;

/// How MLA layers compute extend steps (decode, verify and draft steps are always absorbed).
enum class MlaPrefill : uint8_t {
  kAuto,      ///< the expanded form where Decoder::expanded_mla_keys allows it, else absorbed
  kAbsorbed,  ///< the absorbed form always
};

/// Device activations for up to `tokens` query rows and `rows` logit rows. Grow-only; the
/// graph runner keeps one fixed instance so captured addresses stay valid.
struct Activations {
  int64_t tokens = 0;
  int64_t rows = 0;
  platform::DeviceBuffer residual, x, h, qkv, q, k, v, attn, mlp, act, sel, logits;
  /// MLA models only: the attention block's scratch (Decoder::mla_attention's layout), and the
  /// expanded form's gathered latent rows and K / V for up to mla_keys keys (Decoder::reserve's
  /// mla_keys; none: every step absorbed).
  platform::DeviceBuffer mla, mla_kv;
  int64_t mla_keys = 0;
  /// DSA models only: the indexer's f32 scratch (DsaIndexer::scratch_floats of tokens).
  platform::DeviceBuffer dsa;
  /// Tensor parallelism only: this rank's vocabulary shard of the logits [rows, V/N] and the
  /// all-gathered shards [N, rows, V/N] (f32).
  platform::DeviceBuffer shard_logits, gathered;
  /// Device ints: ids [tokens], positions [tokens], out_cache_loc [tokens], logit row index
  /// [rows], token-mask count [1], token-mask rows [rows], out ids [rows].
  platform::DeviceBuffer ints;
  /// Device sampling parameters [rows].
  platform::DeviceBuffer sample_params;
  /// Device token masks [rows, token_mask_words(vocab)] (ModelOps::mask_logits), the first
  /// *mask_count() of them in use.
  platform::DeviceBuffer token_mask;
  int32_t* ids() const { return static_cast<int32_t*>(ints.get()); }
  int32_t* positions() const { return ids() + tokens; }
  int32_t* cache_loc() const { return ids() + 2 * tokens; }
  int32_t* logit_rows() const { return ids() + 3 * tokens; }
  int32_t* mask_count() const { return ids() + 3 * tokens + rows; }
  int32_t* mask_rows() const { return ids() + 3 * tokens + rows + 1; }
  int32_t* out_ids() const { return ids() + 3 * tokens + 2 * rows + 1; }
  float* logits_f32() const { return static_cast<float*>(logits.get()); }
  SampleRow* params() const { return static_cast<SampleRow*>(sample_params.get()); }
  uint32_t* mask_words() const { return static_cast<uint32_t*>(token_mask.get()); }
};

/// Layer outputs a forward copies out (EAGLE features): the residual stream after layer
/// layers[k] goes to columns [k·H, (k+1)·H) of dst [tokens, layers.size()·H] (f32, device).
struct HiddenCapture {
  std::span<const int32_t> layers;
  float* dst = nullptr;
};

/// The window layers' side of a step on the SWA pool: their backend and batch.
struct WindowSide {
  attention::AttentionBackend* backend = nullptr;
  const attention::ForwardBatch* batch = nullptr;
};

/// The Mamba2 layers' side of a step on a hybrid model: the state pool (one layer per Mamba2
/// layer, in layer order), in batch order each sequence's state slot and query-token count, and
/// the linear-attention backend that runs their recurrence (forward() plans it once per step).
struct StateSide {
  kv::StatePool* pool = nullptr;
  std::span<const Mamba2Seq> seqs;
  attention::LinearAttentionBackend* backend = nullptr;
};

class Decoder {
 public:
  /// Uploads the weights of `model` through `ops` (converted to ops.dtype()). With `kv_pool`
  /// (an MHA pool on the ops' device in the ops' dtype) the new K/V go into the cache from the
  /// RoPE kernel (ModelOps::qkv_rope_store) and the backend runs with SaveKv::kNo; otherwise the
  /// backend appends them.
  /// With `comm` (world size > 1; it must outlive the decoder) the decoder holds and computes
  /// only its rank's shard (see above); `kv_pool` then has Hkv/N heads.
  /// A DSA model needs `kv_pool` (its index keys are written there).
  /// With `swa_pool` the pools are split by layer kind (llama_worker.h): `kv_pool` stores only
  /// the full-attention layers, the window layers live in the SWA pool, and every forward needs
  /// a WindowSide; layer l's AttentionLayer::layer_id (the index the backend reads its pool at)
  /// is LlamaModel::pool_layer(l, true).
  Decoder(const LlamaModel& model, ModelOps& ops, kv::KvPool* kv_pool = nullptr,
          dist::Communicator* comm = nullptr, bool swa_pool = false);
  ~Decoder();

  /// The heads, MLP width and vocabulary rows one rank holds.
  struct Shard {
    int rank = 0;
    int size = 1;
    int num_q_heads = 0;
    int num_kv_heads = 0;
    int64_t intermediate = 0;
    int64_t vocab_begin = 0;
    int64_t vocab_rows = 0;
  };
  /// The shard of rank `rank` of `size` for `config`. Throws Error(kUnsupported) when a sharded
  /// dimension is not divisible by `size`, kInvalidArgument for a bad rank.
  static Shard shard_of(const ModelConfig& config, int rank, int size);

  const LlamaModel& model() const { return *model_; }
  const Shard& shard() const { return shard_; }
  ModelOps& ops() const { return *ops_; }
  /// Makes `a` hold at least `tokens` query rows and `rows` logit rows, and an MLA model's
  /// expanded form `mla_keys` keys (reallocates; contents are lost). Synchronizes the stream
  /// before freeing old buffers.
  void reserve(Activations& a, int64_t tokens, int64_t rows, int64_t mla_keys = 0) const;
  /// Enqueues the forward of `tokens` query rows of `batch` whose ids, positions and slots are
  /// already in a.ids() / a.positions() / a.cache_loc(), computing f32 logits for the `rows` query rows listed in
  /// a.logit_rows(). The backend must have planned `batch` (init_forward_metadata or a graph
  /// replay plan). Never synchronizes.
  /// With `capture`, also copies the requested layer outputs (layers in [0, num_layers)).
  /// With the SWA pool (constructed with swa_pool; `window` is then required, and refused
  /// without it), layers with a window attend through window->backend over window->batch
  /// (planned too) and their K/V is saved by that backend.
  /// A hybrid model needs `state` (its query-token counts summing to `tokens`; refused
  /// without it), and the Mamba2 layers update its slots in place.
  void forward(Activations& a, const attention::ForwardBatch& batch,
               attention::AttentionBackend& backend, int64_t tokens, int64_t rows,
               const HiddenCapture* capture = nullptr, const WindowSide* window = nullptr,
               const StateSide* state = nullptr) const;
  /// MLA models: how extend steps are computed (kAuto at construction), and the expanded form's
  /// keys per window (0: as many as kExpandedMlaScratchBytes of key scratch holds).
  void set_mla_prefill(MlaPrefill form, int64_t window_keys) {
    mla_prefill_ = form;
    mla_window_keys_ = window_keys;
  }
  /// The keys per window of an MLA model's extend step `batch` in the expanded form, 0 when it
  /// runs absorbed. Expanded: kAuto, no DSA, a kExtend / kMixed step without kv_start, a backend
  /// with ragged attention (capabilities().ragged), a pool in the ops' dtype (the gathered
  /// latent rows feed the GEMMs as they are), the step's new tokens within one window (a window
  /// holds set_mla_prefill's window keys, or what kExpandedMlaScratchBytes of key scratch
  /// holds), and fewer multiply-adds than the absorbed form (per request of n new tokens over T
  /// keys, per head: expanded n·T·(nope + rope + v) + T·r·(nope + v) against absorbed
  /// n·T·(2r + rope) + n·r·(nope + v), r = kv_lora: prefills and long extends go expanded,
  /// decode rows with long contexts keep a mixed step absorbed). Returns min(Σ seq_lens, window
  /// keys): the caller reserves that many keys (reserve's mla_keys), and forward() runs the
  /// expanded form when they were reserved; a step of more keys attends to them in windows
  /// (its new tokens causally, then its prefixes in windows of at most that many keys) merged
  /// by LSE (ModelOps::merge_attention).
  int64_t expanded_mla_keys(const attention::ForwardBatch& batch,
                            const attention::AttentionBackend& backend) const;
  /// The expanded form's key scratch bound (bytes of gathered latent rows and K / V per window).
  static constexpr int64_t kExpandedMlaScratchBytes = int64_t{1} << 30;

  /// Enqueues sampling of the `rows` logit rows into a.out_ids() with a.params(); with
  /// `masked`, first applies the staged token masks (a.mask_count() of a.mask_rows() /
  /// a.mask_words(), ModelOps::mask_logits) to the logits in place.
  void sample(Activations& a, int64_t rows, bool masked) const;

 private:
  struct LayerPtrs {
    const void *input_norm, *qkv, *qkv_bias, *o_proj, *post_norm, *gate_up, *down;
    // Gemma (null otherwise).
    const void *attn_out_norm, *mlp_out_norm, *q_norm, *k_norm;
    const float* inv_freq;  ///< the layer's RoPE frequencies (f32, device)
    // MLA (null otherwise): LlamaModel::PackedLayer's fields of the same names.
    const void *q_a_proj, *q_a_norm, *q_proj, *kv_a_proj, *kv_a_norm, *w_uk_t, *w_uk, *w_uv;
    // DSA indexer (null otherwise): PackedLayer's idx_* fields.
    const void *idx_wq_b, *idx_wk, *idx_k_norm, *idx_k_norm_bias, *idx_weights_proj;
  };
  /// Elements of Activations::mla for `tokens` rows, and of Activations::mla_kv for `keys` keys.
  int64_t mla_scratch_elems(int64_t tokens) const;
  int64_t mla_key_scratch_elems(int64_t keys) const;
  /// One MLA layer's attention block: a.h (normed hidden) → a.x (o_proj output), writing the
  /// new tokens' latent rows [rms_norm(c) | rope(k_pe)] into the pool through the backend; the
  /// expanded form in windows of `window_keys` keys when that is > 0 (expanded_mla_keys' verdict
  /// for the step, the keys reserved), else absorbed.
  void mla_attention(Activations& a, const LayerPtrs& w, int l,
                     const attention::ForwardBatch& batch, attention::AttentionBackend& backend,
                     int64_t t, int64_t window_keys) const;
  /// Fills p's MLA pointers (uploads) from w.
  void upload_mla(LayerPtrs& p, const LlamaModel::PackedLayer& w) const;
  /// Uploads a weight slice; keeps the host copy only for the CPU ops (they use it in place).
  const void* upload_owned(std::vector<float> host);
  /// ModelOps::prepare_linear on every dense GEMM weight of the layers (q/k/v, o, gate/up,
  /// down; the Mamba2 projections) and the LM head at this rank's shapes, so the first request
  /// does not pack them (the CPU oneDNN modes). MLA and DSA weights are readied on first use.
  void prepare_linears();

  const LlamaModel* model_;
  ModelOps* ops_;
  dist::Communicator* comm_ = nullptr;
  Shard shard_;
  /// This rank's attention parameters (its heads), one per layer.
  std::vector<attention::AttentionLayer> attn_layers_;
  std::deque<std::vector<float>> host_slices_;
  std::vector<LayerPtrs> layers_;
  /// Per model layer K / V cache base pointers for the fused store (empty: the backend appends;
  /// with the SWA pool a window layer's entry is unused).
  std::vector<KvStore> stores_;
  kv::KvPool* kv_pool_ = nullptr;
  bool swa_pool_ = false;
  std::unique_ptr<DsaIndexer> dsa_;  ///< DSA models only
  MlaPrefill mla_prefill_ = MlaPrefill::kAuto;
  int64_t mla_window_keys_ = 0;  ///< 0: kExpandedMlaScratchBytes' worth
  /// Hybrid models: the Mamba2 mixer (scratch, hence mutable), each Mamba2 layer's weights and
  /// its layer in the state pool (-1 for an attention layer).
  std::unique_ptr<Mamba2Mixer> mixer_;
  std::vector<Mamba2Weights> ssm_weights_;
  std::vector<int32_t> state_layer_;
  const void* embed_ = nullptr;
  const void* lm_head_ = nullptr;
  const void* final_norm_ = nullptr;
};

}  // namespace pagoda::model
