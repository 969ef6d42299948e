// The mutant family: one fault each (a ReferenceFaults fault of the reference oracle or of its
// DSA indexer, a draft-extend planning or DSA selection fault in front of the reference backend, or
// a LinearFaults fault of the reference linear backend), and the column that must catch it.
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "pagoda/attention/backend.h"
#include "pagoda/backends/conformance/conformance.h"
#include "pagoda/backends/conformance/tensors.h"
#include "pagoda/backends/reference/reference_backend.h"
#include "pagoda/backends/reference/reference_linear_backend.h"
#include "pagoda/core/error.h"

namespace pagoda::backends::conformance {

using attention::ForwardBatch;
using attention::ForwardMode;

namespace {

/// A fault in how a backend plans a kDraftExtend batch (the arithmetic stays the reference's).
enum class DraftExtendFault : uint8_t {
  kNone,
  kAsDecode,  ///< every accepted token planned as a decode row over its request's whole kv
  kKvShort,   ///< each request's kv range ends one key early (its last accepted token's key)
};

struct Member {
  MutantInfo info;
  ReferenceFaults faults;
  DraftExtendFault draft_extend = DraftExtendFault::kNone;
  bool dsa_drop_first = false;  ///< each row's DSA selection without its first entry
  /// A linear-kind mutant: the reference linear backend with this fault.
  std::optional<LinearFaults> linear;
  bool ragged_shift = false;  ///< gather_kv's rows one position late per request
};

/// The batch a backend with `fault` would plan for the kDraftExtend batch `b`.
ForwardBatch rewrite_draft_extend(const ForwardBatch& b, DraftExtendFault fault) {
  ForwardBatch r = b;
  if (fault == DraftExtendFault::kAsDecode) {
    // One decode row per query token, each over the request's full seq_len: the accepted tokens
    // see each other both ways (exact only for a request with one accepted token).
    r.mode = ForwardMode::kDecode;
    r.batch_size = b.num_tokens();
    r.req_pool_indices.clear();
    r.seq_lens.clear();
    r.extend_prefix_lens.clear();
    r.extend_seq_lens.clear();
    for (int i = 0; i < b.batch_size; ++i) {
      for (int t = 0; t < b.extend_seq_lens[i]; ++t) {
        r.req_pool_indices.push_back(b.req_pool_indices[i]);
        r.seq_lens.push_back(b.seq_lens[i]);
      }
    }
  } else if (fault == DraftExtendFault::kKvShort) {
    // kv = seq_len - 1 keys under the same queries: bottom-right causal alignment shifts every
    // query one key back, so no request sees its last accepted token.
    for (int i = 0; i < b.batch_size; ++i) {
      PAGODA_REQUIRE(b.extend_prefix_lens[i] >= 1, kInvalidArgument,
                     "mutant: draft-extend request {} has no prefix", i);
      --r.seq_lens[i];
      --r.extend_prefix_lens[i];
    }
  }
  return r;
}

/// The reference backend behind a planning fault: kDraftExtend batches are rewritten before
/// they reach it (DraftExtendFault), each row of a DSA selection loses its first entry
/// (dsa_drop_first), or gather_kv hands each request's rows back one position late (its first
/// row dropped, its last repeated: ragged_shift); everything else passes through unchanged.
class PlanningMutant final : public attention::AttentionBackend {
 public:
  PlanningMutant(std::unique_ptr<attention::AttentionBackend> inner, DraftExtendFault fault,
                 bool dsa_drop_first, bool ragged_shift)
      : inner_(std::move(inner)),
        fault_(fault),
        dsa_drop_first_(dsa_drop_first),
        ragged_shift_(ragged_shift) {}

