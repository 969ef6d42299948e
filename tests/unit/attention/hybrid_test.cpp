#include <gtest/gtest.h>

#include "pagoda/backends/builtin.h"
#include "pagoda/backends/hybrid/hybrid_backend.h"
#include "pagoda/core/error.h"

namespace pagoda::backends {
namespace {

using namespace pagoda::attention;

/// Records which hooks it received.
class Probe final : public AttentionBackend {
 public:
  Probe(std::string name, BackendCapabilities caps, std::vector<std::string>* log)
      : name_(std::move(name)), caps_(std::move(caps)), log_(log) {}
  std::string name() const override { return name_; }
  const BackendCapabilities& capabilities() const override { return caps_; }
  void init_forward_metadata(const ForwardBatch& b) override {
    log_->push_back(name_ + ".plan." + std::string(forward_mode_name(b.mode)));
  }
  void forward_extend(const TensorView&, const TensorView&, const TensorView&,
                      const AttentionLayer&, const ForwardBatch& b, const TensorView&,
                      SaveKv) override {
    log_->push_back(name_ + ".extend." + std::string(forward_mode_name(b.mode)) +
                    (lse_.empty() ? "" : ".lse"));
  }
  void forward_decode(const TensorView&, const TensorView&, const TensorView&,
                      const AttentionLayer&, const ForwardBatch& b, const TensorView&,
                      SaveKv) override {
    log_->push_back(name_ + ".decode." + std::string(forward_mode_name(b.mode)));
  }
  void init_cuda_graph_state(int, int) override { log_->push_back(name_ + ".graph"); }
  void save_kv(const TensorView&, const TensorView&, const AttentionLayer&,
               const ForwardBatch& b) override {
    log_->push_back(name_ + ".save_kv." + std::string(forward_mode_name(b.mode)));
  }
  void gather_kv(const AttentionLayer&, const ForwardBatch& b, const KeyWindows&, const TensorView&,
                 const TensorView&) override {
    log_->push_back(name_ + ".gather_kv." + std::string(forward_mode_name(b.mode)));
  }
  void forward_ragged(const TensorView&, const TensorView&, const TensorView&,
                      const AttentionLayer&, const ForwardBatch& b, const KeyWindows&,
                      const TensorView&, const TensorView&) override {
    log_->push_back(name_ + ".ragged." + std::string(forward_mode_name(b.mode)));
  }

