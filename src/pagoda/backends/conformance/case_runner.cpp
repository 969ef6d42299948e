// One conformance case: builds the pool, the table and the batch; runs the backend under test
// through the full path (on its device: a device pool and device tensors for device backends);
// runs the oracle over a dense copy on the host; compares.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include <fmt/format.h>

#include "pagoda/attention/backend.h"
#include "pagoda/backends/builtin.h"
#include "pagoda/backends/conformance/conformance.h"
#include "pagoda/backends/conformance/oracle.h"
#include "pagoda/backends/conformance/tensors.h"
#include "pagoda/backends/reference/reference_backend.h"
#include "pagoda/core/error.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/platform/platform.h"

namespace pagoda::backends::conformance {

using namespace pagoda::attention;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

/// The logical content of the step: token values and where each token lives.
struct Scenario {
  int k_row = 0, v_row = 0;                  ///< floats per token row
  std::vector<float> k_store, v_store;       ///< [num_tokens, k_row] / [num_tokens, v_row]
  std::vector<std::vector<int>> tok;         ///< [b][position] logical token id
  std::vector<std::vector<int32_t>> slot;    ///< [b][position] pool slot
  std::vector<std::vector<std::vector<int>>> branch_tok;       ///< draft [b][t][j]
  std::vector<std::vector<std::vector<int32_t>>> branch_slot;  ///< draft [b][t][j]
  std::vector<std::vector<int>> parent;      ///< verify tree [b][node]
};


int new_token(Scenario& s, std::mt19937_64& rng, DType model_dtype) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int id = static_cast<int>(s.k_store.size() / static_cast<size_t>(s.k_row));
  for (int i = 0; i < s.k_row; ++i) s.k_store.push_back(round_to(model_dtype, u(rng)));
  for (int i = 0; i < s.v_row; ++i) s.v_store.push_back(round_to(model_dtype, u(rng)));
  return id;
}

/// Copies every layer of the host pool `src` into the device pool `dst` (same config).
void upload_pool(const kv::KvPool& src, kv::KvPool& dst, platform::Allocator& allocator) {
  const size_t elem = dtype_size(src.config().dtype);
  const auto k_bytes = static_cast<size_t>(src.num_slots() * src.k_row_elems()) * elem;
  const auto v_bytes = static_cast<size_t>(src.num_slots() * src.v_row_elems()) * elem;
  for (int32_t l = 0; l < src.num_layers(); ++l) {
    const LayerId id(l);
    allocator.copy_to_device(dst.k_view(id).data(), src.k_view(id).data(), k_bytes);
    // MLA: V is a view into K's latent rows, already copied.
    if (src.config().layout == kv::KvLayout::kMha) {
      allocator.copy_to_device(dst.v_view(id).data(), src.v_view(id).data(), v_bytes);
    }
  }
}

struct Tolerance {
  double atol, rtol;
};
Tolerance tolerance_for(DType out) {
  switch (out) {
    case DType::kF32: return {2e-4, 2e-3};
    case DType::kF16: return {3e-3, 5e-3};
    default: return {1.6e-2, 1.6e-2};
  }
}

/// The dtype a backend may compute the query in: the query's, or the KV's where that is a coarser
/// activation dtype (amx rounds f32 queries to its bf16 KV). A case's tolerance is this dtype's,
/// and the oracle's LSE bound allows the query's rounding to it (its unit roundoff).
DType query_compute_dtype(DType q, DType kv) {
  auto rank = [](DType t) { return t == DType::kF32 ? 0 : t == DType::kF16 ? 1 : 2; };
  const bool kv_activation = kv == DType::kF32 || kv == DType::kF16 || kv == DType::kBF16;
  return kv_activation && rank(kv) > rank(q) ? kv : q;
}

