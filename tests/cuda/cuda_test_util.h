#pragma once
/// Random paged-attention problems for the CUDA tests and benchmarks: host KV caches with NaN in
/// every slot no request uses, permuted pages, and an fp64 reference of the BatchAttention
/// conventions (attention/batch_attention.h).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "pagoda/attention/batch_attention.h"
#include "pagoda/core/float_convert.h"

namespace pagoda::cuda_test {

struct Problem {
  std::vector<int> qo_lens, kv_lens;
  int page_size = 16;
  int hq = 8, hkv = 2, dqk = 128, dv = 128;
  DType q_dtype = DType::kBF16, kv_dtype = DType::kBF16;
  bool mla = false;            ///< one latent buffer; V = first dv elements of K
  bool permute_pages = true;
  bool tree_mask = false;      ///< random tree over the last qo_len keys (prefix visible)
  bool poison = true;
  /// Output layout: each head's row padded by out_pad_h elements (o stride h = dv + out_pad_h,
  /// stride n = hq * that) and the view starting out_offset elements into its buffer.
  int out_pad_h = 0, out_offset = 0;
  attention::RunParams params;
  uint64_t seed = 1;
};

/// Host data of a problem.
struct HostData {
  std::vector<int32_t> qo_indptr{0}, kv_indptr{0}, kv_indices, last_len;
  std::vector<uint8_t> mask;
  std::vector<int64_t> mask_indptr{0};
  int num_pages = 0;
  std::vector<uint8_t> q, k, v;  // raw bytes in their dtypes
  int64_t k_row = 0, v_row = 0;  // elements per slot
  int nnz = 0;
  attention::PagedPlanInput input(int page_size) const {
    return {.qo_indptr = qo_indptr, .kv_indptr = kv_indptr, .kv_indices = kv_indices,
            .kv_last_page_len = last_len, .page_size = page_size,
            .custom_mask = mask, .mask_indptr = mask.empty() ? std::span<const int64_t>() : std::span<const int64_t>(mask_indptr)};
  }
};

inline HostData make_host_data(const Problem& p) {
  HostData h;
  std::mt19937_64 rng(p.seed);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  const int bs = static_cast<int>(p.qo_lens.size());
  int total_pages = 1;  // page 0 unused
  std::vector<int> npages(bs);
  for (int b = 0; b < bs; ++b) {
    npages[b] = (p.kv_lens[b] + p.page_size - 1) / p.page_size;
    total_pages += npages[b];
  }
  total_pages += 3;  // unused pages
  h.num_pages = total_pages;
  std::vector<int32_t> ids(total_pages - 1);
  for (int i = 0; i < total_pages - 1; ++i) ids[i] = i + 1;
  if (p.permute_pages) std::shuffle(ids.begin(), ids.end(), rng);
  int next = 0;
  for (int b = 0; b < bs; ++b) {
    h.qo_indptr.push_back(h.qo_indptr.back() + p.qo_lens[b]);
    for (int i = 0; i < npages[b]; ++i) h.kv_indices.push_back(ids[next++]);
    h.kv_indptr.push_back(static_cast<int32_t>(h.kv_indices.size()));
    h.last_len.push_back(npages[b] == 0 ? 0 : p.kv_lens[b] - (npages[b] - 1) * p.page_size);
  }
  h.nnz = h.qo_indptr.back();
  const int hkv = p.mla ? 1 : p.hkv;
  h.k_row = int64_t(hkv) * p.dqk;
  h.v_row = p.mla ? 0 : int64_t(hkv) * p.dv;
  const size_t kvs = dtype_size(p.kv_dtype);
  const int64_t slots = int64_t(total_pages) * p.page_size;
  h.k.assign(size_t(slots * h.k_row) * kvs, 0);
  h.v.assign(size_t(slots * h.v_row) * kvs, 0);
  const float nan = std::nanf("");
  for (int64_t i = 0; i < slots * h.k_row; ++i) write_from_f32(h.k.data(), p.kv_dtype, i, p.poison ? nan : 0.f);
  for (int64_t i = 0; i < slots * h.v_row; ++i) write_from_f32(h.v.data(), p.kv_dtype, i, p.poison ? nan : 0.f);
  for (int b = 0; b < bs; ++b) {
    for (int t = 0; t < p.kv_lens[b]; ++t) {
      const int64_t slot = int64_t(h.kv_indices[h.kv_indptr[b] + t / p.page_size]) * p.page_size + t % p.page_size;
      for (int64_t e = 0; e < h.k_row; ++e) write_from_f32(h.k.data(), p.kv_dtype, slot * h.k_row + e, uni(rng));
      for (int64_t e = 0; e < h.v_row; ++e) write_from_f32(h.v.data(), p.kv_dtype, slot * h.v_row + e, uni(rng));
    }
  }
  h.q.assign(size_t(h.nnz) * p.hq * p.dqk * dtype_size(p.q_dtype), 0);
  for (int64_t i = 0; i < int64_t(h.nnz) * p.hq * p.dqk; ++i) write_from_f32(h.q.data(), p.q_dtype, i, uni(rng));
  if (p.tree_mask) {
    for (int b = 0; b < bs; ++b) {
      const int qo = p.qo_lens[b], kv = p.kv_lens[b], prefix = kv - qo;
      std::vector<int> parent(qo, -1);
      for (int i = 1; i < qo; ++i) parent[i] = static_cast<int>(rng() % i);
      const int64_t bits = int64_t(qo) * kv;
      std::vector<uint8_t> seg((bits + 7) / 8, 0);
      for (int i = 0; i < qo; ++i) {
        auto set = [&](int j) { const int64_t bit = int64_t(i) * kv + j; seg[bit >> 3] |= uint8_t(1u << (bit & 7)); };
        for (int j = 0; j < prefix; ++j) set(j);
        for (int a = i; a >= 0; a = parent[a]) set(prefix + a);
      }
      h.mask.insert(h.mask.end(), seg.begin(), seg.end());
      h.mask_indptr.push_back(static_cast<int64_t>(h.mask.size()));
    }
  }
  return h;
}

/// fp64 reference: out [nnz, hq, dv] f32 and lse [nnz, hq] (base 2). Query rows are spread over
/// the host's threads; each (row, head) is computed by one thread in a fixed order, so the result
/// does not depend on the thread count.
inline void reference(const Problem& p, const HostData& h, std::vector<float>& out,
                      std::vector<float>& lse) {
  const int bs = static_cast<int>(p.qo_lens.size());
  out.assign(size_t(h.nnz) * p.hq * p.dv, 0.f);
  lse.assign(size_t(h.nnz) * p.hq, -INFINITY);
  const auto& rp = p.params;
  const int group = p.mla ? p.hq : p.hq / p.hkv;
  std::vector<std::pair<int, int>> rows;  // (request, query index)
  for (int b = 0; b < bs; ++b) {
    for (int i = 0; i < p.qo_lens[b]; ++i) rows.emplace_back(b, i);
  }
  auto one_row = [&](int b, int i) {
    const int qo = p.qo_lens[b], kv = p.kv_lens[b];
    const int row = h.qo_indptr[b] + i;
    const int qpos = kv - qo + i;
    // The keys the row sees (attention/batch_attention.h): without a custom mask, causal or not,
    // then the window from its position; under a custom mask, its set bits, of which a window
    // keeps the last window + 1 (a tree node's prefix + depth is its position).
    std::vector<int> keys;
    for (int j = 0; j < kv; ++j) {
      if (!h.mask.empty()) {
        const int64_t bit = int64_t(i) * kv + j;
        if ((h.mask[h.mask_indptr[b] + (bit >> 3)] >> (bit & 7)) & 1) keys.push_back(j);
      } else if ((rp.mask != attention::MaskKind::kCausal || j <= qpos) &&
                 (rp.window_left < 0 || j >= qpos - rp.window_left)) {
        keys.push_back(j);
      }
    }
    if (!h.mask.empty() && rp.window_left >= 0 && keys.size() > size_t(rp.window_left) + 1) {
      keys.erase(keys.begin(), keys.end() - (rp.window_left + 1));
    }
    std::vector<double> s, w, acc(size_t(p.dv));
    std::vector<int64_t> slot_of;
    for (int hh = 0; hh < p.hq; ++hh) {
      const int g = hh / group;
      s.clear();
      slot_of.clear();
      for (int j : keys) {
        const int64_t slot = int64_t(h.kv_indices[h.kv_indptr[b] + j / p.page_size]) * p.page_size + j % p.page_size;
        double d = 0;
        for (int e = 0; e < p.dqk; ++e) {
          d += double(read_as_f32(h.q.data(), p.q_dtype, (size_t(row) * p.hq + hh) * p.dqk + e)) *
               double(read_as_f32(h.k.data(), p.kv_dtype, slot * h.k_row + g * p.dqk + e)) * rp.k_scale;
        }
        double x = d * rp.sm_scale;
        if (rp.logit_cap > 0) x = rp.logit_cap * std::tanh(x / rp.logit_cap);
        s.push_back(x);
        slot_of.push_back(slot);
      }
      if (s.empty()) continue;
      double m = -INFINITY;
      for (double x : s) m = std::max(m, x);
      const double sink = rp.sinks.empty() ? -INFINITY : double(rp.sinks[hh]);
      m = std::max(m, sink);
      double tot = rp.sinks.empty() ? 0.0 : std::exp(sink - m);
      w.resize(s.size());
      for (size_t t = 0; t < s.size(); ++t) {
        w[t] = std::exp(s[t] - m);
        tot += w[t];
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      for (size_t t = 0; t < s.size(); ++t) {  // each column sums over t in order
        const int64_t base = p.mla ? slot_of[t] * h.k_row : slot_of[t] * h.v_row + g * p.dv;
        const void* src = p.mla ? h.k.data() : h.v.data();
        for (int e = 0; e < p.dv; ++e) {
          acc[size_t(e)] += w[t] * double(read_as_f32(src, p.kv_dtype, size_t(base + e))) * rp.v_scale;
        }
      }
      for (int e = 0; e < p.dv; ++e) out[(size_t(row) * p.hq + hh) * p.dv + e] = float(acc[size_t(e)] / tot);
      lse[size_t(row) * p.hq + hh] = float((m + std::log(tot)) / std::log(2.0));
    }
  };
  std::atomic<size_t> next{0};
  auto worker = [&]() {
    for (size_t k = next++; k < rows.size(); k = next++) one_row(rows[k].first, rows[k].second);
  };
  const unsigned n = std::max(1u, std::min(std::thread::hardware_concurrency(), 32u));
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < n; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

}  // namespace pagoda::cuda_test