 private:
  std::string name_;
  BackendCapabilities caps_;
  std::vector<std::string>* log_;
};

TEST(Hybrid, RoutesByMode) {
  std::vector<std::string> log;
  BackendCapabilities pc, dc;
  pc.page_sizes = {1, 16, 64};
  pc.sinks = true;
  pc.max_topk = 8;
  dc.page_sizes = {16, 32};
  dc.cuda_graph = true;
  HybridBackend h(std::make_unique<Probe>("p", pc, &log), std::make_unique<Probe>("d", dc, &log));
  EXPECT_EQ(h.name(), "hybrid(p,d)");
  EXPECT_EQ(h.capabilities().page_sizes, (std::vector<int>{16}));
  EXPECT_FALSE(h.capabilities().sinks);
  EXPECT_FALSE(h.capabilities().cuda_graph);
  EXPECT_EQ(h.capabilities().max_topk, 1);
  float lse = 0;
  for (ForwardMode m : {ForwardMode::kDecode, ForwardMode::kExtend, ForwardMode::kMixed,
                        ForwardMode::kTargetVerify, ForwardMode::kDraftExtend}) {
    ForwardBatch b{.mode = m};
    h.init_forward_metadata(b);
    if (m == ForwardMode::kTargetVerify) h.set_lse_output(TensorView(&lse, DType::kF32, {1, 1}));
    h.forward({}, {}, {}, AttentionLayer{}, b, {});
  }
  h.init_cuda_graph_state(8, 8);
  EXPECT_EQ(log, (std::vector<std::string>{
                     "d.plan.decode", "d.decode.decode", "p.plan.extend", "p.extend.extend",
                     "p.plan.mixed", "p.extend.mixed", "p.plan.target_verify",
                     "p.extend.target_verify.lse", "p.plan.draft_extend", "p.extend.draft_extend",
                     "d.graph"}));
}

TEST(Hybrid, VerifyOnDecodeRoute) {
  std::vector<std::string> log;
  HybridBackend h(std::make_unique<Probe>("p", BackendCapabilities{}, &log),
                  std::make_unique<Probe>("d", BackendCapabilities{}, &log), VerifyRoute::kDecode);
  EXPECT_EQ(&h.backend_for(ForwardMode::kTargetVerify), &h.decode());
  EXPECT_EQ(&h.backend_for(ForwardMode::kIdle), &h.decode());
  EXPECT_EQ(&h.backend_for(ForwardMode::kMixed), &h.prefill());
}

// The ragged calls (extend steps) go to the prefill child, and the hybrid's `ragged` capability
// is the prefill child's whatever the decode child has.
TEST(Hybrid, RaggedCallsGoToThePrefillChild) {
  std::vector<std::string> log;
  BackendCapabilities pc, dc;
  pc.ragged = true;
  HybridBackend h(std::make_unique<Probe>("p", pc, &log), std::make_unique<Probe>("d", dc, &log));
  EXPECT_TRUE(h.capabilities().ragged);
  EXPECT_FALSE(hybrid_capabilities(dc, pc).ragged);
  for (ForwardMode m : {ForwardMode::kExtend, ForwardMode::kMixed}) {
    const ForwardBatch b{.mode = m};
    h.save_kv({}, {}, AttentionLayer{}, b);
    h.gather_kv(AttentionLayer{}, b, {}, {}, {});
    h.forward_ragged({}, {}, {}, AttentionLayer{}, b, {}, {}, {});
  }
  EXPECT_EQ(log,
            (std::vector<std::string>{"p.save_kv.extend", "p.gather_kv.extend", "p.ragged.extend",
                                      "p.save_kv.mixed", "p.gather_kv.mixed", "p.ragged.mixed"}));
}

// A backend without the ragged calls refuses them by name (AttentionBackend's defaults).
TEST(Hybrid, DefaultRaggedCallsThrowUnsupported) {
  class Plain final : public AttentionBackend {
   public:
    std::string name() const override { return "plain"; }
    const BackendCapabilities& capabilities() const override { return caps_; }
    void init_forward_metadata(const ForwardBatch&) override {}
    void forward_extend(const TensorView&, const TensorView&, const TensorView&,
                        const AttentionLayer&, const ForwardBatch&, const TensorView&,
                        SaveKv) override {}
    void forward_decode(const TensorView&, const TensorView&, const TensorView&,
                        const AttentionLayer&, const ForwardBatch&, const TensorView&,
                        SaveKv) override {}

   private:
    BackendCapabilities caps_;
  } plain;
  const ForwardBatch b{.mode = ForwardMode::kExtend};
  for (int call = 0; call < 3; ++call) {
    try {
      if (call == 0) plain.save_kv({}, {}, AttentionLayer{}, b);
      if (call == 1) plain.gather_kv(AttentionLayer{}, b, {}, {}, {});
      if (call == 2) plain.forward_ragged({}, {}, {}, AttentionLayer{}, b, {}, {}, {});
      ADD_FAILURE() << "call " << call << " did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
      EXPECT_NE(e.message().find("'plain' has no ragged attention"), std::string::npos)
          << e.message();
    }
  }
}

TEST(Hybrid, DefaultCudaGraphHooksThrowUnsupported) {
  std::vector<std::string> log;
  Probe p("p", BackendCapabilities{}, &log);
  try {
    p.init_forward_metadata_capture_cuda_graph(ForwardBatch{});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
}

TEST(Builtin, SelectionResolvesAndValidates) {
  BackendRegistry registry;
  register_builtin_backends(registry);
  EXPECT_TRUE(registry.contains("reference"));
  const BackendContext none{};
  EXPECT_EQ(resolve_selection({.attention = "", .prefill = "", .decode = "cpu"}, none),
            (std::pair<std::string, std::string>{"reference", "cpu"}));
  BackendRequirements req;
  req.page_size = 3;
  try {
    make_backend(registry, {.attention = "nope", .prefill = {}, .decode = {}}, req, none);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(e.message().find("backends that would: reference"), std::string::npos) << e.message();
  }
}

}  // namespace
}  // namespace pagoda::backends