  std::string name() const override { return inner_->name(); }
  const attention::BackendCapabilities& capabilities() const override {
    return inner_->capabilities();
  }
  void init_forward_metadata(const ForwardBatch& batch) override {
    rewritten_ = batch.mode == ForwardMode::kDraftExtend ? rewrite_draft_extend(batch, fault_)
                                                         : batch;
    inner_->init_forward_metadata(rewritten_);
  }
  void forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                      const attention::AttentionLayer& layer, const ForwardBatch& batch,
                      const TensorView& out, attention::SaveKv save) override {
    pass_lse();
    if (batch.mode == ForwardMode::kDraftExtend) {
      inner_->forward(q, k, v, layer, rewritten_, out, save);
    } else {
      inner_->forward_extend(q, k, v, layer, batch, out, save);
    }
  }
  void forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                      const attention::AttentionLayer& layer, const ForwardBatch& batch,
                      const TensorView& out, attention::SaveKv save) override {
    pass_lse();
    inner_->forward_decode(q, k, v, layer, batch, out, save);
  }
  const attention::IndexerMetadata* get_indexer_metadata() const override {
    return inner_->get_indexer_metadata();
  }
  void set_sparse_topk(std::span<const int32_t> topk, int k) override {
    std::vector<int32_t> faulty(topk.begin(), topk.end());
    for (size_t row = 0; dsa_drop_first_ && row < faulty.size(); row += static_cast<size_t>(k)) {
      faulty[row] = -1;
    }
    inner_->set_sparse_topk(faulty, k);
  }
  void select_index_topk(LayerId layer, const attention::IndexerQuery& q, int k,
                         std::span<int32_t> topk, std::span<float> scores) override {
    inner_->select_index_topk(layer, q, k, topk, scores);
  }
  void save_kv(const TensorView& k, const TensorView& v, const attention::AttentionLayer& layer,
               const ForwardBatch& batch) override {
    inner_->save_kv(k, v, layer, batch);
  }
  void gather_kv(const attention::AttentionLayer& layer, const ForwardBatch& batch,
                 const attention::KeyWindows& windows, const TensorView& k_out,
                 const TensorView& v_out) override {
    inner_->gather_kv(layer, batch, windows, k_out, v_out);
    if (!ragged_shift_) return;
    for (const TensorView* t : {&k_out, &v_out}) {  // host, contiguous (check_gather_outputs)
      if (t->numel() == 0) continue;
      const size_t row = t->nbytes() / static_cast<size_t>(t->size(0));
      auto* bytes = static_cast<unsigned char*>(t->data());
      size_t first = 0;
      for (int32_t len : batch.seq_lens) {
        for (int32_t j = 0; j + 1 < len; ++j)
          std::memcpy(bytes + (first + j) * row, bytes + (first + j + 1) * row, row);
        first += static_cast<size_t>(len);
      }
    }
  }
  void forward_ragged(const TensorView& q, const TensorView& k, const TensorView& v,
                      const attention::AttentionLayer& layer, const ForwardBatch& batch,
                      const attention::KeyWindows& windows, const TensorView& out,
                      const TensorView& lse) override {
    inner_->forward_ragged(q, k, v, layer, batch, windows, out, lse);
  }

 private:
  void pass_lse() {
    inner_->set_lse_output(lse_);
    lse_ = TensorView();
  }

  std::unique_ptr<attention::AttentionBackend> inner_;
  DraftExtendFault fault_;
  bool dsa_drop_first_;
  bool ragged_shift_;
  ForwardBatch rewritten_;
};

