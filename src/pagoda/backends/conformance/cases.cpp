#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pagoda/backends/conformance/conformance.h"

namespace pagoda::backends::conformance {

using attention::ForwardMode;
using attention::MaskKind;

namespace {

std::string linear_describe(const Case& c) {
  static constexpr const char* kOps[] = {"none", "prefill", "decode", "split", "restore", "verify"};
  const attention::LinearShape& s = c.linear.shape;
  std::string d = fmt::format("{} [{} H{} P{} N{} G{} K{} chunk {}", c.feature,
                              kOps[static_cast<int>(c.linear.op)], s.num_heads, s.head_dim,
                              s.state_size, s.num_groups, s.conv_kernel, s.chunk_size);
  if (s.dt_min > 0.f || std::isfinite(s.dt_max)) d += fmt::format(" dt [{}, {}]", s.dt_min, s.dt_max);
  return d + fmt::format(" tokens {}]", fmt::join(c.linear.lengths, ","));
}

}  // namespace

std::string Case::describe() const {
  if (linear.op != LinearOp::kNone) return linear_describe(*this);
  std::string s = fmt::format("{} [{} p{} h{}/{} d{}/{} q={} kv={}", feature,
                              attention::forward_mode_name(mode), page_size, num_q_heads,
                              num_kv_heads, head_dim_qk, head_dim_v, q_dtype, kv_dtype);
  if (k_scale != 1.f || v_scale != 1.f) s += fmt::format(" scales={}/{}", k_scale, v_scale);
  if (mla) s += " mla";
  if (mask == MaskKind::kNonCausal) s += " non-causal";
  if (window_left >= 0) s += fmt::format(" window={}", window_left);
  if (logit_cap > 0.f) s += fmt::format(" cap={}", logit_cap);
  if (sinks) s += " sinks";
  if (ragged) s += " ragged";
  if (long_kv > 0) s += fmt::format(" long={}", long_kv);
  if (dsa_topk > 0) s += fmt::format(" dsa{} k={}", dsa_indexer ? "-indexer" : "", dsa_topk);
  if (draft_step >= 0) s += fmt::format(" draft topk={} step={}/{}", topk, draft_step, num_steps);
  if (mode == ForwardMode::kDraftExtend) {
    s += fmt::format(" accepted 1..{} prefix<={}", num_steps + 1, max_len);
  }
  if (mode == ForwardMode::kTargetVerify) {
    s += fmt::format(" verify D={} topk={}{}", num_draft_tokens, topk, tree_mask ? "" : " chain");
  }
  return s + fmt::format(" bs={}]", batch_size);
}

attention::BackendRequirements Case::requirements() const {
  attention::BackendRequirements r;
  r.page_size = page_size;
  r.head_dim_qk = head_dim_qk;
  r.head_dim_v = head_dim_v;
  r.q_dtype = q_dtype;
  r.kv_dtype = kv_dtype;
  r.mla = mla;
  r.sliding_window = window_left >= 0;
  r.logit_cap = logit_cap > 0.f;
  r.sinks = sinks;
  r.non_causal = mask == MaskKind::kNonCausal;
  r.custom_mask = mode == ForwardMode::kTargetVerify && tree_mask;
  r.topk = topk;
  r.multi_step_draft = draft_step >= 0;
  r.mixed_batches = mode == ForwardMode::kMixed;
  r.dsa = dsa_topk > 0;
  r.dsa_indexer = dsa_indexer;
  r.ragged = ragged;
  return r;
}

attention::LinearRequirements Case::linear_requirements() const {
  return {.dtype = DType::kF32, .tree_verify = linear.op == LinearOp::kVerify};
}

namespace {

struct Heads {
  int q, kv;
};
constexpr Heads kMha{4, 4}, kGqa{8, 2}, kMqa{4, 1};

Case base(std::string feature, ForwardMode mode, int page, Heads h, int dim) {
  Case c;
  c.feature = std::move(feature);
  c.mode = mode;
  c.page_size = page;
  c.num_q_heads = h.q;
  c.num_kv_heads = h.kv;
  c.head_dim_qk = c.head_dim_v = dim;
  c.max_len = page >= 64 ? 150 : 90;
  return c;
}

Case mla_case(ForwardMode mode, int page) {
  Case c = base("mla", mode, page, Heads{8, 1}, 576);
  c.head_dim_v = 512;
  c.mla = true;
  c.max_len = page >= 64 ? 130 : 70;
  c.batch_size = 2;
  return c;
}

Case verify_case(int page, int topk, bool mask) {
  Case c = base("verify-tree", ForwardMode::kTargetVerify, page, kGqa, 128);
  c.topk = topk;
  c.num_draft_tokens = topk == 1 ? 4 : 6;
  c.tree_mask = mask;
  return c;
}

Case draft_case(int page, int topk, int step) {
  Case c = base(topk == 1 ? "draft-topk1" : "draft-topk>1", ForwardMode::kDecode, page, kGqa, 128);
  c.topk = topk;
  c.num_steps = 3;
  c.draft_step = step;
  return c;
}

std::vector<int> pick(bool quick, std::initializer_list<int> q, std::initializer_list<int> full) {
  return quick ? std::vector<int>(q) : std::vector<int>(full);
}

}  // namespace

/// The "long" column: split-KV chunks and hundreds of pages, 1-token requests beside long ones.
void add_long_cases(std::vector<Case>& cases, bool quick, int long_kv) {
  auto add = [&](ForwardMode mode, int page, Heads h, int bs) -> Case& {
    Case c = base("long", mode, page, h, 128);
    c.long_kv = long_kv;
    c.batch_size = bs;
    cases.push_back(c);
    return cases.back();
  };
  add(ForwardMode::kDecode, 16, kGqa, 4);
  add(ForwardMode::kExtend, 64, kGqa, 3);
  if (quick) return;
  add(ForwardMode::kDecode, 1, kMqa, 2);
  add(ForwardMode::kMixed, 16, kGqa, 2);
  add(ForwardMode::kDecode, 64, kGqa, 2).sinks = true;
  add(ForwardMode::kDecode, 16, kGqa, 2).window_left = long_kv / 2;
  Case& fp8 = add(ForwardMode::kDecode, 16, kGqa, 2);
  fp8.kv_dtype = DType::kFp8E4M3;
  fp8.k_scale = 0.5f;
  fp8.v_scale = 2.0f;
  Case& mla = add(ForwardMode::kDecode, 64, Heads{8, 1}, 2);
  mla.mla = true;
  mla.head_dim_qk = 576;
  mla.head_dim_v = 512;
  // MLA decode at DeepSeek's 128 q heads (the CUDA MLA kernel's 8 head blocks per chunk).
  Case& mla128 = add(ForwardMode::kDecode, 16, Heads{128, 1}, 2);
  mla128.mla = true;
  mla128.head_dim_qk = 576;
  mla128.head_dim_v = 512;
}

/// The "draft-extend" column: after verify, the draft model extends over each request's accepted
/// tokens (1..num_steps+1 per request, ragged; num_steps 0: every request accepted one) on top of
/// its prefix. Prefixes run from a few tokens to max_len (past the 256-key split-KV chunks in
/// the long cases); page sizes 1/16/64, MHA / GQA / MQA, bf16 / f16 / f32 and fp8 KV, window,
/// sinks, MLA. The case runner shapes the batch (case_runner.cpp, kDraftExtend).
void add_draft_extend_cases(std::vector<Case>& cases, bool quick) {
  auto add = [&](int page, Heads h, int steps) -> Case& {
    Case c = base("draft-extend", ForwardMode::kDraftExtend, page, h, 128);
    c.num_steps = steps;
    c.batch_size = 4;
    cases.push_back(c);
    return cases.back();
  };
  add(16, kGqa, 3);
  add(1, kMha, 3);
  Case& fp8 = add(64, kGqa, 3);
  fp8.kv_dtype = DType::kFp8E4M3;
  fp8.k_scale = 0.5f;
  fp8.v_scale = 2.0f;
  add(16, kGqa, 0).max_len = quick ? 600 : 1100;  // all accepted one: decode-shaped, split-KV
  if (quick) return;
  add(1, kGqa, 3);
  add(16, kMha, 3);
  add(64, kMha, 3);
  Case& f16 = add(16, kGqa, 5);
  f16.q_dtype = f16.kv_dtype = DType::kF16;
  Case& f32 = add(64, kMqa, 3);
  f32.q_dtype = f32.kv_dtype = DType::kF32;
  Case& e5m2 = add(1, kGqa, 3);
  e5m2.kv_dtype = DType::kFp8E5M2;
  e5m2.k_scale = 0.5f;
  e5m2.v_scale = 2.0f;
  add(16, kGqa, 5).max_len = 1100;  // ragged over long prefixes
  add(64, kGqa, 0).max_len = 1100;
  add(16, kGqa, 3).window_left = 9;
  add(64, kGqa, 3).sinks = true;
  Case& mla = add(64, Heads{8, 1}, 3);
  mla.mla = true;
  mla.head_dim_qk = 576;
  mla.head_dim_v = 512;
  mla.max_len = 130;
}

namespace {

/// The linear-* columns: three layer shapes (groups 2, 1 and one head per group; d_conv 4, 2
/// and 1; one with a time-step limit), each op at SSD chunks of 4, 8 and 64 (quick: one chunk
/// per shape), lengths around the chunk (1, q - 1, q, q + 1, 3q + 2); decode steps of 1 to 3
/// tokens; trees of 4 and 8 nodes.
void add_linear_cases(std::vector<Case>& cases, bool quick) {
  const std::vector<attention::LinearShape> shapes = {
      {.num_heads = 4, .head_dim = 4, .state_size = 8, .num_groups = 2, .conv_kernel = 4},
      {.num_heads = 2, .head_dim = 8, .state_size = 16, .num_groups = 1, .conv_kernel = 2,
       .dt_min = 0.01f, .dt_max = 0.8f},
      {.num_heads = 3, .head_dim = 2, .state_size = 4, .num_groups = 3, .conv_kernel = 1}};
  const std::vector<int> chunks = {4, 8, 64};
  auto add = [&](const char* feature, LinearOp op, const attention::LinearShape& shape, int q,
                 std::vector<int> lengths) {
    Case c;
    c.feature = feature;
    c.linear = {.op = op, .shape = shape, .lengths = std::move(lengths)};
    c.linear.shape.chunk_size = q;
    cases.push_back(std::move(c));
  };
  for (size_t i = 0; i < shapes.size(); ++i) {
    for (size_t j = 0; j < chunks.size(); ++j) {
      if (quick && j != i) continue;
      const int q = chunks[j];
      const std::vector<int> around = {1, std::max(1, q - 1), q, q + 1, 3 * q + 2};
      add("linear-prefill", LinearOp::kPrefill, shapes[i], q, around);
      add("linear-split", LinearOp::kSplit, shapes[i], q, {3 * q + 2, q + 1, 5});
      add("linear-restore", LinearOp::kRestore, shapes[i], q, {2 * q + 3, q, 2});
    }
    add("linear-decode", LinearOp::kDecode, shapes[i], 8, {1, 3, 2, 3});
    add("linear-verify", LinearOp::kVerify, shapes[i], 8, {i == 0 ? 4 : 8, 1, 11});
  }
}

}  // namespace

std::vector<Case> make_cases(bool quick, int long_kv) {
  std::vector<Case> cases;
  const std::vector<int> pages = pick(quick, {16}, {1, 16, 64});
  const std::vector<int> all_pages = {1, 16, 64};
  const std::vector<Heads> heads = {kMha, kGqa, kMqa};
  const std::vector<int> dims = {64, 128, 256};
  const std::vector<std::pair<std::string, ForwardMode>> modes = {
      {"decode", ForwardMode::kDecode}, {"extend", ForwardMode::kExtend}, {"mixed", ForwardMode::kMixed}};
  // Core modes over the page × heads × head-dim grid (quick: a diagonal of it).
  for (const auto& [name, mode] : modes) {
    if (quick) {
      for (int i = 0; i < 3; ++i) cases.push_back(base(name, mode, all_pages[i], heads[i], dims[i]));
      continue;
    }
    for (int p : all_pages)
      for (Heads h : heads)
        for (int d : dims) cases.push_back(base(name, mode, p, h, d));
  }
  for (int p : pages) {
    for (int d : pick(quick, {128}, {64, 128})) {
      Case c = base("non-causal", ForwardMode::kExtend, p, kGqa, d);
      c.mask = MaskKind::kNonCausal;
      cases.push_back(c);
    }
    for (ForwardMode m : {ForwardMode::kDecode, ForwardMode::kExtend}) {
      Case w = base("window", m, p, kGqa, 128);
      w.window_left = 9;
      cases.push_back(w);
      Case cap = base("softcap", m, p, kGqa, 128);
      cap.logit_cap = 1.5f;
      cases.push_back(cap);
      Case s = base("sinks", m, p, kGqa, 128);
      s.sinks = true;
      cases.push_back(s);
    }
  }
  const std::vector<int> spec_pages = pick(quick, {1, 16}, {1, 16, 64});
  for (int p : spec_pages) {
    cases.push_back(verify_case(p, 1, true));
    cases.push_back(verify_case(p, 4, true));
    if (!quick) cases.push_back(verify_case(p, 1, false));
    for (int step : pick(quick, {2}, {0, 2})) {
      cases.push_back(draft_case(p, 1, step));
      cases.push_back(draft_case(p, 3, step));
    }
  }
  // Tree verify under a sliding window smaller than the prefix (issue 52): depth >= 3 and a
  // root branch (case_runner's window trees), so a node's position is below its index; every
  // page size in the quick grid too, plus sinks and a soft cap on top in the full one.
  for (int p : all_pages) {
    Case v = verify_case(p, 2, true);
    v.feature = "verify-window";
    v.num_draft_tokens = 8;
    v.window_left = 9;
    cases.push_back(v);
    if (!quick) {
      v.topk = 4;
      v.sinks = true;
      v.logit_cap = 1.5f;
      cases.push_back(v);
    }
  }
  const std::vector<int> mla_pages = pick(quick, {64}, {1, 16, 64});
  for (int p : mla_pages) {
    for (ForwardMode m : {ForwardMode::kDecode, ForwardMode::kExtend}) cases.push_back(mla_case(m, p));
    if (!quick) {
      // Decode at 16 and 128 q heads (one and eight 16-head blocks of the CUDA MLA kernel).
      for (int hq : {16, 128}) {
        Case d = mla_case(ForwardMode::kDecode, p);
        d.num_q_heads = hq;
        cases.push_back(d);
      }
      Case v = mla_case(ForwardMode::kTargetVerify, p);
      v.topk = 2;
      v.num_draft_tokens = 4;
      cases.push_back(v);
    }
  }
  // DeepSeek sparse attention: absorbed MLA restricted to a top-k selection of 12 positions
  // (below most contexts of these cases, above the shortest), decode / extend / mixed steps.
  for (int p : pick(quick, {64}, {1, 16, 64})) {
    for (ForwardMode m : {ForwardMode::kDecode, ForwardMode::kExtend, ForwardMode::kMixed}) {
      if (quick && m == ForwardMode::kExtend) continue;
      Case c = mla_case(m, p);
      c.feature = "dsa";
      c.dsa_topk = 12;
      cases.push_back(c);
    }
  }
  // The DSA lightning indexer of an absorbed-MLA layer: 4 index heads (num_q_heads) of 32
  // dims (indexer_runner.cpp), k 16 (below most rows' visible positions), decode / extend /
  // mixed steps; contexts up to 200 keys.
  for (int p : pick(quick, {16}, {1, 16, 64})) {
    for (ForwardMode m : {ForwardMode::kDecode, ForwardMode::kExtend, ForwardMode::kMixed}) {
      if (quick && m == ForwardMode::kExtend) continue;
      Case c = mla_case(m, p);
      c.feature = "dsa-indexer";
      c.num_q_heads = 4;
      c.q_dtype = c.kv_dtype = DType::kF32;  // the CPU DSA engine's dtypes (queries stay f32)
      c.batch_size = 3;
      c.dsa_topk = 16;
      c.dsa_indexer = true;
      c.max_len = 200;
      cases.push_back(c);
    }
  }
  // The non-absorbed MLA prefill (DeepSeek-style Q/K 192 = 128 nope + 64 rope, V 128, kv heads =
  // q heads): extend and mixed steps, a tree verify (the CUDA sm90 prefill kernel's DQK / DV
  // pair).
  for (int p : pick(quick, {16}, {1, 16, 64})) {
    for (ForwardMode m : {ForwardMode::kExtend, ForwardMode::kMixed}) {
      Case c = base("mla-prefill", m, p, kMha, 192);
      c.head_dim_v = 128;
      cases.push_back(c);
    }
    if (!quick) {
      Case v = base("mla-prefill", ForwardMode::kTargetVerify, p, kMha, 192);
      v.head_dim_v = 128;
      v.topk = 2;
      v.num_draft_tokens = 4;
      v.tree_mask = true;
      cases.push_back(v);
    }
  }
  // Ragged attention (save_kv, gather_kv, forward_ragged): the expanded MLA shape (192 / 128,
  // kv heads = q heads) and GQA 8 / 2 at 128, extend and mixed steps.
  for (int p : pick(quick, {16}, {1, 16, 64})) {
    for (ForwardMode m : {ForwardMode::kExtend, ForwardMode::kMixed}) {
      Case c = base("ragged", m, p, kMha, 192);
      c.head_dim_v = 128;
      c.ragged = true;
      cases.push_back(c);
      if (quick) continue;
      Case g = base("ragged", m, p, kGqa, 128);
      g.ragged = true;
      cases.push_back(g);
    }
  }
  if (!quick) {
    // An fp8 e4m3 latent with a scale (one stored row: K and V share k_scale), at 16 and 128 q
    // heads and pages 1 / 16 / 64: on the CUDA backend's Hopper kernels the page-1 gather, the
    // TMA boxes within a tile and whole-page tiles, the transposed and the 64-row kernel.
    for (int p : {1, 16, 64}) {
      for (int hq : {16, 128}) {
        Case f = mla_case(ForwardMode::kDecode, p);
        f.num_q_heads = hq;
        f.kv_dtype = DType::kFp8E4M3;
        f.k_scale = 0.5f;
        f.v_scale = 0.5f;
        cases.push_back(f);
      }
    }
  }
  for (DType kv : {DType::kFp8E4M3, DType::kFp8E5M2}) {
    for (int p : pick(quick, {16}, {1, 16})) {
      for (ForwardMode m : {ForwardMode::kDecode, ForwardMode::kExtend}) {
        Case c = base(kv == DType::kFp8E4M3 ? "fp8-e4m3" : "fp8-e5m2", m, p, kGqa, 128);
        c.kv_dtype = kv;
        c.k_scale = 0.5f;
        c.v_scale = 2.0f;
        cases.push_back(c);
      }
    }
  }
  for (DType t : {DType::kF16, DType::kF32}) {
    for (int p : pages) {
      for (ForwardMode m : {ForwardMode::kDecode, ForwardMode::kExtend}) {
        Case c = base(t == DType::kF16 ? "f16" : "f32", m, p, kGqa, 128);
        c.q_dtype = c.kv_dtype = t;
        cases.push_back(c);
      }
    }
  }
  // f32 queries over bf16 KV: the CPU model's activations on a bf16 pool (--kv-dtype bf16).
  for (int p : pages) {
    for (ForwardMode m : {ForwardMode::kDecode, ForwardMode::kExtend}) {
      Case c = base("f32q-bf16kv", m, p, kGqa, 128);
      c.q_dtype = DType::kF32;
      cases.push_back(c);
    }
  }
  if (long_kv > 0) add_long_cases(cases, quick, long_kv);
  add_draft_extend_cases(cases, quick);
  add_linear_cases(cases, quick);
  return cases;
}

}  // namespace pagoda::backends::conformance
