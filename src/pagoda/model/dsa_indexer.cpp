#include "pagoda/model/dsa_indexer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "pagoda/attention/dsa.h"
#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"

namespace pagoda::model {

DsaIndexer::DsaIndexer(const ModelConfig& config, ModelOps& ops) : config_(&config), ops_(&ops) {
  PAGODA_REQUIRE(config.is_dsa(), kInvalidArgument, "DsaIndexer needs a DSA config");
  PAGODA_REQUIRE(ops.device().is_cpu(), kUnsupported,
                 "DeepSeek sparse attention (DSA) runs on the CPU only: the {} platform has no "
                 "indexer-logits, top-k or sparse-MLA kernels yet",
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

  const uint8_t* rows = pool.index_rows(layer);
  const int64_t row_bytes = pool.index_row_bytes();
  topk_.assign(static_cast<size_t>(t * k), -1);
  key_.resize(static_cast<size_t>(d));
  for (int64_t r = 0; r < t; ++r) {
    const int b = meta->row_request[r];
    const int32_t visible = meta->row_visible[r];
    const int32_t* slots = meta->slots.data() + meta->slot_indptr[b];
    score_.assign(static_cast<size_t>(visible), 0.0);
    order_.clear();
    for (int32_t p = 0; p < visible; ++p) {
      if (!meta->sees(r, p)) continue;  // a tree verify: a draft node off the row's path
      order_.push_back(p);
      const uint8_t* row = rows + static_cast<int64_t>(slots[p]) * row_bytes;
      float scale = 0.f;
      std::memcpy(&scale, row + d, sizeof(float));
      for (int64_t j = 0; j < d; ++j) key_[j] = e4m3_to_f32(row[j]) * scale;
      double s = 0;
      for (int64_t hh = 0; hh < nh; ++hh) {
        const float* q = q_.data() + (r * nh + hh) * d;
        double dot = 0;
        for (int64_t j = 0; j < d; ++j) dot += static_cast<double>(q[j]) * key_[j];
        s += static_cast<double>(w_[r * nh + hh]) * std::max(dot, 0.0);
      }
      score_[p] = s;
    }
    const int32_t keep = std::min(static_cast<int32_t>(order_.size()), k);
    std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(),
                      [&](int32_t a, int32_t b2) {
                        return score_[a] != score_[b2] ? score_[a] > score_[b2] : a < b2;
                      });
    std::copy(order_.begin(), order_.begin() + keep, topk_.begin() + r * k);
  }
  backend.set_sparse_topk(topk_, k);
}

}  // namespace pagoda::model
