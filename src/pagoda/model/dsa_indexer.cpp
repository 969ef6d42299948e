#include "pagoda/model/dsa_indexer.h"

#include <cmath>

#include "pagoda/attention/dsa.h"
#include "pagoda/core/error.h"

namespace pagoda::model {

DsaIndexer::DsaIndexer(const ModelConfig& config, ModelOps& ops) : config_(&config), ops_(&ops) {
  PAGODA_REQUIRE(config.is_dsa(), kInvalidArgument, "DsaIndexer needs a DSA config");
  PAGODA_REQUIRE(ops.device().is_cpu(), kUnsupported,
                 "DeepSeek sparse attention (DSA) runs on the CPU only: the {} model ops have no "
                 "DSA indexer projections (index keys, queries, head weights) yet",
                 ops.platform().name());
}

void DsaIndexer::rope(float* x, int64_t t, int64_t groups, const int32_t* positions,
                      const DsaLayerWeights& w) const {
  const int64_t dim = config_->dsa.index_head_dim, half = config_->mla.qk_rope_head_dim / 2;
  for (int64_t r = 0; r < t; ++r) {
    const float pos = static_cast<float>(positions[r]);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * w.inv_freq[i];
      const float c = std::cos(angle) * w.rope_factor, s = std::sin(angle) * w.rope_factor;
      for (int64_t g = 0; g < groups; ++g) {
        float* v = x + (r * groups + g) * dim;
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      }
    }
  }
}

void DsaIndexer::run(LayerId layer, const DsaLayerWeights& w, const float* h, const float* qa,
                     const int32_t* positions, const attention::ForwardBatch& batch,
                     kv::KvPool& pool, attention::AttentionBackend& backend) {
  const ModelConfig& c = *config_;
  const int64_t t = batch.num_tokens(), hd = c.hidden_size, qr = c.mla.q_lora_rank;
  const int64_t nh = c.dsa.index_n_heads, d = c.dsa.index_head_dim;
  const int k = c.dsa.index_topk;
  topk_.clear();
  // The new tokens' index keys: LayerNorm (f64 statistics), RoPE, into the pool.
  k_.resize(static_cast<size_t>(t * d));
  ops_->linear(h, w.wk, k_.data(), t, d, hd);
  for (int64_t r = 0; r < t; ++r) {
    float* v = k_.data() + r * d;
    double mean = 0, var = 0;
    for (int64_t j = 0; j < d; ++j) mean += v[j];
    mean /= static_cast<double>(d);
    for (int64_t j = 0; j < d; ++j) var += (v[j] - mean) * (v[j] - mean);
    const double inv = 1.0 / std::sqrt(var / static_cast<double>(d) + 1e-6);
    for (int64_t j = 0; j < d; ++j)
      v[j] = static_cast<float>((v[j] - mean) * inv * w.k_norm[j] + w.k_norm_bias[j]);
  }
  rope(k_.data(), t, 1, positions, w);
  pool.set_index_keys(layer, batch.out_cache_loc, k_.data());

  const attention::IndexerMetadata* meta = backend.get_indexer_metadata();
  PAGODA_REQUIRE(meta != nullptr, kUnsupported,
                 "backend '{}' builds no DSA indexer metadata (DeepSeek sparse attention needs "
                 "'reference' or 'cpu')",
                 backend.name());
  if (meta->max_visible <= k) return;  // every row sees at most k tokens: dense MLA is exact

  q_.resize(static_cast<size_t>(t * nh * d));
  w_.resize(static_cast<size_t>(t * nh));
  ops_->linear(qa, w.wq_b, q_.data(), t, nh * d, qr);
  rope(q_.data(), t, nh, positions, w);
  ops_->linear(h, w.weights_proj, w_.data(), t, nh, hd);
  const float wscale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(nh * d)));
  for (float& x : w_) x *= wscale;

  topk_.resize(static_cast<size_t>(t * k));
  backend.select_index_topk(layer,
                            attention::IndexerQuery{.q = q_.data(),
                                                    .w = w_.data(),
                                                    .heads = static_cast<int32_t>(nh),
                                                    .dim = static_cast<int32_t>(d)},
                            k, topk_, {});
  backend.set_sparse_topk(topk_, k);
}

}  // namespace pagoda::model
