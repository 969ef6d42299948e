#include "pagoda/model/dsa_indexer.h"

#include <cmath>

#include "pagoda/attention/dsa.h"
#include "pagoda/core/error.h"

namespace pagoda::model {

DsaIndexer::DsaIndexer(const ModelConfig& config, ModelOps& ops) : config_(&config), ops_(&ops) {
  PAGODA_REQUIRE(config.is_dsa(), kInvalidArgument, "DsaIndexer needs a DSA config");
  PAGODA_REQUIRE(ops.supports_dsa_ops(), kUnsupported,
                 "DeepSeek sparse attention (DSA) needs the indexer's dense ops (LayerNorm, NeoX "
                 "RoPE, index-key quantisation), which the model ops on {} do not implement",
                 ops.platform().name());
}

int64_t DsaIndexer::scratch_floats(int64_t t) const {
  const int64_t nh = config_->dsa.index_n_heads, d = config_->dsa.index_head_dim;
  return t * (d + nh * d + nh);
}

void DsaIndexer::run(LayerId layer, const DsaLayerWeights& w, const void* h, const void* qa,
                     const int32_t* positions, const int32_t* cache_loc,
                     const attention::ForwardBatch& batch, kv::KvPool& pool,
                     attention::AttentionBackend& backend, float* scratch) {
  const ModelConfig& c = *config_;
  const int64_t t = batch.num_tokens(), hd = c.hidden_size, qr = c.mla.q_lora_rank;
  const int64_t nh = c.dsa.index_n_heads, d = c.dsa.index_head_dim;
  const int64_t rope = c.mla.qk_rope_head_dim;
  const int k = c.dsa.index_topk;
  for (int64_t i = 0; i < t; ++i) {  // the ops trust the slots they write (kv_pool.h's rows)
    const SlotIndex slot = batch.out_cache_loc[static_cast<size_t>(i)];
    PAGODA_REQUIRE(slot >= 0 && slot < pool.num_slots(), kOutOfRange,
                   "DSA indexer: token {} has slot {} outside the pool's [0, {})", i, slot,
                   pool.num_slots());
  }
  float* keys = scratch;
  float* q = keys + t * d;
  float* wts = q + t * nh * d;
  // The new tokens' index keys: LayerNorm, RoPE, quantised into the pool.
  ops_->linear(h, w.wk, keys, t, d, hd, /*f32_out=*/true);
  ops_->layer_norm_f32(keys, t, d, w.k_norm, w.k_norm_bias, 1e-6f);
  ops_->rope_neox_f32(keys, t, 1, d, rope, positions, w.inv_freq, w.rope_factor);
  ops_->store_index_keys(keys, cache_loc, t, d, pool.index_data(layer), pool.index_row_bytes());

  const attention::IndexerMetadata* meta = backend.get_indexer_metadata();
  PAGODA_REQUIRE(meta != nullptr, kUnsupported,
                 "backend '{}' builds no DSA indexer metadata (DeepSeek sparse attention needs "
                 "a backend with capabilities().dsa)",
                 backend.name());
  // Every row sees at most k tokens: dense MLA is exact (unless the backend's step must select).
  if (meta->max_visible <= k && !meta->always_select) return;

  ops_->linear(qa, w.wq_b, q, t, nh * d, qr, /*f32_out=*/true);
  ops_->rope_neox_f32(q, t, nh, d, rope, positions, w.inv_freq, w.rope_factor);
  ops_->linear(h, w.weights_proj, wts, t, nh, hd, /*f32_out=*/true);
  ops_->scale_f32(wts, t * nh, static_cast<float>(1.0 / std::sqrt(static_cast<double>(nh * d))));

  backend.apply_index_topk(layer,
                           attention::IndexerQuery{.q = q,
                                                   .w = wts,
                                                   .heads = static_cast<int32_t>(nh),
                                                   .dim = static_cast<int32_t>(d),
                                                   .device = ops_->device()},
                           k);
}

}  // namespace pagoda::model
