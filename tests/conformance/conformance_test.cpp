#include <gtest/gtest.h>

#include <cstdio>

#include "pagoda/backends/builtin.h"
#include "pagoda/backends/conformance/conformance.h"
#include "pagoda/backends/reference/reference_backend.h"
#include "pagoda/core/error.h"
#ifdef PAGODA_HAVE_AMX_BACKEND
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "pagoda/core/float_convert.h"
#include "test_seed.h"

#include "pagoda/backends/amx/amx_backend.h"
#endif

namespace pagoda::backends::conformance {
namespace {

attention::BackendRegistry builtin() {
  attention::BackendRegistry r;
  register_builtin_backends(r);
  return r;
}

TEST(Conformance, QuickGridAllCpuBackendsPassAndEveryMutantIsCaughtInItsColumn) {
  const auto registry = builtin();
  Options options;
  options.quick = true;
  options.seed = 7;
  for (const auto& name : registry.names()) {
    if (registry.capabilities(name).device == "cpu") options.backends.push_back(name);
  }
  options.backends.push_back(registry.contains("cpu") ? "reference+cpu" : "reference+reference");
  options.backends.push_back("mutant");
  const Report report = run_conformance(registry, options);
  std::string failures;
  for (const auto& f : report.failures) failures += f + "\n";
  EXPECT_TRUE(report.failures.empty()) << failures << report.markdown();
  int mutants = 0;
  for (const BackendRow& row : report.rows) {
    if (!row.backend.expect_failure) continue;
    ++mutants;
    ASSERT_GE(row.target_col, 0) << row.backend.spec << ": column " << row.backend.target
                                 << " is not in the quick grid";
    EXPECT_GT(row.cells[static_cast<size_t>(row.target_col)].fail, 0)
        << row.backend.spec << " not caught in " << row.backend.target << "\n" << report.markdown();
  }
  EXPECT_EQ(mutants, static_cast<int>(mutant_family().size()));
  EXPECT_EQ(mutant_family().size(), 19u);
  EXPECT_TRUE(report.ok()) << report.markdown();
}

TEST(Conformance, MutantCaughtOnPlainDecode) {
  const auto registry = builtin();
  Case c;
  c.feature = "decode";
  const CaseResult ok = run_case(registry, {"reference", false, ""}, c, 11);
  EXPECT_EQ(ok.verdict, Verdict::kPass) << ok.message;
  const CaseResult bad = run_case(registry, {"mutant", true, "decode"}, c, 11);
  EXPECT_EQ(bad.verdict, Verdict::kFail) << bad.message;
}

// The draft-extend mutants fault only kDraftExtend planning: on the same shapes as extend they
// pass, and the decode-shaped fault needs a request with more than one accepted token.
TEST(Conformance, DraftExtendMutantsAreModeSpecific) {
  const auto registry = builtin();
  Case c;
  c.feature = "draft-extend";
  c.mode = attention::ForwardMode::kDraftExtend;
  c.batch_size = 4;
  c.num_steps = 3;
  const uint64_t seed = 20261201;
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const char* spec : {"mutant:dext-as-decode", "mutant:dext-drop-last"}) {
    const CaseResult ok = run_case(registry, {"reference", false, ""}, c, seed);
    EXPECT_EQ(ok.verdict, Verdict::kPass) << ok.message;
    const CaseResult bad = run_case(registry, {spec, true, "draft-extend"}, c, seed);
    EXPECT_EQ(bad.verdict, Verdict::kFail) << spec << ": " << bad.message;
    Case ext = c;
    ext.feature = "extend";
    ext.mode = attention::ForwardMode::kExtend;
    const CaseResult plain = run_case(registry, {spec, true, "extend"}, ext, seed);
    EXPECT_EQ(plain.verdict, Verdict::kPass) << spec << " on extend: " << plain.message;
  }
  Case ones = c;
  ones.num_steps = 0;  // every request accepted one token: decode-shaped, the fault is exact
  const CaseResult exact = run_case(registry, {"mutant:dext-as-decode", true, "draft-extend"}, ones, seed);
  EXPECT_EQ(exact.verdict, Verdict::kPass) << exact.message;
  const CaseResult shifted = run_case(registry, {"mutant:dext-drop-last", true, "draft-extend"}, ones, seed);
  EXPECT_EQ(shifted.verdict, Verdict::kFail) << shifted.message;
}

TEST(Conformance, UnknownMutantIsRejectedNamingTheFamily) {
  const auto registry = builtin();
  Options options;
  options.quick = true;
  options.backends = {"mutant:nope"};
  try {
    run_conformance(registry, options);
    FAIL() << "an unknown mutant was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("mutant:gqa-map"), std::string::npos) << e.what();
  }
}

TEST(Conformance, MissedMutantFailsTheRun) {
  // Failures outside the mutant's own column do not count: the row is caught only in it.
  BackendRow row{{"mutant:page+1", true, "long"}, std::vector<Cell>(2), 1, {}};
  row.cells[0].fail = 3;  // caught elsewhere only
  row.cells[1].pass = 2;
  EXPECT_FALSE(row.ok());
  row.cells[1].fail = 1;
  EXPECT_TRUE(row.ok());
  Report report;
  report.rows.push_back({{"mutant:page+1", true, "long"}, std::vector<Cell>(1), -1, {}});
  report.rows.back().cells[0].fail = 1;
  EXPECT_FALSE(report.ok()) << "a mutant whose column is absent from the grid is not caught";
}

// The LSE check resolves a single dropped key at 4,096 keys: the reference that ignores the
// visible key of smallest weight (the hardest single key to see) must fail, through its LSE.
TEST(Conformance, LongContextLseDetectsOneDroppedKey) {
  auto registry = builtin();
  registry.add("drop-one", "reference without its weakest key",
               ReferenceBackend::static_capabilities(), [](const attention::BackendContext& ctx) {
                 return std::make_unique<ReferenceBackend>(
                     ctx, ReferenceFaults{.drop_weakest_key = true}, "drop-one");
               });
  Case c;
  c.feature = "long";
  c.long_kv = 4096;
  c.batch_size = 2;
  c.page_size = 16;
  const uint64_t seed = 20261130;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const CaseResult ok = run_case(registry, {"reference", false, ""}, c, seed);
  EXPECT_EQ(ok.verdict, Verdict::kPass) << ok.message;
  const CaseResult bad = run_case(registry, {"drop-one", false, ""}, c, seed);
  ASSERT_EQ(bad.verdict, Verdict::kFail) << bad.message;
  std::printf("reference: %s\ndrop-one: %s\n", ok.message.c_str(), bad.message.c_str());
  EXPECT_NE(bad.message.find("lse["), std::string::npos)
      << "one dropped key should only be visible in the LSE: " << bad.message;
}

TEST(Conformance, DeclaredUnsupportedIsSkippedWithItsReason) {
  attention::BackendRegistry registry;
  attention::BackendCapabilities caps;  // no sinks, any page size
  registry.add("nosinks", "test", caps, [](const attention::BackendContext&) {
    return std::unique_ptr<attention::AttentionBackend>();
  });
  Case c;
  c.sinks = true;
  const CaseResult r = run_case(registry, {"nosinks", false, ""}, c, 3);
  EXPECT_EQ(r.verdict, Verdict::kUnsupported);
  EXPECT_NE(r.message.find("sinks"), std::string::npos) << r.message;
}

TEST(Conformance, UndeclaredUnsupportedFailsTheRun) {
  auto registry = builtin();
  // Declares every feature, then refuses sinks at creation.
  registry.add("liar", "test", ReferenceBackend::static_capabilities(),
               [](const attention::BackendContext&) -> std::unique_ptr<attention::AttentionBackend> {
                 throw_error(ErrorCode::kUnsupported, "sinks unsupported");
               });
  Case c;
  c.feature = "sinks";
  c.sinks = true;
  const CaseResult r = run_case(registry, {"liar", false, ""}, c, 5);
  EXPECT_EQ(r.verdict, Verdict::kFail) << r.message;
  EXPECT_NE(r.message.find("declare"), std::string::npos) << r.message;
}

TEST(Conformance, MatrixPrintsDeclaredReasons) {
  attention::BackendRegistry registry = builtin();
  attention::BackendCapabilities caps = ReferenceBackend::static_capabilities();
  caps.sinks = false;
  registry.add("ref-nosinks", "reference declaring no sinks", caps,
               [](const attention::BackendContext& ctx) { return std::make_unique<ReferenceBackend>(ctx); });
  Options options;
  options.quick = true;
  options.long_kv = 0;
  options.backends = {"ref-nosinks", "mutant:drop-sinks"};
  const Report report = run_conformance(registry, options);
  EXPECT_TRUE(report.ok()) << report.markdown();
  const std::string md = report.markdown();
  EXPECT_NE(md.find("ref-nosinks / sinks: "), std::string::npos) << md;
  EXPECT_NE(md.find("unsupported"), std::string::npos) << md;
}

#ifdef PAGODA_HAVE_AMX_BACKEND
// The amx BatchAttention refuses, naming them, what its capabilities do not declare (the
// conformance grid above only sees the capabilities): f32 queries / KV and custom masks at plan,
// window / soft cap / sinks at run; a bf16 extend it declares runs.
TEST(Conformance, AmxRefusesUndeclaredFeaturesByName) {
  auto attn = make_amx_batch_attention();
  const std::vector<int32_t> qo = {0, 2}, kv = {0, 1}, pages = {0}, last = {2};
  const attention::PagedPlanInput in{.qo_indptr = qo, .kv_indptr = kv, .kv_indices = pages,
                                     .kv_last_page_len = last, .page_size = 4};
  attention::AttentionShape shape{.num_qo_heads = 2, .num_kv_heads = 1, .head_dim_qk = 8,
                                  .head_dim_v = 8};
  auto code_and_message = [](auto&& f) -> std::pair<ErrorCode, std::string> {
    try {
      f();
    } catch (const Error& e) {
      return {e.code(), e.what()};
    }
    return {ErrorCode::kInternal, "no error"};
  };
  attention::AttentionShape f32 = shape;
  f32.q_dtype = f32.kv_dtype = f32.out_dtype = DType::kF32;
  auto [code, msg] = code_and_message([&] { attn->plan(in, f32); });
  EXPECT_EQ(code, ErrorCode::kUnsupported);
  EXPECT_NE(msg.find("bf16"), std::string::npos) << msg;
  const std::vector<uint8_t> mask = {0xff};
  const std::vector<int64_t> mask_indptr = {0, 1};
  attention::PagedPlanInput masked = in;
  masked.custom_mask = mask;
  masked.mask_indptr = mask_indptr;
  std::tie(code, msg) = code_and_message([&] { attn->plan(masked, shape); });
  EXPECT_EQ(code, ErrorCode::kUnsupported);
  EXPECT_NE(msg.find("custom"), std::string::npos) << msg;

  attn->plan(in, shape);
  std::vector<uint16_t> q(2 * 2 * 8, 0x3f80), k(4 * 8, 0x3f80), v(4 * 8, 0x3f80), o(2 * 2 * 8);
  const TensorView qv(q.data(), DType::kBF16, {2, 2, 8}), kc(k.data(), DType::kBF16, {1, 4, 1, 8}),
      vc(v.data(), DType::kBF16, {1, 4, 1, 8}), ov(o.data(), DType::kBF16, {2, 2, 8});
  for (auto set : {+[](attention::RunParams& p) { p.window_left = 1; },
                   +[](attention::RunParams& p) { p.logit_cap = 5.f; }}) {
    attention::RunParams p;
    set(p);
    std::tie(code, msg) = code_and_message([&] { attn->run(qv, kc, vc, ov, {}, p); });
    EXPECT_EQ(code, ErrorCode::kUnsupported);
    EXPECT_NE(msg.find("sliding window, soft cap and sinks"), std::string::npos) << msg;
  }
  // Every q, k, v element 1: softmax over equal scores, so every output element is exactly 1.
  attn->run(qv, kc, vc, ov, {}, attention::RunParams{});
  for (uint16_t b : o) EXPECT_EQ(b, 0x3f80);
}

// Long extends, which the grid (at most 16 new tokens a request) never gives: the amx extend
// loop's query tiles (64 positions), key blocks (256) and their causal bound, against an fp64 softmax
// written here, on random bf16 values over shuffled pages (page 16), GQA 8 / 2, causal over
// prefixes and non-causal; the output starts NaN and the pages past each request are NaN too.
TEST(Conformance, AmxLongExtendsAcrossQueryTilesMatchFp64) {
  const testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> val(-1.f, 1.f);
  const int hq = 8, hk = 2, d = 64, page = 16;
  // The last request crosses the 256-key blocks and ends inside a 64-key cut block.
  const std::vector<int32_t> prefix = {37, 0, 5, 600}, ext = {200, 150, 64, 70};
  std::vector<int32_t> qo = {0}, kv = {0}, last, indices;
  int32_t pages_total = 0;
  for (size_t b = 0; b < prefix.size(); ++b) {
    const int32_t len = prefix[b] + ext[b], n = (len + page - 1) / page;
    qo.push_back(qo.back() + ext[b]);
    kv.push_back(kv.back() + n);
    last.push_back(len - (n - 1) * page);
    pages_total += n;
  }
  const int32_t cache_pages = pages_total + 3;  // pages no request uses stay NaN
  std::vector<int32_t> ids(static_cast<size_t>(cache_pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  indices.assign(ids.begin(), ids.begin() + pages_total);
  const auto bits = [&](float x) { return f32_to_bf16_bits(x); };
  const int64_t nnz = qo.back();
  std::vector<uint16_t> q(static_cast<size_t>(nnz * hq * d)), k(static_cast<size_t>(cache_pages) * page * hk * d,
                                                                  bits(std::nanf(""))),
      v(k.size(), bits(std::nanf("")));
  for (uint16_t& x : q) x = bits(val(rng));
  for (size_t b = 0; b < prefix.size(); ++b)
    for (int32_t j = 0; j < prefix[b] + ext[b]; ++j)
      for (int h = 0; h < hk; ++h)
        for (int e = 0; e < d; ++e) {
          const size_t at = ((static_cast<size_t>(indices[kv[b] + j / page]) * page + j % page) * hk + h) * d + e;
          k[at] = bits(val(rng));
          v[at] = bits(val(rng));
        }
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  for (int variant = 0; variant < 4; ++variant) {
    // tiles: pagoda's AMX kernels where this CPU has AMX; false: oneDNN's matmul on any CPU.
    const bool causal = variant % 2 == 0, tiles = variant < 2;
    SCOPED_TRACE(::testing::Message() << (causal ? "causal" : "non-causal")
                                      << (tiles ? ", amx tiles" : ", oneDNN"));
    auto attn = make_amx_batch_attention({.tiles = tiles});
    const attention::PagedPlanInput in{.qo_indptr = qo, .kv_indptr = kv, .kv_indices = indices,
                                       .kv_last_page_len = last, .page_size = page};
    const attention::AttentionShape shape{.num_qo_heads = hq, .num_kv_heads = hk, .head_dim_qk = d,
                                          .head_dim_v = d, .q_dtype = DType::kBF16,
                                          .kv_dtype = DType::kBF16, .out_dtype = DType::kF32};
    attn->plan(in, shape);
    std::vector<float> out(static_cast<size_t>(nnz * hq * d), std::nanf("")),
        lse(static_cast<size_t>(nnz * hq), std::nanf(""));
    attention::RunParams params;
    params.sm_scale = scale;
    params.mask = causal ? attention::MaskKind::kCausal : attention::MaskKind::kNonCausal;
    attn->run(TensorView(q.data(), DType::kBF16, {nnz, hq, d}),
              TensorView(k.data(), DType::kBF16, {cache_pages, page, hk, d}),
              TensorView(v.data(), DType::kBF16, {cache_pages, page, hk, d}),
              TensorView(out.data(), DType::kF32, {nnz, hq, d}),
              TensorView(lse.data(), DType::kF32, {nnz, hq}), params);
    double worst = 0, worst_lse = 0;
    for (size_t b = 0; b < prefix.size(); ++b) {
      const int32_t len = prefix[b] + ext[b];
      for (int32_t i = 0; i < ext[b]; ++i)
        for (int h = 0; h < hq; ++h) {
          const int g = h / (hq / hk);
          const int32_t visible = causal ? prefix[b] + i + 1 : len;
          std::vector<double> sc(static_cast<size_t>(visible));
          double mx = -1e300;
          const size_t qat = (static_cast<size_t>(qo[b] + i) * hq + h) * d;
          auto kv_at = [&](int32_t j) {
            return ((static_cast<size_t>(indices[kv[b] + j / page]) * page + j % page) * hk + g) * d;
          };
          for (int32_t j = 0; j < visible; ++j) {
            double dot = 0;
            for (int e = 0; e < d; ++e)
              dot += double{bf16_bits_to_f32(q[qat + e])} * bf16_bits_to_f32(k[kv_at(j) + e]);
            sc[static_cast<size_t>(j)] = dot * scale;
            mx = std::max(mx, sc[static_cast<size_t>(j)]);
          }
          double sum = 0;
          std::vector<double> o(static_cast<size_t>(d), 0.0);
          for (int32_t j = 0; j < visible; ++j) {
            const double p = std::exp(sc[static_cast<size_t>(j)] - mx);
            sum += p;
            for (int e = 0; e < d; ++e) o[static_cast<size_t>(e)] += p * bf16_bits_to_f32(v[kv_at(j) + e]);
          }
          for (int e = 0; e < d; ++e)
            worst = std::max(worst, std::abs(out[qat + static_cast<size_t>(e)] - o[static_cast<size_t>(e)] / sum));
          const double want_lse = (mx + std::log(sum)) / std::log(2.0);
          worst_lse = std::max(worst_lse, std::abs(lse[qat / d] - want_lse));
        }
    }
    std::printf("amx long extends (%s, %s): max |out err| %.2e, max |lse err| %.2e\n",
                causal ? "causal" : "non-causal", tiles ? "amx tiles" : "oneDNN", worst,
                worst_lse);
    EXPECT_LT(worst, 4e-3);  // P is rounded to bf16 for P·V (relative 2^-9 per weight)
    EXPECT_LT(worst_lse, 1e-4);
  }
}
#endif

}  // namespace
}  // namespace pagoda::backends::conformance
