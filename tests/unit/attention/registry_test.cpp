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

// The linear kind (Mamba2 layers) is a second table of the same registry: one name may be in
// both, each kind resolves and fails on its own.
BackendRegistry with_linear() {
  BackendRegistry r = make_registry();  // attention: x, reference, cpu
  const BackendRegistry::LinearFactory none = [](const LinearBackendContext&) {
    return std::unique_ptr<LinearAttentionBackend>();
  };
  r.add_linear("reference", "host f32", {.dtypes = {DType::kF32}, .tree_verify = true}, none);
  r.add_linear("gpu", "device", {.dtypes = {DType::kF32, DType::kBF16}, .device = "cuda"}, none);
  return r;
}

TEST(Registry, LinearKindIsItsOwnTable) {
  auto r = with_linear();
  EXPECT_EQ(r.linear_names(), (std::vector<std::string>{"reference", "gpu"}));
  EXPECT_EQ(r.names(), (std::vector<std::string>{"x", "reference", "cpu"}));
  EXPECT_TRUE(r.contains_linear("reference"));
  EXPECT_FALSE(r.contains_linear("x")) << "an attention-only name has no linear kind";
  EXPECT_FALSE(r.contains("gpu")) << "a linear-only name has no attention kind";
  EXPECT_TRUE(r.linear_capabilities("reference").tree_verify);
  EXPECT_THROW(r.add_linear("gpu", "again", {}, [](const LinearBackendContext&) {
    return std::unique_ptr<LinearAttentionBackend>();
  }),
               Error);
  EXPECT_EQ(r.linear_names().size(), 2u);
}

TEST(Registry, LinearErrorsNameTheBackendTheReasonAndWhatWould) {
  const auto r = with_linear();
  EXPECT_EQ(message_of([&] { r.validate_linear("x", LinearRequirements{}); }),
            "unknown linear-attention backend 'x' (registered: reference, gpu); backends that "
            "would: reference");
  EXPECT_EQ(message_of([&] { r.validate_linear("reference", {.dtype = DType::kBF16}); }),
            "linear-attention backend 'reference' cannot serve dtype bf16 (supports f32); none "
            "of the registered backends would");
  EXPECT_EQ(message_of([&] { r.validate_linear("gpu", {.tree_verify = true}); }),
            "linear-attention backend 'gpu' cannot serve tree verify (speculative decoding); "
            "device cpu (runs on cuda); backends that would: reference");
  EXPECT_NE(message_of([&] { (void)r.linear_capabilities("cpu"); })
                .find("unknown linear-attention backend 'cpu'"),
            std::string::npos);
  EXPECT_NO_THROW(r.validate_linear("gpu", {.dtype = DType::kBF16, .device = "cuda"}));
}

TEST(Registry, LinearUnsupportedReasonListsEveryMissingFeature) {
  const LinearCapabilities caps{.dtypes = {DType::kF32}};
  const auto why = unsupported_reason(
      caps, LinearRequirements{
                .dtype = DType::kF16, .tree_verify = true, .cuda_graph = true, .device = "cuda"});
  ASSERT_TRUE(why.has_value());
  for (const char* part : {"dtype f16 (supports f32)", "tree verify", "CUDA graphs",
                           "device cuda (runs on cpu)"})
    EXPECT_NE(why->find(part), std::string::npos) << part << " missing in: " << *why;
  EXPECT_FALSE(unsupported_reason(caps, LinearRequirements{}).has_value());
}

}  // namespace
}  // namespace pagoda::attention
