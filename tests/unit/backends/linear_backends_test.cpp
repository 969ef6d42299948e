// The linear-attention kind (attention/linear_backend.h) of the built-in backends: how a
// BackendSelection resolves it (--linear-backend, else the attention selection's name, else the
// platform's default) and the errors that name the backend; the interface's contract, on every
// linear backend of the build: a bad batch or a bad layer is refused before anything changes
// (states, outputs, the previous plan), and a tree verify is refused by a backend that does not
// declare it. The numerics are the conformance harness's (linear-* columns) and the mixer's.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "pagoda/backends/builtin.h"
#include "pagoda/core/error.h"
#include "pagoda/platform/platform.h"

namespace pagoda::backends {
namespace {

using attention::LinearAttentionBackend;
using attention::LinearSeq;

attention::BackendRegistry builtin() {
  attention::BackendRegistry r;
  register_builtin_backends(r);
  return r;
}

/// The host linear backends of this build (a device one, cuda, is tests/cuda's).
std::vector<std::string> host_linear_names() {
  const auto r = builtin();
  std::vector<std::string> out;
  for (const std::string& name : r.linear_names())
    if (r.linear_capabilities(name).device == "cpu") out.push_back(name);
  return out;
}

/// The error `f` throws: its code and message (a failure, kInternal and "" when none).
std::pair<ErrorCode, std::string> error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return {e.code(), e.message()};
  }
  ADD_FAILURE() << "no error thrown";
  return {ErrorCode::kInternal, ""};
}

TEST(LinearSelection, FollowsTheAttentionSelectionUnlessNamed) {
  const auto r = builtin();
  EXPECT_EQ(resolve_linear({}, nullptr), "reference");
  EXPECT_EQ(resolve_linear({.attention = "cpu"}, nullptr), "cpu");
  EXPECT_EQ(resolve_linear({.attention = "cpu", .linear = "reference"}, nullptr), "reference");
  // Prefill / decode splits do not move the linear layers: they follow the base name.
  EXPECT_EQ(resolve_linear({.attention = "reference", .prefill = "cpu"}, nullptr), "reference");
  auto cpu = platform::make_cpu_platform();
  EXPECT_EQ(resolve_linear({}, cpu.get()), cpu->default_attention_backend());
  EXPECT_EQ(make_linear_backend(r, {.attention = "reference"}, {}, {})->name(), "reference");
  for (const std::string& name : host_linear_names())
    EXPECT_EQ(make_linear_backend(r, {.attention = "reference", .linear = name}, {}, {})->name(),
              name);
}

TEST(LinearSelection, ErrorsNameTheBackend) {
  auto r = builtin();
  r.add("attn-only", "an attention backend without a linear kind", attention::BackendCapabilities{},
        [](const attention::BackendContext&) {
          return std::unique_ptr<attention::AttentionBackend>();
        });
  const auto [code, msg] =
      error_of([&] { make_linear_backend(r, {.attention = "attn-only"}, {}, {}); });
  EXPECT_EQ(code, ErrorCode::kUnsupported);
  EXPECT_NE(msg.find("'attn-only'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--linear-backend"), std::string::npos) << msg;
  // Named with --linear-backend: the registry's own message.
  const auto [code2, msg2] = error_of(
      [&] { make_linear_backend(r, {.attention = "reference", .linear = "nope"}, {}, {}); });
  EXPECT_EQ(code2, ErrorCode::kUnsupported);
  EXPECT_NE(msg2.find("unknown linear-attention backend 'nope' (registered: reference"),
            std::string::npos)
      << msg2;
  // An unsupported combination: the host backends on a CUDA model.
  const auto [code3, msg3] =
      error_of([&] { make_linear_backend(r, {.attention = "reference"}, {.device = "cuda"}, {}); });
  EXPECT_EQ(code3, ErrorCode::kUnsupported);
  EXPECT_NE(msg3.find("linear-attention backend 'reference' cannot serve device cuda (runs on "
                      "cpu)"),
            std::string::npos)
      << msg3;
}

