#include "pagoda/backends/cpu/cpu_indexer.h"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"

namespace pagoda::backends {

void cpu_index_topk(const kv::KvPool& pool, LayerId layer, const attention::IndexerMetadata& meta,
                    const attention::IndexerQuery& q, int k, std::span<int32_t> topk,
                    std::span<float> scores) {
  PAGODA_REQUIRE(pool.device().is_cpu(), kUnsupported,
                 "the cpu indexer reads a host pool (this one is on {})",
                 pool.device().to_string());
  attention::check_index_query(pool, meta, q, k, topk.size(), scores.size());
  const int64_t d = pool.config().index_head_dim, heads = q.heads;
  const auto rows = static_cast<int64_t>(meta.row_request.size());
  const uint8_t* base = pool.index_rows(layer);
  const int64_t row_bytes = pool.index_row_bytes();
  // e4m3 code -> f32, one table lookup per element (the generic decoder costs more than the
  // sgemm that follows).
  static const auto kE4m3 = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = e4m3_to_f32(static_cast<uint8_t>(c));
    return t;
  }();
  std::vector<float> keys, s, score, qt(static_cast<size_t>(heads * d));
  std::vector<int32_t> order;
  int32_t keyed_request = -1;
  int64_t keyed = 0;  // positions of keyed_request decoded so far
  for (int64_t t = 0; t < rows; ++t) {
    const int32_t b = meta.row_request[static_cast<size_t>(t)];
    const int64_t visible = meta.row_visible[static_cast<size_t>(t)];
    const int32_t* slots = meta.slots.data() + meta.slot_indptr[static_cast<size_t>(b)];
    if (b != keyed_request) {
      keyed_request = b;
      keyed = 0;
    }
    if (keyed < visible) {  // the request's keys, decoded once for its rows
      keys.resize(static_cast<size_t>(visible * d));
#pragma omp parallel for schedule(static)
      for (int64_t p = keyed; p < visible; ++p) {
        const uint8_t* row = base + int64_t{slots[p]} * row_bytes;
        float scale = 0.f;
        std::memcpy(&scale, row + d, sizeof(float));
        float* out = keys.data() + p * d;
        for (int64_t j = 0; j < d; ++j) out[j] = kE4m3[row[j]] * scale;
      }
      keyed = visible;
    }
    order.clear();
    if (visible > 0) {
      for (int64_t h = 0; h < heads; ++h)  // the queries on the key grid (attention/dsa.h)
        kv::round_to_index_grid(q.q + (t * heads + h) * d, d, qt.data() + h * d);
      // S [heads, visible] = q_t [heads, d] · keys [visible, d]ᵀ.
      s.resize(static_cast<size_t>(heads * visible));
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(heads),
                  static_cast<int>(visible), static_cast<int>(d), 1.f, qt.data(),
                  static_cast<int>(d), keys.data(), static_cast<int>(d), 0.f, s.data(),
                  static_cast<int>(visible));
      score.assign(static_cast<size_t>(visible), 0.f);
      const float* wt = q.w + t * heads;
#pragma omp parallel for schedule(static)
      for (int64_t p0 = 0; p0 < visible; p0 += 1024) {
        const int64_t p1 = std::min(visible, p0 + 1024);
        float* sc = score.data();
        for (int64_t h = 0; h < heads; ++h) {
          const float w = wt[h];
          const float* sh = s.data() + h * visible;
          for (int64_t p = p0; p < p1; ++p) sc[p] += w * std::max(sh[p], 0.f);
        }
      }
      for (int32_t p = 0; p < visible; ++p)
        if (meta.sees(t, p)) order.push_back(p);  // a tree verify: draft nodes off the path
    }
    const auto keep = std::min(order.size(), static_cast<size_t>(k));
    auto better = [&](int32_t a, int32_t c) {
      const float sa = score[static_cast<size_t>(a)], sc = score[static_cast<size_t>(c)];
      return sa != sc ? sa > sc : a < c;
    };
    if (keep < order.size()) {
      std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep),
                       order.end(), better);
    }
    std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), better);
    for (size_t i = 0; i < static_cast<size_t>(k); ++i) {
      const size_t at = static_cast<size_t>(t * k) + i;
      const bool kept = i < keep;
      const int32_t p = kept ? order[i] : -1;
      topk[at] = p;
      if (!scores.empty()) {
        scores[at] = kept ? score[static_cast<size_t>(p)] : -std::numeric_limits<float>::infinity();
      }
    }
  }
}

}  // namespace pagoda::backends
