// The dsa-indexer column: a backend's DSA lightning indexer (select_index_topk) over a real
// KvPool of index keys on shuffled pages, the rest of the pool NaN-poisoned, against an fp64
// oracle written from the math (attention/dsa.h index_topk_host states it) that quantises the
// keys and each query head itself: e4m3 codes, round to nearest even, times the power-of-two
// scale 2^ceil(log2(amax / 448)) of each token or head (kv_pool.h).
//
// Per query row the oracle checks: min(k, visible) distinct positions the row sees, then -1
// (score -inf); each returned score within tol(p) = 1e-6 · (1 + |s|) + 4e-6 · Σ_h |w_h| ·
// Σ_d |q_hd · key_d| of the oracle's (f32 arithmetic on a device: (dim + heads) unit roundoffs
// of the terms' magnitude); the order is by score (a bitwise tie in the backend's scores is
// ordered by position); and nothing left out scores more than the last kept position (beyond
// the tolerances), or as much when it is an earlier token (ties go to the earlier token).
// Device backends get the same pool bytes on their device (the host pool's index rows copied).
// Exact ties are made on purpose: some tokens repeat an earlier token's key, and one row has zero
// head weights (every score 0: the row must keep its first k positions).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include <fmt/format.h>

#include "pagoda/attention/backend.h"
#include "pagoda/attention/dsa.h"
#include "pagoda/backends/conformance/conformance.h"
#include "pagoda/backends/conformance/tensors.h"
#include "pagoda/core/error.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/platform/platform.h"