/// A layer of small sizes with weights owned here.
struct SmallLayer {
  attention::LinearShape shape{.num_heads = 2,
                               .head_dim = 2,
                               .state_size = 2,
                               .num_groups = 1,
                               .conv_kernel = 3,
                               .chunk_size = 4};
  std::vector<float> conv = std::vector<float>(size_t(shape.conv_dim() * shape.conv_kernel), 0.1f);
  std::vector<float> heads = std::vector<float>(size_t(shape.num_heads), 0.5f);
  attention::LinearLayer layer(int32_t state_layer) const {
    return {.state_layer = state_layer,
            .shape = shape,
            .weights = {.conv = conv.data(),
                        .dt_bias = heads.data(),
                        .a_log = heads.data(),
                        .d = heads.data()}};
  }
};

class LinearBackendContract : public ::testing::TestWithParam<std::string> {};

TEST_P(LinearBackendContract, RefusesBadInputBeforeAnythingChanges) {
  const auto r = builtin();
  std::unique_ptr<LinearAttentionBackend> b = r.create_linear(GetParam(), {}, {});
  SmallLayer small;
  kv::StatePool pool(1, 4, small.shape.state_shape());
  const int32_t a = pool.alloc(), c = pool.alloc();
  std::fill(pool.ssm_state(0, a), pool.ssm_state(0, a) + pool.shape().ssm_floats(), 0.25f);
  const std::vector<float> before(pool.ssm_state(0, a),
                                  pool.ssm_state(0, a) + pool.shape().ssm_floats());
  const int64_t cd = small.shape.conv_dim(), h = small.shape.num_heads, di = small.shape.d_inner();
  std::vector<float> xbc(size_t(3 * cd), 0.3f), dt(size_t(3 * h), 0.1f), y(size_t(3 * di), -7.f);
  auto views = [&](int64_t rows) {
    return std::array<TensorView, 3>{TensorView(xbc.data(), DType::kF32, {rows, cd}),
                                     TensorView(dt.data(), DType::kF32, {rows, h}),
                                     TensorView(y.data(), DType::kF32, {rows, di})};
  };
  auto unchanged = [&] {
    EXPECT_TRUE(std::equal(before.begin(), before.end(), pool.ssm_state(0, a)));
    EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](float v) { return v == -7.f; }));
  };
  auto refused = [&](ErrorCode want, const std::function<void()>& f, const char* what) {
    SCOPED_TRACE(what);
    EXPECT_EQ(error_of(f).first, want);
    unchanged();
  };
  {
    const auto v = views(3);
    refused(
        ErrorCode::kFailedPrecondition, [&] { b->forward(small.layer(0), v[0], v[1], v[2]); },
        "forward before a plan");
  }
  const std::vector<int32_t> nodes = {c}, root = {-1}, bad_root = {0};
  auto plan = [&](std::vector<LinearSeq> seqs) { b->init_forward_metadata(pool, seqs); };
  refused(
      ErrorCode::kFailedPrecondition, [&] { plan({{.slot = 3, .num_tokens = 1}}); },
      "a slot not held");
  refused(
      ErrorCode::kOutOfRange, [&] { plan({{.slot = 9, .num_tokens = 1}}); },
      "a slot outside the pool");
  refused(
      ErrorCode::kInvalidArgument,
      [&] {
        plan({{.slot = a, .num_tokens = 1}, {.slot = a, .num_tokens = 1}});
      },
      "one slot twice");
  refused(
      ErrorCode::kInvalidArgument, [&] { plan({{.slot = a, .num_tokens = 0}}); },
      "an empty sequence");
  refused(
      ErrorCode::kInvalidArgument,
      [&] { plan({{.slot = a, .num_tokens = 1, .node_slots = nodes, .node_parents = bad_root}}); },
      "a root whose parent is not -1");
  refused(
      ErrorCode::kInvalidArgument,
      [&] { plan({{.slot = a, .num_tokens = 2, .node_slots = nodes, .node_parents = root}}); },
      "node slots short of the count");
  refused(
      ErrorCode::kInvalidArgument,
      [&] {
        plan({{.slot = a,
               .num_tokens = 1,
               .node_slots = std::vector<int32_t>{a},
               .node_parents = root}});
      },
      "a node slot that is the sequence's own");
  EXPECT_EQ(b->num_tokens(), 0) << "a refused plan replaced the previous one";

  plan({{.slot = a, .num_tokens = 3}});
  EXPECT_EQ(b->num_tokens(), 3);
  const auto v = views(3);
  refused(
      ErrorCode::kOutOfRange, [&] { b->forward(small.layer(1), v[0], v[1], v[2]); },
      "a state layer outside the pool");
  SmallLayer other;
  other.shape.state_size = 3;
  refused(
      ErrorCode::kInvalidArgument, [&] { b->forward(other.layer(0), v[0], v[1], v[2]); },
      "a layer whose state shape is not the pool's");
  attention::LinearLayer no_d = small.layer(0);
  no_d.weights.d = nullptr;
  refused(
      ErrorCode::kInvalidArgument, [&] { b->forward(no_d, v[0], v[1], v[2]); }, "a missing weight");
  const auto short_views = views(2);
  refused(
      ErrorCode::kInvalidArgument, [&] { b->forward(small.layer(0), short_views[0], v[1], v[2]); },
      "xBC rows short of the plan");
  refused(
      ErrorCode::kUnsupported,
      [&] {
        b->forward(small.layer(0), v[0], v[1], TensorView(y.data(), DType::kBF16, {3, di}));
      },
      "a bf16 y");
  refused(
      ErrorCode::kUnsupported,
      [&] {
        b->forward(small.layer(0), v[0], v[1],
                   TensorView(y.data(), DType::kF32, {3, di}, Device::cuda(0)));
      },
      "a device y");
  b->forward(small.layer(0), v[0], v[1], v[2]);  // the good call runs
  EXPECT_TRUE(std::none_of(y.begin(), y.end(), [](float x) { return x == -7.f; }));
}

