#include <gtest/gtest.h>

#include "pagoda/attention/forward_mode.h"
#include "pagoda/attention/registry.h"
#include "pagoda/core/error.h"

namespace pagoda::attention {
namespace {

BackendRegistry::Factory null_factory() {
  return [](const BackendContext&) -> std::unique_ptr<AttentionBackend> { return nullptr; };
}

BackendRegistry make_registry() {
  BackendRegistry r;
  BackendCapabilities narrow;
  narrow.page_sizes = {1, 16};
  r.add("x", "page sizes 1 and 16", narrow, null_factory());
  BackendCapabilities any;
  any.sinks = true;
  r.add("reference", "any page", any, null_factory());
  r.add("cpu", "any page", any, null_factory());
  return r;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    return e.message();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

TEST(ForwardMode, Names) {
  EXPECT_EQ(forward_mode_name(ForwardMode::kTargetVerify), "target_verify");
  EXPECT_EQ(forward_mode_name(ForwardMode::kIdle), "idle");
}

TEST(Registry, ValidateNamesReasonAndAlternatives) {
  const auto r = make_registry();
  BackendRequirements req;
  req.page_size = 3;
  EXPECT_EQ(message_of([&] { r.validate("x", req); }),
            "backend 'x' cannot serve page size 3 (supports 1, 16); backends that would: "
            "reference, cpu");
  req.page_size = 16;
  EXPECT_NO_THROW(r.validate("x", req));
  req.sinks = true;
  EXPECT_NE(message_of([&] { r.validate("x", req); }).find("attention sinks"), std::string::npos);
}

TEST(Registry, UnknownNameListsRegistered) {
  const auto r = make_registry();
  const auto msg = message_of([&] { r.validate("flashinfer", BackendRequirements{}); });
  EXPECT_NE(msg.find("unknown attention backend 'flashinfer'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("registered: x, reference, cpu"), std::string::npos) << msg;
}

TEST(Registry, DuplicateRejected) {
  auto r = make_registry();
  EXPECT_THROW(r.add("cpu", "again", {}, null_factory()), Error);
  EXPECT_EQ(r.names().size(), 3u);
}

TEST(Registry, UnsupportedReasonListsEveryMissingFeature) {
  BackendCapabilities caps;
  caps.head_dims = {128};
  caps.kv_dtypes = {DType::kBF16};
  BackendRequirements req;
  req.head_dim_qk = req.head_dim_v = 64;
  req.kv_dtype = DType::kFp8E4M3;
  req.mla = true;
  req.topk = 4;
  req.cuda_graph = true;
  const auto why = unsupported_reason(caps, req);
  ASSERT_TRUE(why.has_value());
  for (const char* part : {"head dims 64/64", "kv dtype fp8_e4m3", "MLA", "topk 4 (max 1)", "CUDA graphs"}) {
    EXPECT_NE(why->find(part), std::string::npos) << part << " missing in: " << *why;
  }
  EXPECT_FALSE(unsupported_reason(caps, BackendRequirements{}).has_value());
}

}  // namespace
}  // namespace pagoda::attention
