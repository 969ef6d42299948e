#pragma once
/// DsaIndexer: DeepSeek-V3.2's lightning indexer (config.h DsaConfig), run by
/// Decoder::mla_attention before each layer's attention, on the model ops' device. Per layer
/// and step:
///
///   k_idx = LayerNorm(h·W_kᵀ; eps 1e-6)·w + b, RoPE on dims [0, rope)   [t, Id]  → pool index
///           keys at out_cache_loc (fp8 e4m3 + power-of-two scale, kv_pool.h)
///   if some row sees more than index_topk positions (else dense MLA: nothing more is done):
///     q_idx = qa·W_qbᵀ, RoPE on dims [0, rope) of each head           [t, In, Id]
///     w     = h·W_wᵀ · In^-½ · Id^-½                                   [t, In]
///     backend.apply_index_topk(...): score(t, p) = Σ_h w_h · ReLU(q_idx_h · key(p)), key(p)
///            the stored (dequantised) index key of position p, for every position p the row
///            sees (IndexerMetadata); the index_topk best positions by (score descending,
///            position ascending: ties go to the earlier token); rows that see fewer list them
///            all, padded with -1 (attention/dsa.h index_topk_host on host pools), applied to
///            the layer's next forward (select_index_topk + set_sparse_topk, or on the device)
/// RoPE is the NeoX half-split form (pairs (i, i + rope/2)), unlike MLA's interleaved pairs, with
/// the layer's frequencies and YaRN cos/sin factor. k_idx, q_idx and w are f32 (the projections
/// write f32 from the ops' dtype); every backend's indexer rounds q_idx per head to the keys'
/// e4m3 grid (power-of-two scale), as DeepSeek-V3.2 quantises its indexer queries to fp8 with
/// ue8m0 block scales (after a Hadamard rotation, an orthogonal map pagoda leaves out: it
/// changes only rounding); the host backends accumulate scores in f64.
///
/// Every step is a ModelOps call (ModelOps::supports_dsa_ops), so the same code runs on the CPU
/// and CUDA ops; q_idx and w reach the backend in the ops' device memory (IndexerQuery::device);
/// the cuda backend keeps the top-k there (the host backends plan on the host) and captures
/// decode steps in CUDA graphs (IndexerMetadata::always_select: the selection then runs at any
/// length). The f32 scratch is the caller's (Activations::dsa: a graph's own). One thread.

#include <cstdint>

#include "pagoda/attention/backend.h"
#include "pagoda/attention/forward_batch.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/model/config.h"
#include "pagoda/model/model_ops.h"
#include "pagoda/platform/platform.h"

namespace pagoda::model {

/// One layer's indexer weights on the ops' device: the projections in the ops' dtype (HF
/// [out, in]), the norm's weight and bias and the RoPE frequencies f32.
struct DsaLayerWeights {
  const void* wq_b = nullptr;           ///< [In·Id, q_lora]
  const void* wk = nullptr;             ///< [Id, hidden]
  const float* k_norm = nullptr;        ///< [Id]
  const float* k_norm_bias = nullptr;   ///< [Id]
  const void* weights_proj = nullptr;   ///< [In, hidden]
  const float* inv_freq = nullptr;      ///< [rope / 2]
  float rope_factor = 1.f;
};

class DsaIndexer {
 public:
  /// `config` must be DSA (is_dsa()); `ops` must implement the DSA ops (supports_dsa_ops(),
  /// else Error(kUnsupported) naming the device). Both outlive the indexer.
  DsaIndexer(const ModelConfig& config, ModelOps& ops);

  /// Layer `layer`'s indexer for the t = batch.num_tokens() rows, all on the ops' device:
  /// h [t, hidden] (normed input) and qa [t, q_lora] (normed q latent) in the ops' dtype,
  /// positions [t] and cache_loc [t] (batch.out_cache_loc's copy), `scratch` at least
  /// scratch_floats(t) f32. Writes the index keys into `pool` (on the ops' device) and, when
  /// sparsity applies, hands the top-k to `backend` (Error(kUnsupported) naming it when it has
  /// no indexer metadata).
  void run(LayerId layer, const DsaLayerWeights& w, const void* h, const void* qa,
           const int32_t* positions, const int32_t* cache_loc, const attention::ForwardBatch& batch,
           kv::KvPool& pool, attention::AttentionBackend& backend, float* scratch);

  /// The f32 scratch run() needs for t rows (k_idx, q_idx, w).
  int64_t scratch_floats(int64_t t) const;

 private:
  const ModelConfig* config_;
  ModelOps* ops_;
};

}  // namespace pagoda::model
