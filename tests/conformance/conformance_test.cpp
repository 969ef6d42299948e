#include <gtest/gtest.h>

#include <cstdio>

#include "pagoda/backends/builtin.h"
#include "pagoda/backends/conformance/conformance.h"
#include "pagoda/backends/reference/reference_backend.h"
#include "pagoda/core/error.h"
#ifdef PAGODA_HAVE_AMX_BACKEND
#include <vector>

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
  EXPECT_EQ(mutant_family().size(), 13u);
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
#endif

}  // namespace
}  // namespace pagoda::backends::conformance