const std::vector<Member>& members() {
  static const std::vector<Member> all = {
      {{"mutant:causal-shift", "extend", "causal boundary one key early (the diagonal hidden)"},
       {.causal_shift = -1}},
      {{"mutant:drop-sinks", "sinks", "attention sinks ignored"}, {.drop_sinks = true}},
      {{"mutant:window+1", "window", "sliding window one key too wide"}, {.window_shift = 1}},
      {{"mutant:no-softcap", "softcap", "logit soft cap skipped"}, {.skip_softcap = true}},
      {{"mutant:tree-window", "verify-window",
        "tree verify window measured from a node's index, not its position (issue 52)"},
       {.window_by_index = true}},
      {{"mutant:mask-bit", "verify-tree", "one custom-mask bit flipped (last query, last key)"},
       {.flip_mask_bit = true}},
      {{"mutant:page+1", "long", "each request's last page read at page id + 1"},
       {.page_off_by_one = true}},
      {{"mutant:split-lse", "long",
        "keys past 256 merged as a second split-KV chunk with natural-log LSEs"},
       {.bad_split_merge_chunk = 256}},
      {{"mutant:fp8-scale", "fp8-e4m3", "k_scale / v_scale ignored on dequantisation"},
       {.ignore_kv_scale = true}},
      {{"mutant:gqa-map", "decode", "q head h reads kv head h % Hkv (not h / group)"},
       {.interleaved_gqa = true}},
      {{"mutant:dext-as-decode", "draft-extend",
        "draft extend planned as decode (each accepted token sees its request's whole kv)"},
       {},
       DraftExtendFault::kAsDecode},
      {{"mutant:dext-drop-last", "draft-extend",
        "draft-extend kv range one key short (each request's last accepted token left out)"},
       {},
       DraftExtendFault::kKvShort},
      {{"mutant:dsa-drop", "dsa",
        "DSA top-k missing one token (each row's highest-scored position left out)"},
       {},
       DraftExtendFault::kNone,
       true},
      {{"mutant:ragged-shift", "ragged",
        "gathered rows one position late (each request's first row dropped, its last repeated)"},
       {},
       DraftExtendFault::kNone,
       false,
       std::nullopt,
       true},
      {{"mutant:index-page", "dsa-indexer",
        "DSA indexer keys read one page off (each position's slot + page size)"},
       {.indexer = {.key_page_shift = true}}},
      {{"mutant:index-scale", "dsa-indexer", "DSA index keys' fp8 scales ignored"},
       {.indexer = {.ignore_scale = true}}},
      {{"mutant:index-drop", "dsa-indexer",
        "DSA indexer top-k missing one token (each row's best position left out)"},
       {.indexer = {.drop_best = true}}},
      {{"mutant:stale-state", "linear-decode",
        "linear state ignored (every call starts from a zero conv and SSM state)"},
       {},
       DraftExtendFault::kNone,
       false,
       LinearFaults{.stale_state = true}},
      {{"mutant:conv-window", "linear-prefill",
        "conv window off by one (token t reads inputs t-K..t-1, not t-K+1..t)"},
       {},
       DraftExtendFault::kNone,
       false,
       LinearFaults{.conv_shift = true}},
  };
  return all;
}

}  // namespace

const std::vector<MutantInfo>& mutant_family() {
  static const std::vector<MutantInfo> infos = [] {
    std::vector<MutantInfo> v;
    for (const Member& m : members()) v.push_back(m.info);
    return v;
  }();
  return infos;
}

const MutantInfo* find_mutant(const std::string& spec) {
  const std::string name = spec == "mutant" ? "mutant:causal-shift" : spec;
  for (const MutantInfo& m : mutant_family()) {
    if (m.spec == name) return &m;
  }
  return nullptr;
}

namespace {

const Member& member(const std::string& spec) {
  const std::string name = spec == "mutant" ? "mutant:causal-shift" : spec;
  for (const Member& m : members()) {
    if (m.info.spec == name) return m;
  }
  std::string names;
  for (const Member& m : members()) names += (names.empty() ? "" : ", ") + m.info.spec;
  throw_error(ErrorCode::kInvalidArgument, "--backends: unknown mutant '{}' (known: {}; \"mutant\" runs them all)", spec, names);
}

}  // namespace

ReferenceFaults mutant_faults(const std::string& spec) { return member(spec).faults; }

std::unique_ptr<attention::AttentionBackend> make_mutant(const std::string& spec,
                                                         const attention::BackendContext& ctx) {
  const Member& m = member(spec);
  auto reference = std::make_unique<ReferenceBackend>(ctx, m.faults, spec);
  if (m.draft_extend == DraftExtendFault::kNone && !m.dsa_drop_first && !m.ragged_shift)
    return reference;
  return std::make_unique<PlanningMutant>(std::move(reference), m.draft_extend, m.dsa_drop_first,
                                          m.ragged_shift);
}

std::unique_ptr<attention::LinearAttentionBackend> make_linear_mutant(const std::string& spec) {
  const Member& m = member(spec);
  if (!m.linear) return nullptr;
  return std::make_unique<ReferenceLinearBackend>(*m.linear, spec);
}

}  // namespace pagoda::backends::conformance
