#include <gtest/gtest.h>

#include "pagoda/backends/builtin.h"
#include "pagoda/backends/conformance/conformance.h"

namespace pagoda::backends::conformance {
namespace {

attention::BackendRegistry builtin() {
  attention::BackendRegistry r;
  register_builtin_backends(r);
  return r;
}

TEST(Conformance, QuickGridAllCpuBackendsPassAndMutantIsCaught) {
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
  ASSERT_EQ(report.rows.back().backend.spec, "mutant");
  EXPECT_GT(report.rows.back().total_fail(), 0) << "the mutant was not caught:\n" << report.markdown();
  EXPECT_TRUE(report.ok()) << report.markdown();
}

TEST(Conformance, MutantCaughtOnPlainDecode) {
  const auto registry = builtin();
  Case c;
  c.feature = "decode";
  const CaseResult ok = run_case(registry, {"reference", false}, c, 11);
  EXPECT_EQ(ok.verdict, Verdict::kPass) << ok.message;
  const CaseResult bad = run_case(registry, {"mutant", true}, c, 11);
  EXPECT_EQ(bad.verdict, Verdict::kFail) << bad.message;
}

TEST(Conformance, UnsupportedIsSkippedNotFailed) {
  attention::BackendRegistry registry;
  attention::BackendCapabilities caps;  // no sinks, any page size
  registry.add("nosinks", "test", caps, [](const attention::BackendContext&) {
    return std::unique_ptr<attention::AttentionBackend>();
  });
  Case c;
  c.sinks = true;
  const CaseResult r = run_case(registry, {"nosinks", false}, c, 3);
  EXPECT_EQ(r.verdict, Verdict::kUnsupported);
  EXPECT_NE(r.message.find("sinks"), std::string::npos) << r.message;
}

}  // namespace
}  // namespace pagoda::backends::conformance