namespace pagoda::backends::conformance {

using namespace pagoda::attention;

namespace {

constexpr int kIndexDim = 32;  // the pool's index_head_dim in this column

/// x rounded to nearest even on the e4m3 grid (|x| <= 448 here: the scale guarantees it).
double oracle_e4m3(double x) {
  if (x == 0) return 0;
  const double a = std::fabs(x);
  const int e = std::max(static_cast<int>(std::floor(std::log2(a))), -6);  // -6: subnormals
  const double step = std::ldexp(1.0, e - 3);                              // 3 mantissa bits
  const double r = std::nearbyint(a / step) * step;                        // ties to even
  return std::copysign(std::min(r, 448.0), x);
}

/// One key (or query head) as the pool (or the indexer) rounds it: codes times its scale.
std::vector<double> oracle_key(const float* x) {
  double amax = 0;
  for (int j = 0; j < kIndexDim; ++j) amax = std::max(amax, std::fabs(double{x[j]}));
  const double scale = amax > 0 ? std::exp2(std::ceil(std::log2(amax / 448.0))) : 1.0;
  std::vector<double> key(kIndexDim);
  for (int j = 0; j < kIndexDim; ++j) key[j] = oracle_e4m3(x[j] / scale) * scale;
  return key;
}

}  // namespace

CaseResult run_indexer_case(const BackendRegistry& registry, const BackendUnderTest& backend,
                            const Case& c, uint64_t seed, platform::Platform* device_platform) {
  const BackendCapabilities caps = capabilities_of(registry, backend.spec);
  BackendRequirements req = c.requirements();
  req.device = caps.device;
  if (auto why = unsupported_reason(caps, req)) return {Verdict::kUnsupported, *why};
  const bool on_device = caps.device != "cpu";
  PAGODA_REQUIRE(
      !on_device || (device_platform != nullptr && device_platform->name() == caps.device),
      kFailedPrecondition, "backend '{}' runs on {} but the harness has {} platform", backend.spec,
      caps.device, device_platform != nullptr ? "a " + device_platform->name() : std::string("no"));
  std::mt19937_64 rng(seed);
  auto uniform_int = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  const int bs = c.mode == ForwardMode::kMixed ? c.batch_size + 1 : c.batch_size;
  const int P = c.page_size, k = c.dsa_topk, heads = c.num_q_heads;

  // ---- lengths, shuffled pages, one key per token (some repeating an earlier one) ----
  std::vector<int> prefix(bs), ext(bs);
  for (int b = 0; b < bs; ++b) {
    const bool decode_like =
        c.mode == ForwardMode::kDecode || (c.mode == ForwardMode::kMixed && b % 2 == 1);
    prefix[b] =
        decode_like ? uniform_int(0, c.max_len - 1) : uniform_int(b == 0 ? 0 : 1, c.max_len);
    ext[b] = decode_like ? 1 : uniform_int(1, 16);
  }
  int pages_needed = 0;
  for (int b = 0; b < bs; ++b) pages_needed += (prefix[b] + ext[b] + P - 1) / P;
  const int num_pages = pages_needed + 4;
  std::vector<int32_t> free_pages(static_cast<size_t>(num_pages));
  std::iota(free_pages.begin(), free_pages.end(), 1);
  std::shuffle(free_pages.begin(), free_pages.end(), rng);
  size_t next_page = 0;
  std::vector<std::vector<int32_t>> slot(bs);
  std::vector<std::vector<float>> keys(bs);  // [b][position * kIndexDim + j]
  for (int b = 0; b < bs; ++b) {
    const int len = prefix[b] + ext[b];
    int32_t page = 0;
    for (int i = 0; i < len; ++i) {
      if (i % P == 0) page = free_pages[next_page++];
      slot[b].push_back(page * P + i % P);
      if (i > 0 && rng() % 8 == 0) {  // an exact tie with an earlier token of the request
        const int from = uniform_int(0, i - 1);
        for (int j = 0; j < kIndexDim; ++j) keys[b].push_back(keys[b][from * kIndexDim + j]);
        continue;
      }
      const float mag = std::exp2(static_cast<float>(uniform_int(-4, 4)));  // scales differ
      for (int j = 0; j < kIndexDim; ++j) keys[b].push_back(unit(rng) * mag);
    }
  }

  // ---- the pool (every byte NaN, then the keys), the table and the batch ----
  auto platform = platform::make_cpu_platform();
  kv::KvPoolConfig pool_cfg{.layout = kv::KvLayout::kMla,
                            .num_layers = 2,
                            .num_pages = num_pages,
                            .page_size = P,
                            .dtype = c.kv_dtype};
  pool_cfg.kv_lora_rank = c.head_dim_v;
  pool_cfg.rope_dim = c.head_dim_qk - c.head_dim_v;
  pool_cfg.index_head_dim = kIndexDim;
  kv::KvPool pool(pool_cfg, platform->allocator());
  pool.fill_bytes(0xFF);  // NaN in every dtype, e4m3 codes and f32 scales included
  const LayerId layer(1);
  for (int b = 0; b < bs; ++b) pool.set_index_keys(layer, slot[b], keys[b].data());
  kv::ReqToTokenTable table(bs + 3, c.max_len + 24);
  std::vector<ReqSlot> rows;
  for (int i = 0; i < bs + 3; ++i) rows.push_back(*table.alloc());
  std::shuffle(rows.begin(), rows.end(), rng);
  ForwardBatch batch;
  batch.mode = c.mode;
  batch.batch_size = bs;
  std::vector<int> row_req, row_pos;  // per query row: its request and position
  for (int b = 0; b < bs; ++b) {
    table.write(rows[b], 0, slot[b]);
    batch.req_pool_indices.push_back(rows[b].value());
    batch.seq_lens.push_back(prefix[b] + ext[b]);
    if (c.mode != ForwardMode::kDecode) {
      batch.extend_prefix_lens.push_back(prefix[b]);
      batch.extend_seq_lens.push_back(ext[b]);
    }
    for (int i = 0; i < ext[b]; ++i) {
      batch.out_cache_loc.push_back(slot[b][prefix[b] + i]);
      batch.positions.push_back(prefix[b] + i);
      row_req.push_back(b);
      row_pos.push_back(prefix[b] + i);
    }
  }
  const int n = batch.num_tokens();
  std::vector<float> q(static_cast<size_t>(n) * heads * kIndexDim),
      w(static_cast<size_t>(n) * heads);
  for (float& x : q) x = unit(rng);
  for (float& x : w) x = unit(rng);
  const int zero_row = uniform_int(0, n - 1);  // every score 0: ties everywhere
  std::fill_n(w.begin() + static_cast<ptrdiff_t>(zero_row) * heads, heads, 0.f);
  std::vector<int32_t> topk(static_cast<size_t>(n) * k, std::numeric_limits<int32_t>::min());
  std::vector<float> scores(topk.size(), std::numeric_limits<float>::quiet_NaN());

  // ---- the backend under test ----
  const IndexerQuery iq{.q = q.data(), .w = w.data(), .heads = heads, .dim = kIndexDim};
  try {
    if (!on_device) {
      BackendContext ctx{.platform = platform.get(), .kv_pool = &pool, .req_to_token = &table};
      auto impl = make_under_test(registry, backend.spec, req, ctx);
      impl->init_forward_metadata(batch);
      impl->select_index_topk(layer, iq, k, topk, scores);
    } else {
      // The same bytes on the device (every buffer 0xFF, then the host pool's index rows).
      platform::Allocator& dev = device_platform->allocator();
      kv::KvPool dev_pool(pool_cfg, dev);
      dev_pool.fill_bytes(0xFF);
      for (int32_t l = 0; l < pool_cfg.num_layers; ++l) {
        dev.copy_to_device(dev_pool.index_data(LayerId(l)), pool.index_data(LayerId(l)),
                           static_cast<size_t>(pool.num_slots() * pool.index_row_bytes()));
      }
      device_platform->synchronize();
      BackendContext ctx{.platform = device_platform, .kv_pool = &dev_pool, .req_to_token = &table};
      auto impl = make_under_test(registry, backend.spec, req, ctx);
      impl->init_forward_metadata(batch);
      impl->select_index_topk(layer, iq, k, topk, scores);
      device_platform->synchronize();
    }
  } catch (const Error& e) {
    return {Verdict::kFail, fmt::format("threw {}{}", e.what(),
                                        e.code() == ErrorCode::kUnsupported
                                            ? " (capabilities() declare this case supported)"
                                            : "")};
  }

  // ---- the oracle, row by row ----
  auto fail = [&](int t, std::string what) {
    return CaseResult{Verdict::kFail,
                      fmt::format("row {} (request {}, position {}{}): {}", t, row_req[t],
                                  row_pos[t], t == zero_row ? ", zero head weights" : "", what)};
  };
  for (int t = 0; t < n; ++t) {
    const int b = row_req[t], visible = row_pos[t] + 1;
    std::vector<double> s(static_cast<size_t>(visible)), tol(static_cast<size_t>(visible));
    std::vector<std::vector<double>> qt;  // the row's query heads on the key grid
    for (int h = 0; h < heads; ++h)
      qt.push_back(oracle_key(q.data() + (static_cast<size_t>(t) * heads + h) * kIndexDim));
    for (int p = 0; p < visible; ++p) {
      const std::vector<double> key = oracle_key(keys[b].data() + p * kIndexDim);
      double acc = 0, mag = 0;
      for (int h = 0; h < heads; ++h) {
        double dot = 0, dmag = 0;
        for (int j = 0; j < kIndexDim; ++j) {
          const double term = qt[static_cast<size_t>(h)][static_cast<size_t>(j)] * key[j];
          dot += term;
          dmag += std::fabs(term);
        }
        const double wh = w[static_cast<size_t>(t) * heads + h];
        acc += wh * std::max(dot, 0.0);
        mag += std::fabs(wh) * dmag;
      }
      s[p] = acc;
      tol[p] = 1e-6 * (1 + std::fabs(acc)) + 4e-6 * mag;
    }
    const int m = std::min(k, visible);
    const int32_t* sel = topk.data() + static_cast<size_t>(t) * k;
    const float* got = scores.data() + static_cast<size_t>(t) * k;
    std::vector<uint8_t> kept(static_cast<size_t>(visible), 0);
    for (int i = 0; i < k; ++i) {
      if (i >= m) {
        if (sel[i] != -1 || !(std::isinf(got[i]) && got[i] < 0)) {
          return fail(t, fmt::format("entry {} of {} kept is {} (score {}), not -1 (-inf)", i, m,
                                     sel[i], got[i]));
        }
        continue;
      }
      const int32_t p = sel[i];
      if (p < 0 || p >= visible || kept[p]) {
        return fail(t, fmt::format("entry {} is position {}: outside [0, {}) or listed twice "
                                   "({} of min(k {}, visible {}) expected)",
                                   i, p, visible, m, k, visible));
      }
      kept[p] = 1;
      if (!(std::fabs(got[i] - s[p]) <= tol[p])) {
        return fail(t, fmt::format("score of position {} is {}, the oracle's {} (tolerance {})", p,
                                   got[i], s[p], tol[p]));
      }
      if (i > 0) {
        const int32_t prev = sel[i - 1];
        const bool tie_order = got[i] == got[i - 1] && prev > p;
        if (s[prev] < s[p] - tol[p] - tol[prev] || tie_order) {
          return fail(t, fmt::format("positions {} ({}) then {} ({}): not in (score desc, "
                                     "position asc) order",
                                     prev, s[prev], p, s[p]));
        }
      }
    }
    if (m == 0) continue;
    const int32_t last = sel[m - 1];
    for (int p = 0; p < visible; ++p) {
      if (kept[p]) continue;
      if (s[p] > s[last] + tol[p] + tol[last] || (s[p] == s[last] && p < last)) {
        return fail(t, fmt::format("position {} (score {}) left out while {} (score {}) was "
                                   "kept; ties go to the earlier token",
                                   p, s[p], last, s[last]));
      }
    }
  }
  return {Verdict::kPass, {}};
}

}  // namespace pagoda::backends::conformance