/// kDraftExtend lengths of request b of bs: accepted tokens 1..num_steps+1 over a prefix >= 1.
/// Request 0: one token after a few; request 1 (bs >= 3): all num_steps+1, starting on the
/// last slot of a page (they cross into the next page); the last request: a prefix within the
/// top eighth of max_len; the others random.
template <typename Uniform>
void draft_extend_lengths(const Case& c, int b, int bs, Uniform& uniform_int, int& prefix,
                          int& ext) {
  const int full = c.num_steps + 1;
  if (b == 0) {
    prefix = uniform_int(1, std::min(8, c.max_len));
    ext = 1;
  } else if (b == 1 && bs >= 3) {
    const int pages = std::max(1, c.max_len / c.page_size);
    prefix = std::max(1, uniform_int(1, pages) * c.page_size - 1);
    ext = full;
  } else if (b == bs - 1) {
    prefix = uniform_int(c.max_len - c.max_len / 8, c.max_len);
    ext = uniform_int(1, full);
  } else {
    prefix = uniform_int(1, c.max_len);
    ext = uniform_int(1, full);
  }
}

/// The DSA selection of a request's `ext` query rows over `prefix` cached tokens: row i sees
/// positions [0, prefix + i] and keeps the k of highest random score (0..3, so ties are common),
/// ties to the lower position; appended to `topk` in score order, padded with -1, and set in
/// the oracle row's mask.
void select_topk(int k, int prefix, int ext, std::mt19937_64& rng, DenseRow& row,
                 std::vector<int32_t>& topk) {
  const int kv = prefix + ext;
  row.bits.assign(static_cast<size_t>(ext) * kv, 0);
  for (int i = 0; i < ext; ++i) {
    std::vector<int> score(static_cast<size_t>(prefix + i + 1));
    for (int& x : score) x = static_cast<int>(rng() % 4);
    std::vector<int32_t> order(score.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return score[a] > score[b]; });
    order.resize(std::min(order.size(), static_cast<size_t>(k)));
    for (int32_t p : order) row.bits[static_cast<size_t>(i) * kv + p] = 1;
    order.resize(static_cast<size_t>(k), -1);
    topk.insert(topk.end(), order.begin(), order.end());
  }
}

}  // namespace

BackendCapabilities capabilities_of(const BackendRegistry& registry, const std::string& spec) {
  if (spec.rfind("mutant", 0) == 0) return ReferenceBackend::static_capabilities();
  const auto plus = spec.find('+');
  if (plus != std::string::npos) {
    return hybrid_capabilities(registry.capabilities(spec.substr(0, plus)),
                               registry.capabilities(spec.substr(plus + 1)));
  }
  return registry.capabilities(spec);
}

std::unique_ptr<AttentionBackend> make_under_test(const BackendRegistry& registry,
                                                  const std::string& spec,
                                                  const BackendRequirements& req,
                                                  const BackendContext& ctx) {
  if (spec.rfind("mutant", 0) == 0) {
    return make_mutant(spec, ctx);
  }
  const auto plus = spec.find('+');
  if (plus != std::string::npos) {
    return make_backend(registry,
                        BackendSelection{.attention = {},
                                         .prefill = spec.substr(0, plus),
                                         .decode = spec.substr(plus + 1),
                                         .verify = VerifyRoute::kPrefill},
                        req, ctx);
  }
  return registry.create(spec, req, ctx);
}

std::string device_of(const BackendRegistry& registry, const std::string& spec) {
  return capabilities_of(registry, spec).device;
}

