// The linear-* columns of the conformance harness (Mamba2 layers; linear_runner.cpp): every
// host linear backend of the build (cuda's runs in the GPU conformance tests) passes every
// linear case of the quick grid; each linear mutant fails every linear case (not only its own
// column); the harness catches a backend that writes a state it was not given or leaves an
// output row unwritten; and names without a linear kind are unsupported with the reason.
#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <string>

#include "pagoda/backends/builtin.h"
#include "pagoda/backends/conformance/conformance.h"
#include "pagoda/backends/reference/reference_linear_backend.h"
#include "test_seed.h"

namespace pagoda::backends::conformance {
namespace {

attention::BackendRegistry builtin_registry() {
  attention::BackendRegistry r;
  register_builtin_backends(r);
  return r;
}

std::vector<Case> linear_cases() {
  std::vector<Case> out;
  for (const Case& c : make_cases(true, 0))
    if (c.linear.op != LinearOp::kNone) out.push_back(c);
  return out;
}

TEST(LinearConformance, EveryLinearBackendPassesAndEveryLinearMutantFailsEveryLinearCase) {
  const testing::TestSeed seed;
  const auto registry = builtin_registry();
  const std::vector<Case> cases = linear_cases();
  ASSERT_EQ(cases.size(), 15u) << "the quick grid's linear cases: 3 shapes x 5 columns";
  for (const Case& c : cases) {
    SCOPED_TRACE(c.describe());
    for (const std::string& name : registry.linear_names()) {
      // A device kind runs in the GPU conformance tests (tests/cuda).
      if (registry.linear_capabilities(name).device != "cpu") continue;
      const CaseResult r = run_case(registry, {name, false, ""}, c, seed);
      EXPECT_EQ(r.verdict, Verdict::kPass) << name << ": " << r.message;
    }
    for (const char* mutant : {"mutant:stale-state", "mutant:conv-window"}) {
      const CaseResult r = run_case(registry, {mutant, true, c.feature}, c, seed);
      EXPECT_EQ(r.verdict, Verdict::kFail) << mutant << " missed";
    }
  }
}

TEST(LinearConformance, NamesWithoutALinearKindAreUnsupportedWithTheReason) {
  auto registry = builtin_registry();
  registry.add("attn-only", "no linear kind", attention::BackendCapabilities{},
               [](const attention::BackendContext&) {
                 return std::unique_ptr<attention::AttentionBackend>();
               });
  const Case c = linear_cases().front();
  const CaseResult none = run_case(registry, {"attn-only", false, ""}, c, 1);
  EXPECT_EQ(none.verdict, Verdict::kUnsupported);
  EXPECT_NE(none.message.find("no linear-attention backend 'attn-only'"), std::string::npos)
      << none.message;
  const CaseResult hybrid = run_case(registry, {"reference+reference", false, ""}, c, 1);
  EXPECT_EQ(hybrid.verdict, Verdict::kUnsupported) << hybrid.message;
  const CaseResult attention_mutant = run_case(registry, {"mutant:gqa-map", true, ""}, c, 1);
  EXPECT_EQ(attention_mutant.verdict, Verdict::kUnsupported) << attention_mutant.message;
}

/// The reference linear backend, then one stray effect the harness must see.
enum class Stray { kOtherLayer, kUnwrittenRow };

class StrayBackend final : public attention::LinearAttentionBackend {
 public:
  explicit StrayBackend(Stray stray) : stray_(stray) {}
  std::string name() const override { return "stray"; }
  const attention::LinearCapabilities& capabilities() const override {
    return attention::host_linear_capabilities();
  }

 protected:
  void run(const attention::LinearLayer& layer, const TensorView& xbc, const TensorView& dt,
           const TensorView& y) override {
    inner_.init_forward_metadata(pool(), seqs());
    inner_.forward(layer, xbc, dt, y);
    if (stray_ == Stray::kOtherLayer) {
      const int32_t other = layer.state_layer == 0 ? 1 : 0;
      pool().ssm_state(other, seqs().front().slot)[0] += 1.f;
    } else {
      const int64_t last = y.size(0) - 1;
      y.data_as<float>()[last * y.stride(0)] = std::numeric_limits<float>::quiet_NaN();
    }
  }

 private:
  Stray stray_;
  ReferenceLinearBackend inner_;
};

TEST(LinearConformance, StrayWritesAndUnwrittenRowsFail) {
  for (Stray stray : {Stray::kOtherLayer, Stray::kUnwrittenRow}) {
    auto registry = builtin_registry();
    registry.add_linear("stray", "test", attention::host_linear_capabilities(),
                        [stray](const attention::LinearBackendContext&) {
                          return std::make_unique<StrayBackend>(stray);
                        });
    for (const Case& c : linear_cases()) {
      SCOPED_TRACE(c.describe());
      const CaseResult r = run_case(registry, {"stray", false, ""}, c, 5);
      ASSERT_EQ(r.verdict, Verdict::kFail);
      EXPECT_NE(
          r.message.find(stray == Stray::kOtherLayer ? "not named by the case" : "not written"),
          std::string::npos)
          << r.message;
    }
  }
}

}  // namespace
}  // namespace pagoda::backends::conformance
