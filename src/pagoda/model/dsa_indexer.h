#pragma once
/// DsaIndexer: DeepSeek-V3.2's lightning indexer (config.h DsaConfig) on the CPU, run by
/// Decoder::mla_attention before each layer's attention. Per layer and step:
///
///   k_idx = LayerNorm(h·W_kᵀ; eps 1e-6)·w + b, RoPE on dims [0, rope)   [t, Id]  → pool index
///           keys at out_cache_loc (fp8 e4m3 + power-of-two scale, kv_pool.h)
///   if some row sees more than index_topk positions (else dense MLA: nothing more is done):
///     q_idx = qa·W_qbᵀ, RoPE on dims [0, rope) of each head           [t, In, Id]
///     w     = h·W_wᵀ · In^-½ · Id^-½                                   [t, In]
///     backend.select_index_topk(...): score(t, p) = Σ_h w_h · ReLU(q_idx_h · key(p)), key(p)
///            the stored (dequantised) index key of position p, for every position p the row
///            sees (IndexerMetadata); the index_topk best positions by (score descending,
///            position ascending: ties go to the earlier token); rows that see fewer list them
///            all, padded with -1 (attention/dsa.h index_topk_host on host pools)
///     backend.set_sparse_topk(...)                                        (the attention hook)
/// RoPE is the NeoX half-split form (pairs (i, i + rope/2)), unlike MLA's interleaved pairs, with
/// the layer's frequencies and YaRN cos/sin factor. Queries stay f32 and scores accumulate in
/// f64 on the host backends (DeepSeek's kernel quantises q to fp8 after a Hadamard rotation, an
/// orthogonal map that changes only rounding; pagoda keeps the keys in fp8 as the cache format
/// and nothing else).
///
/// Host memory only (the CPU ModelOps): the Decoder refuses DSA on other devices. One thread.

#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/attention/backend.h"
#include "pagoda/attention/forward_batch.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/model/config.h"
#include "pagoda/model/model_ops.h"

namespace pagoda::model {

/// One layer's indexer weights (host f32, HF [out, in]) and its RoPE.
struct DsaLayerWeights {
  const float* wq_b = nullptr;          ///< [In·Id, q_lora]
  const float* wk = nullptr;            ///< [Id, hidden]
  const float* k_norm = nullptr;        ///< [Id]
  const float* k_norm_bias = nullptr;   ///< [Id]
  const float* weights_proj = nullptr;  ///< [In, hidden]
  const float* inv_freq = nullptr;      ///< [rope / 2]
  float rope_factor = 1.f;
};

class DsaIndexer {
 public:
  /// `config` must be DSA (is_dsa()); `ops` must be the CPU ops (host pointers). Both outlive
  /// the indexer.
  DsaIndexer(const ModelConfig& config, ModelOps& ops);

  /// Layer `layer`'s indexer for the t = batch.num_tokens() rows: h [t, hidden] (normed input),
  /// qa [t, q_lora] (normed q latent), positions [t]. Writes the index keys into `pool` and,
  /// when sparsity applies, hands the top-k to `backend` (Error(kUnsupported) naming it when it
  /// has no indexer metadata). The top-k of the last call stays readable through last_topk().
  void run(LayerId layer, const DsaLayerWeights& w, const float* h, const float* qa,
           const int32_t* positions, const attention::ForwardBatch& batch, kv::KvPool& pool,
           attention::AttentionBackend& backend);
  /// The last run's selection [t, index_topk] (empty when that layer ran dense).
  std::span<const int32_t> last_topk() const { return topk_; }

 private:
  /// RoPE (NeoX) on dims [0, rope) of `groups` vectors of `dim` per row of x [t, groups·dim].
  void rope(float* x, int64_t t, int64_t groups, const int32_t* positions,
            const DsaLayerWeights& w) const;

  const ModelConfig* config_;
  ModelOps* ops_;
  std::vector<float> k_, q_, w_;
  std::vector<int32_t> topk_;
};

}  // namespace pagoda::model