CaseResult run_case(const BackendRegistry& registry, const BackendUnderTest& backend,
                    const Case& c, uint64_t seed, platform::Platform* device_platform) {
  if (c.linear.op != LinearOp::kNone)
    return run_linear_case(registry, backend, c, seed, device_platform);
  if (c.dsa_indexer) return run_indexer_case(registry, backend, c, seed, device_platform);
  const BackendCapabilities caps = capabilities_of(registry, backend.spec);
  BackendRequirements req = c.requirements();
  req.device = caps.device;  // the case runs wherever the backend does
  if (auto why = unsupported_reason(caps, req)) return {Verdict::kUnsupported, *why};
  const bool on_device = caps.device != "cpu";
  PAGODA_REQUIRE(!on_device || (device_platform != nullptr && device_platform->name() == caps.device),
                 kFailedPrecondition, "backend '{}' runs on {} but the harness has {} platform",
                 backend.spec, caps.device,
                 device_platform != nullptr ? "a " + device_platform->name() : std::string("no"));

  std::mt19937_64 rng(seed);
  auto uniform_int = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int bs = c.mode == ForwardMode::kMixed ? c.batch_size + 1 : c.batch_size;
  const int P = c.page_size;
  const bool verify = c.mode == ForwardMode::kTargetVerify;
  const bool draft = c.draft_step >= 0;
  const int D = c.num_draft_tokens;
  const int hkv = c.mla ? 1 : c.num_kv_heads;

  // ---- lengths per request: committed prefix (cached), new query tokens, table length ----
  std::vector<int> prefix(bs), ext(bs), table_len(bs);
  for (int b = 0; b < bs; ++b) {
    const bool decode_like = c.mode == ForwardMode::kDecode ||
                             (c.mode == ForwardMode::kMixed && b % 2 == 1);
    if (draft || verify) {
      prefix[b] = uniform_int(1, c.max_len);
      ext[b] = draft ? 1 : D;
    } else if (c.mode == ForwardMode::kDraftExtend) {
      draft_extend_lengths(c, b, bs, uniform_int, prefix[b], ext[b]);
    } else if (c.long_kv > 0) {
      // Long context: even requests near long_kv keys (request 0 exactly), odd ones 1 token.
      ext[b] = decode_like ? 1 : uniform_int(1, 8);
      const int keys = b == 0 ? c.long_kv : uniform_int(c.long_kv - c.long_kv / 4, c.long_kv);
      prefix[b] = b % 2 == 0 ? keys - ext[b] : 0;
      if (b % 2 == 1) ext[b] = 1;
    } else if (decode_like) {
      prefix[b] = uniform_int(0, c.max_len - 1);
      ext[b] = 1;
    } else {
      prefix[b] = b == 0 ? 0 : uniform_int(1, c.max_len);
      ext[b] = uniform_int(1, 16);
    }
    table_len[b] = prefix[b] + (draft ? (c.topk == 1 ? c.num_steps : 0) : ext[b]);
  }

  // ---- pages: shuffled ids 1..num_pages, handed out in that order (non-contiguous) ----
  int pages_needed = 0;
  for (int b = 0; b < bs; ++b) {
    pages_needed += (table_len[b] + P - 1) / P;
    if (draft && c.topk > 1) pages_needed += c.topk * ((prefix[b] % P + c.num_steps + P - 1) / P);
  }
  const int num_pages = pages_needed + 4;
  std::vector<int32_t> free_pages(static_cast<size_t>(num_pages));
  std::iota(free_pages.begin(), free_pages.end(), 1);
  std::shuffle(free_pages.begin(), free_pages.end(), rng);
  size_t next_page = 0;

  Scenario s;
  s.k_row = c.mla ? c.head_dim_qk : hkv * c.head_dim_qk;
  s.v_row = c.mla ? 0 : hkv * c.head_dim_v;
  s.tok.resize(bs);
  s.slot.resize(bs);
  for (int b = 0; b < bs; ++b) {
    int32_t page = 0;
    for (int i = 0; i < table_len[b]; ++i) {
      if (i % P == 0) page = free_pages[next_page++];
      s.slot[b].push_back(page * P + i % P);
      s.tok[b].push_back(new_token(s, rng, c.q_dtype));
    }
  }
  if (draft) {
    s.branch_tok.assign(bs, std::vector<std::vector<int>>(c.topk));
    s.branch_slot.assign(bs, std::vector<std::vector<int32_t>>(c.topk));
    for (int b = 0; b < bs; ++b) {
      for (int t = 0; t < c.topk; ++t) {
        int32_t page = 0;
        for (int j = 0; j < c.num_steps; ++j) {
          s.branch_tok[b][t].push_back(c.topk == 1 ? s.tok[b][prefix[b] + j]
                                                   : new_token(s, rng, c.q_dtype));
          if (c.topk == 1) {
            s.branch_slot[b][t].push_back(s.slot[b][prefix[b] + j]);
            continue;
          }
          const int off = prefix[b] % P + j;  // sglang: fresh pages per branch, tail offset kept
          if (j == 0 || off % P == 0) page = free_pages[next_page++];
          s.branch_slot[b][t].push_back(page * P + off % P);
        }
      }
    }
  }
  if (verify) {
    s.parent.resize(bs);
    for (int b = 0; b < bs; ++b) {
      s.parent[b].push_back(-1);
      // A window case's tree (topk > 1, D >= 5) starts with a root branch and a path of depth 3
      // (nodes 1 and 2 under the root, 3 under 1, 4 under 3): node i's position prefix + depth
      // lies below prefix + i, which a window measured from the node's index gets wrong.
      const bool deep = c.window_left >= 0 && c.topk > 1 && D >= 5;
      constexpr int kDeepParents[] = {-1, 0, 0, 1, 3};
      for (int j = 1; j < D; ++j) {
        s.parent[b].push_back(c.topk == 1 ? j - 1
                              : deep && j < 5 ? kDeepParents[j]
                                              : uniform_int(0, j - 1));
      }
    }
  }

  // ---- pool (NaN everywhere, then the cached tokens) and table ----
  auto platform = platform::make_cpu_platform();
  kv::KvPoolConfig pool_cfg{.layout = c.mla ? kv::KvLayout::kMla : kv::KvLayout::kMha,
                            .num_layers = 2,
                            .num_pages = num_pages,
                            .page_size = P,
                            .dtype = c.kv_dtype};
  if (c.mla) {
    pool_cfg.kv_lora_rank = c.head_dim_v;
    pool_cfg.rope_dim = c.head_dim_qk - c.head_dim_v;
    pool_cfg.index_head_dim = c.dsa_topk > 0 ? 8 : 0;
  } else {
    pool_cfg.num_kv_heads = hkv;
    pool_cfg.head_dim = c.head_dim_qk;
    pool_cfg.head_dim_v = c.head_dim_v;
  }
  // The host pool holds the cached tokens; device backends get a byte copy on their device.
  kv::KvPool pool(pool_cfg, platform->allocator());
  const LayerId layer_id(1);
  pool.set_scales(layer_id, c.k_scale, c.v_scale);
  pool.fill(kNaN);
  int max_ctx = 8;
  for (int b = 0; b < bs; ++b) max_ctx = std::max(max_ctx, table_len[b] + 8);
  kv::ReqToTokenTable table(bs + 3, max_ctx);
  std::vector<ReqSlot> rows;
  for (int i = 0; i < bs + 3; ++i) rows.push_back(*table.alloc());
  std::shuffle(rows.begin(), rows.end(), rng);
  for (int b = 0; b < bs; ++b) table.write(rows[b], 0, s.slot[b]);

  std::vector<int> cached_tok;
  std::vector<int32_t> cached_slot;
  for (int b = 0; b < bs; ++b) {
    for (int i = 0; i < prefix[b]; ++i) {
      cached_tok.push_back(s.tok[b][i]);
      cached_slot.push_back(s.slot[b][i]);
    }
    for (int t = 0; draft && t < c.topk; ++t) {
      for (int j = 0; j < c.draft_step; ++j) {
        cached_tok.push_back(s.branch_tok[b][t][j]);
        cached_slot.push_back(s.branch_slot[b][t][j]);
      }
    }
  }
  {
    HostTensor ck = gather_rows(s.k_store, s.k_row, cached_tok, DType::kF32, hkv);
    HostTensor cv = c.mla ? HostTensor() : gather_rows(s.v_store, s.v_row, cached_tok, DType::kF32, hkv);
    if (!cached_tok.empty()) pool.set_kv(layer_id, cached_slot, ck.view(), cv.view());
  }

  // ---- the batch ----
  ForwardBatch batch;
  batch.mode = c.mode;
  batch.batch_size = bs;
  std::vector<int> new_tok;
  std::vector<DenseRow> dense;
  std::vector<int32_t> dsa_topk;  // [tokens, c.dsa_topk], the step's DSA selection
  for (int b = 0; b < bs; ++b) {
    batch.req_pool_indices.push_back(rows[b].value());
    if (draft) {
      batch.seq_lens.push_back(prefix[b]);
      for (int t = 0; t < c.topk; ++t) {
        batch.out_cache_loc.push_back(s.branch_slot[b][t][c.draft_step]);
        batch.positions.push_back(prefix[b] + c.draft_step);
        new_tok.push_back(s.branch_tok[b][t][c.draft_step]);
        DenseRow r{.qo_len = 1, .toks = {s.tok[b].begin(), s.tok[b].begin() + prefix[b]}, .bits = {}};
        for (int j = 0; j <= c.draft_step; ++j) r.toks.push_back(s.branch_tok[b][t][j]);
        dense.push_back(std::move(r));
      }
      for (int t = 0; t < c.topk; ++t) {
        for (int j = 0; j < c.num_steps; ++j) batch.spec.draft_slots.push_back(s.branch_slot[b][t][j]);
      }
      continue;
    }
    batch.seq_lens.push_back(verify ? prefix[b] : prefix[b] + ext[b]);
    if (c.mode != ForwardMode::kDecode) {
      batch.extend_prefix_lens.push_back(prefix[b]);
      batch.extend_seq_lens.push_back(ext[b]);
    }
    DenseRow r{.qo_len = ext[b], .toks = s.tok[b], .bits = {}};
    r.toks.resize(static_cast<size_t>(prefix[b] + ext[b]));
    for (int i = 0; i < ext[b]; ++i) {
      batch.out_cache_loc.push_back(s.slot[b][prefix[b] + i]);
      new_tok.push_back(s.tok[b][prefix[b] + i]);
      int depth = i;
      if (verify) {
        depth = 0;
        for (int a = s.parent[b][i]; a >= 0; a = s.parent[b][a]) ++depth;
      }
      batch.positions.push_back(prefix[b] + depth);
    }
    if (verify) {  // the oracle's key positions: the prefix, then each node at prefix + depth
      r.pos.resize(static_cast<size_t>(prefix[b]));
      std::iota(r.pos.begin(), r.pos.end(), 0);
      r.pos.insert(r.pos.end(), batch.positions.end() - ext[b], batch.positions.end());
    }
    if (verify && c.tree_mask) {
      const int kv = prefix[b] + D;
      r.bits.assign(static_cast<size_t>(D * kv), 0);
      for (int i = 0; i < D; ++i) {
        std::vector<uint8_t> row(static_cast<size_t>(kv), 0);
        std::fill(row.begin(), row.begin() + prefix[b], 1);
        for (int a = i; a >= 0; a = s.parent[b][a]) row[prefix[b] + a] = 1;
        batch.spec.tree_mask.insert(batch.spec.tree_mask.end(), row.begin(), row.end());
        std::copy(row.begin(), row.end(), r.bits.begin() + i * kv);
      }
    }
    if (c.dsa_topk > 0) select_topk(c.dsa_topk, prefix[b], ext[b], rng, r, dsa_topk);
    dense.push_back(std::move(r));
  }
  if (draft) {
    batch.spec.topk = c.topk;
    batch.spec.num_steps = c.num_steps;
    batch.spec.draft_step = c.draft_step;
  }
  if (verify) {
    batch.spec.topk = c.topk;
    batch.spec.num_draft_tokens = D;
  }
  const int n = batch.num_tokens();

  // ---- inputs, layer, poisoned outputs ----
  HostTensor q = random_tensor({n, c.num_q_heads, c.head_dim_qk}, c.q_dtype, rng);
  HostTensor k_new = gather_rows(s.k_store, s.k_row, new_tok, c.q_dtype, hkv);
  HostTensor v_new = c.mla ? HostTensor() : gather_rows(s.v_store, s.v_row, new_tok, c.q_dtype, hkv);
  std::vector<float> sinks;
  if (c.sinks) {
    std::uniform_real_distribution<float> u(-1.f, 2.f);
    for (int h = 0; h < c.num_q_heads; ++h) sinks.push_back(u(rng));
  }
  AttentionLayer layer{.layer_id = layer_id,
                       .num_q_heads = c.num_q_heads,
                       .num_kv_heads = hkv,
                       .head_dim_qk = c.head_dim_qk,
                       .head_dim_v = c.head_dim_v,
                       .scaling = 1.f / std::sqrt(c.mla ? 192.f : float(c.head_dim_qk)),
                       .logit_cap = c.logit_cap,
                       .sliding_window = c.window_left,
                       .mask = c.mask,
                       .sinks = sinks,
                       .k_scale = c.k_scale,
                       .v_scale = c.v_scale,
                       .is_mla = c.mla};
  HostTensor out = filled_tensor({n, c.num_q_heads, c.head_dim_v}, c.q_dtype, kNaN);
  HostTensor lse = filled_tensor({n, c.num_q_heads}, DType::kF32, kNaN);
  // The ragged column's gathered rows (every visible row of the step, NaN-poisoned).
  const int64_t keys = batch.seq_lens_sum();
  HostTensor gk, gv;
  if (c.ragged) {
    gk = filled_tensor({keys, hkv, c.head_dim_qk}, c.kv_dtype, kNaN);
    gv = filled_tensor({keys, hkv, c.head_dim_v}, c.kv_dtype, kNaN);
  }
  const bool want_lse = caps.lse;
  // The step on `impl`: forward, or the ragged column's three calls.
  auto attend = [&](AttentionBackend& impl, const TensorView& qv, const TensorView& kv,
                    const TensorView& vv, const TensorView& ov, const TensorView& lv,
                    const TensorView& gkv, const TensorView& gvv) {
    impl.init_forward_metadata(batch);
    if (c.dsa_topk > 0) impl.set_sparse_topk(dsa_topk, c.dsa_topk);
    if (c.ragged) {
      impl.save_kv(kv, vv, layer, batch);
      impl.gather_kv(layer, batch, {}, gkv, gvv);
      impl.forward_ragged(qv, gkv, gvv, layer, batch, {}, ov, want_lse ? lv : TensorView());
      return;
    }
    if (want_lse) impl.set_lse_output(lv);
    impl.forward(qv, kv, vv, layer, batch, ov);
  };

  // ---- the backend under test: full path ----
  try {
    if (!on_device) {
      BackendContext ctx{.platform = platform.get(), .kv_pool = &pool, .req_to_token = &table};
      auto impl = make_under_test(registry, backend.spec, req, ctx);
      attend(*impl, q.view(), k_new.view(), v_new.view(), out.view(), lse.view(), gk.view(),
             gv.view());
    } else {
      // Same bytes on the device: the pool (NaN outside the cached tokens), the inputs and the
      // NaN-poisoned outputs; synchronise before the run (pageable copies may still be in flight
      // against a non-blocking stream) and before copying O / LSE back.
      platform::Allocator& dev = device_platform->allocator();
      kv::KvPool dev_pool(pool_cfg, dev);
      dev_pool.set_scales(layer_id, c.k_scale, c.v_scale);
      upload_pool(pool, dev_pool, dev);
      const DeviceTensor dq = to_device(q, dev), dk = to_device(k_new, dev),
                         dv = to_device(v_new, dev), dout = to_device(out, dev),
                         dlse = to_device(lse, dev), dgk = to_device(gk, dev),
                         dgv = to_device(gv, dev);
      device_platform->synchronize();
      {
        BackendContext ctx{.platform = device_platform, .kv_pool = &dev_pool, .req_to_token = &table};
        auto impl = make_under_test(registry, backend.spec, req, ctx);
        attend(*impl, dq.view, dk.view, dv.view, dout.view, dlse.view, dgk.view, dgv.view);
        device_platform->synchronize();
      }
      copy_back(dout, out, dev);
      copy_back(dlse, lse, dev);
    }
  } catch (const Error& e) {
    // Declared-unsupported cases never get here; an undeclared one is a failure.
    return {Verdict::kFail, fmt::format("threw {}{}", e.what(),
                                        e.code() == ErrorCode::kUnsupported
                                            ? " (capabilities() declare this case supported)"
                                            : "")};
  }

  // ---- the oracle over a dense copy ----
  const DType qc = query_compute_dtype(c.q_dtype, c.kv_dtype);
  const double q_rounding = qc == c.q_dtype          ? 0.0
                            : qc == DType::kBF16 ? 1.0 / 512    // 2^-9
                                                 : 1.0 / 2048;  // f16: 2^-11
  const Expected expected = dense_oracle(s.k_store, s.v_store, s.k_row, s.v_row, dense, q, layer,
                                         c.kv_dtype, c.mla, c.head_dim_v, q_rounding);
  const Tolerance tol = tolerance_for(qc);
  return compare(out, want_lse ? &lse : nullptr, expected, tol.atol, tol.rtol);
}

}  // namespace pagoda::backends::conformance