INSTANTIATE_TEST_SUITE_P(Builtin, LinearBackendContract,
                         ::testing::ValuesIn(host_linear_names()),
                         [](const auto& info) { return info.param; });

/// A backend that declares no tree verify (and computes nothing).
class NoTreeVerify final : public LinearAttentionBackend {
 public:
  std::string name() const override { return "no-tree"; }
  const attention::LinearCapabilities& capabilities() const override { return caps_; }

 protected:
  void run(const attention::LinearLayer&, const TensorView&, const TensorView&,
           const TensorView&) override {}

 private:
  attention::LinearCapabilities caps_{.dtypes = {DType::kF32}, .tree_verify = false};
};

TEST(LinearBackend, TreeVerifyRefusedWithoutTheCapability) {
  NoTreeVerify b;
  kv::StatePool pool(1, 2, SmallLayer{}.shape.state_shape());
  const int32_t a = pool.alloc(), node = pool.alloc();
  const std::vector<int32_t> nodes = {node}, parents = {-1};
  const std::vector<LinearSeq> verify = {
      {.slot = a, .num_tokens = 1, .node_slots = nodes, .node_parents = parents}};
  const auto [code, msg] = error_of([&] { b.init_forward_metadata(pool, verify); });
  EXPECT_EQ(code, ErrorCode::kUnsupported);
  EXPECT_NE(msg.find("'no-tree' has no tree verify"), std::string::npos) << msg;
  const std::vector<LinearSeq> decode = {{.slot = a, .num_tokens = 1}};
  EXPECT_NO_THROW(b.init_forward_metadata(pool, decode));
}

}  // namespace
}  // namespace pagoda::backends
