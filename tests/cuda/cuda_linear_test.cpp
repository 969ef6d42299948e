// The cuda linear-attention backend (Mamba2 recurrence: backends/cuda/cuda_linear_backend.h) on a
// device kv::StatePool, in lockstep with the reference linear backend (fp64) on a host pool: both
// pools start from the same random states (every slot, both layers), every call gets the same
// random xBC / dt rows (strided views with poisoned padding) and NaN-poisoned y, and after each
// call every y row must match within 2e-4 · max(1, |ref|), y's padding must stay NaN, and every
// state of both layers of every slot must match (the slots and the layer a call does not name
// bit for bit). Shapes: groups 2 / 1 / one head per group, d_conv 4 / 2 / 1, a time-step limit,
// and a Bamba-sized head (64 x 128 state). Ops: prefills of 1, q - 1, q, q + 1, 3q + 2 tokens
// at chunk hints q = 4, 8, 64; decode steps; prefills cut into calls at random points; a state
// restored with copy_slot and continued in both slots; a draft tree with random parents beside
// a decode and a prefill (the tree's own slot only read); long prefills (1000+ tokens, ragged
// chunk tails, from random states) on the chunked SSD scan beside short ones on the token scan,
// continued, restored and beside a tree. Also the device pool's own contract
// (freed slots zeroed on the stream, copy_slot, check_integrity reading back) and the backend's
// refusals of host pools and host views. Seed printed; PAGODA_TEST_SEED re-runs one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_common.h"
#include "pagoda/backends/cuda/cuda_linear_backend.h"
#include "pagoda/backends/reference/reference_linear_backend.h"
#include "pagoda/core/error.h"
#include "pagoda/kv/state_pool.h"
#include "pagoda/platform/cuda/cuda_platform.h"
#include "random_floats.h"

namespace pagoda {
namespace {

using pagoda::testing::uniform_floats;

using attention::LinearSeq;
using attention::LinearShape;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int64_t kPad = 3;      ///< extra floats per input and output row
constexpr int32_t kSlots = 24;
constexpr int32_t kLayer = 1;    ///< the layer under test; layer 0 is never named
constexpr double kTol = 2e-4;

platform::DeviceBuffer on_device(platform::Platform& p, const std::vector<float>& host) {
  platform::DeviceBuffer b =
      platform::make_buffer(p.allocator(), std::max<size_t>(host.size(), 1) * sizeof(float));
  p.allocator().copy_to_device(b.get(), host.data(), host.size() * sizeof(float));
  return b;
}

/// One call's sequence: a slot and a token count (a tree: node slots and parents).
struct Piece {
  int32_t slot = 0;
  int32_t n = 0;
  std::vector<int32_t> node_slots, node_parents;
};

/// The two backends and pools in lockstep.
class Twin {
 public:
  Twin(platform::Platform& gpu, LinearShape shape, uint64_t seed)
      : gpu_(gpu),
        shape_(shape),
        rng_(seed),
        host_(2, kSlots, shape.state_shape()),
        dev_(2, kSlots, shape.state_shape(), gpu),
        cuda_({.platform = &gpu}) {
    const auto cd = size_t(shape.conv_dim()), h = size_t(shape.num_heads);
    w_ = {uniform_floats(rng_, cd * size_t(shape.conv_kernel), -0.6f, 0.6f),
          rng_() % 2 ? uniform_floats(rng_, cd, -0.2f, 0.2f) : std::vector<float>{},
          uniform_floats(rng_, h, -1.5f, 0.5f), uniform_floats(rng_, h, -1.f, 1.5f),
          uniform_floats(rng_, h, -1.f, 1.f)};
    for (const auto& v : w_) dev_w_.push_back(on_device(gpu, v));
  }

  /// A held slot (the same index in both pools) with the same random state in both layers.
  int32_t slot() {
    const int32_t s = host_.alloc();
    EXPECT_EQ(dev_.alloc(), s);
    for (int32_t l = 0; l < 2; ++l) {
      const auto v = uniform_floats(
          rng_, size_t(host_.shape().conv_floats() + host_.shape().ssm_floats()), -1.f, 1.f);
      host_.write_state(l, s, v);
      dev_.write_state(l, s, v);
    }
    return s;
  }
  void copy_slot(int32_t from, int32_t to) {
    host_.copy_slot(from, to);
    dev_.copy_slot(from, to);
  }
  std::mt19937_64& rng() { return rng_; }

  /// Runs `pieces` as one call on both backends; returns the first mismatch ("" when none).
  std::string call(const std::vector<Piece>& pieces) {
    const int64_t cd = shape_.conv_dim(), h = shape_.num_heads, di = shape_.d_inner();
    const int64_t in_w = cd + h + kPad, y_w = di + kPad;
    std::vector<LinearSeq> seqs;
    int64_t rows = 0;
    std::vector<int32_t> named;
    for (const Piece& p : pieces) {
      seqs.push_back({.slot = p.slot, .num_tokens = p.n, .node_slots = p.node_slots,
                      .node_parents = p.node_parents});
      rows += p.n;
      named.push_back(p.slot);
      named.insert(named.end(), p.node_slots.begin(), p.node_slots.end());
    }
    std::vector<float> in = uniform_floats(rng_, size_t(rows * in_w), -1.f, 1.f);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = cd; i < cd + h; ++i) in[size_t(r * in_w + i)] -= 1.f;  // dt in [-2, 0]
      for (int64_t i = cd + h; i < in_w; ++i) in[size_t(r * in_w + i)] = kNaN;
    }
    std::vector<float> y_ref(size_t(rows * y_w), kNaN), y_gpu = y_ref;
    const std::vector<std::vector<float>> before = states();
    auto layer = [&](bool dev) {
      auto w = [&](size_t i) -> const float* {
        if (w_[i].empty()) return nullptr;
        return dev ? static_cast<const float*>(dev_w_[i].get()) : w_[i].data();
      };
      return attention::LinearLayer{
          .state_layer = kLayer,
          .shape = shape_,
          .weights = {.conv = w(0), .conv_bias = w(1), .dt_bias = w(2), .a_log = w(3), .d = w(4)}};
    };
    ref_.init_forward_metadata(host_, seqs);
    ref_.forward(layer(false), TensorView(in.data(), DType::kF32, {rows, cd}, {in_w, 1}),
                 TensorView(in.data() + cd, DType::kF32, {rows, h}, {in_w, 1}),
                 TensorView(y_ref.data(), DType::kF32, {rows, di}, {y_w, 1}));
    platform::DeviceBuffer in_d = on_device(gpu_, in), y_d = on_device(gpu_, y_gpu);
    auto* ind = static_cast<float*>(in_d.get());
    const Device dev = gpu_.device();
    cuda_.init_forward_metadata(dev_, seqs);
    cuda_.forward(layer(true), TensorView(ind, DType::kF32, {rows, cd}, {in_w, 1}, dev),
                  TensorView(ind + cd, DType::kF32, {rows, h}, {in_w, 1}, dev),
                  TensorView(y_d.get(), DType::kF32, {rows, di}, {y_w, 1}, dev));
    gpu_.synchronize_stream();
    gpu_.allocator().copy_to_host(y_gpu.data(), y_d.get(), y_gpu.size() * sizeof(float));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < di; ++i) {
        const double want = y_ref[size_t(r * y_w + i)];
        const float got = y_gpu[size_t(r * y_w + i)];
        if (!near(got, want))
          return "y[" + std::to_string(r) + ", " + std::to_string(i) + "] = " +
                 std::to_string(got) + ", reference " + std::to_string(want);
      }
      for (int64_t i = di; i < y_w; ++i)
        if (!std::isnan(y_gpu[size_t(r * y_w + i)]))
          return "y row " + std::to_string(r) + " written past d_inner";
    }
    // Every slot and layer: the reference's; the ones not named also bit for bit unchanged.
    const std::vector<std::vector<float>> after = states();
    for (int32_t s = 0; s < kSlots; ++s) {
      for (int32_t l = 0; l < 2; ++l) {
        const auto want = host_.read_state(l, s);
        const auto& got = after[size_t(s * 2 + l)];
        for (size_t i = 0; i < want.size(); ++i)
          if (!near(got[i], want[i]))
            return "slot " + std::to_string(s) + " layer " + std::to_string(l) + " float " +
                   std::to_string(i) + " = " + std::to_string(got[i]) + ", reference " +
                   std::to_string(want[i]);
        const bool is_named = l == kLayer && std::count(named.begin(), named.end(), s) > 0;
        const bool is_root =
            l == kLayer && std::any_of(pieces.begin(), pieces.end(), [&](const Piece& p) {
              return p.slot == s && !p.node_slots.empty();
            });
        if ((!is_named || is_root) && got != before[size_t(s * 2 + l)])
          return "slot " + std::to_string(s) + " layer " + std::to_string(l) +
                 (is_root ? " (a tree's own slot)" : " (not named)") + " changed";
      }
    }
    return "";
  }

  /// Both layers of every slot of the device pool.
  std::vector<std::vector<float>> states() const {
    std::vector<std::vector<float>> out;
    for (int32_t s = 0; s < kSlots; ++s)
      for (int32_t l = 0; l < 2; ++l) out.push_back(dev_.read_state(l, s));
    return out;
  }
  kv::StatePool& device_pool() { return dev_; }

 private:
  static bool near(float got, double want) {
    return std::isfinite(got) && std::fabs(got - want) <= kTol * std::max(1.0, std::fabs(want));
  }

  platform::Platform& gpu_;
  LinearShape shape_;
  std::mt19937_64 rng_;
  kv::StatePool host_, dev_;
  backends::ReferenceLinearBackend ref_;
  backends::CudaLinearBackend cuda_;
  std::vector<std::vector<float>> w_;  ///< conv, conv_bias (may be empty), dt_bias, a_log, d
  std::vector<platform::DeviceBuffer> dev_w_;
};

/// The layer shapes: groups 2 / 1 / one head per group, d_conv 4 / 2 / 1, a time-step limit,
/// and a Bamba-sized head; the chunk hint `q`.
std::vector<LinearShape> shapes(int32_t q) {
  return {
      LinearShape{.num_heads = 4, .head_dim = 16, .state_size = 8, .num_groups = 2,
                  .conv_kernel = 4, .chunk_size = q},
      LinearShape{.num_heads = 3, .head_dim = 5, .state_size = 40, .num_groups = 1,
                  .conv_kernel = 2, .chunk_size = q, .dt_min = 0.01f, .dt_max = 0.5f},
      LinearShape{.num_heads = 2, .head_dim = 8, .state_size = 4, .num_groups = 2,
                  .conv_kernel = 1, .chunk_size = q},
      LinearShape{.num_heads = 2, .head_dim = 64, .state_size = 128, .num_groups = 1,
                  .conv_kernel = 4, .chunk_size = q},
  };
}

class CudaLinear : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu_test::have_gpu()) PAGODA_SKIP_GPU_TEST("no CUDA device");
    gpu_ = platform::make_cuda_platform();
    seed_ = gpu_test::test_seed(0x49u);
    std::printf("CudaLinear seed %llu (PAGODA_TEST_SEED re-runs it)\n",
                static_cast<unsigned long long>(seed_));
  }
  std::unique_ptr<platform::Platform> gpu_;
  uint64_t seed_ = 0;
};

TEST_F(CudaLinear, PrefillsAcrossChunkSizesEqualTheReference) {
  for (int32_t q : {4, 8, 64}) {
    for (const LinearShape& shape : shapes(q)) {
      SCOPED_TRACE(::testing::Message() << "chunk " << q << " heads " << shape.num_heads << " x "
                                        << shape.head_dim << " state " << shape.state_size);
      Twin twin(*gpu_, shape, seed_ + q);
      std::vector<Piece> pieces;
      for (int32_t n : {1, q - 1, q, q + 1, 3 * q + 2})
        if (n >= 1) pieces.push_back({.slot = twin.slot(), .n = n});
      (void)twin.slot();  // a bystander
      EXPECT_EQ(twin.call(pieces), "");
    }
  }
}

// Long sequences on the chunked SSD scan (kernels/cuda/linear_params.h: kSsdChunk rows a chunk,
// from kSsdChunkedFromTokens tokens) beside short ones on the token scan in the same calls:
// lengths of many chunks with ragged tails, exactly one chunk, one past the threshold and one
// below it, a decode row; every sequence from a random (nonzero) state; then prefill
// continuations of the same slots (the state written by the chunked scan read back by it), a
// restored copy continued beside its original, and a tree beside a long prefill.
TEST_F(CudaLinear, LongPrefillsAcrossManyChunksEqualTheReference) {
  for (const LinearShape& shape : shapes(256)) {
    SCOPED_TRACE(::testing::Message() << "heads " << shape.num_heads << " x " << shape.head_dim
                                      << " state " << shape.state_size);
    Twin twin(*gpu_, shape, seed_ + 4);
    std::vector<int32_t> slots;
    for (int i = 0; i < 7; ++i) slots.push_back(twin.slot());
    (void)twin.slot();  // a bystander
    const std::vector<int32_t> first = {1000, 1337, 130, 64, 16, 15, 1};
    std::vector<Piece> pieces;
    for (size_t i = 0; i < first.size(); ++i) pieces.push_back({.slot = slots[i], .n = first[i]});
    ASSERT_EQ(twin.call(pieces), "") << "first call";
    ASSERT_EQ(twin.call({{.slot = slots[0], .n = 777}, {.slot = slots[1], .n = 1},
                         {.slot = slots[2], .n = 65}, {.slot = slots[5], .n = 200}}),
              "")
        << "continuations";
    twin.copy_slot(slots[1], slots[6]);
    ASSERT_EQ(twin.call({{.slot = slots[6], .n = 321}, {.slot = slots[1], .n = 321}}), "")
        << "restored copy beside its original";
    Piece tree{.slot = slots[3], .n = 4};
    for (int32_t t = 0; t < 4; ++t) {
      tree.node_slots.push_back(twin.slot());
      tree.node_parents.push_back(t - 1);
    }
    ASSERT_EQ(twin.call({tree, {.slot = slots[4], .n = 513}}), "") << "tree beside a prefill";
  }
}

TEST_F(CudaLinear, DecodeStepsAndSplitPrefillsEqualTheReference) {
  for (const LinearShape& shape : shapes(8)) {
    SCOPED_TRACE(::testing::Message() << "heads " << shape.num_heads << " state "
                                      << shape.state_size);
    Twin twin(*gpu_, shape, seed_ + 1);
    const std::vector<int32_t> slots = {twin.slot(), twin.slot(), twin.slot()};
    (void)twin.slot();
    for (int step = 0; step < 6; ++step) {  // decode: one token each
      std::vector<Piece> pieces;
      for (int32_t s : slots) pieces.push_back({.slot = s, .n = 1});
      ASSERT_EQ(twin.call(pieces), "") << "decode step " << step;
    }
    for (int call = 0; call < 5; ++call) {  // ragged pieces; a sequence sometimes sits out
      std::vector<Piece> pieces;
      for (int32_t s : slots)
        if (twin.rng()() % 4 != 0)
          pieces.push_back({.slot = s, .n = 1 + static_cast<int32_t>(twin.rng()() % 13)});
      if (pieces.empty()) continue;
      ASSERT_EQ(twin.call(pieces), "") << "split call " << call;
    }
  }
}

TEST_F(CudaLinear, RestoredStateContinuesLikeTheOriginal) {
  for (const LinearShape& shape : shapes(8)) {
    Twin twin(*gpu_, shape, seed_ + 2);
    const int32_t a = twin.slot(), b = twin.slot();
    (void)twin.slot();
    ASSERT_EQ(twin.call({{.slot = a, .n = 11}}), "");
    twin.copy_slot(a, b);  // every layer of a into b, on the device stream
    ASSERT_EQ(twin.call({{.slot = a, .n = 5}, {.slot = b, .n = 5}}), "");
    ASSERT_EQ(twin.call({{.slot = b, .n = 1}, {.slot = a, .n = 1}}), "");
  }
}

TEST_F(CudaLinear, TreeVerifyNodesFollowTheirParents) {
  for (const LinearShape& shape : shapes(8)) {
    for (int32_t nodes : {4, 8}) {
      Twin twin(*gpu_, shape, seed_ + 3 + uint64_t(nodes));
      Piece tree{.slot = twin.slot(), .n = nodes};
      for (int32_t t = 0; t < nodes; ++t) {
        tree.node_slots.push_back(twin.slot());
        tree.node_parents.push_back(t == 0 ? -1 : static_cast<int32_t>(twin.rng()() % uint64_t(t)));
      }
      const std::vector<Piece> pieces = {tree, {.slot = twin.slot(), .n = 1},
                                         {.slot = twin.slot(), .n = 9}};
      (void)twin.slot();
      EXPECT_EQ(twin.call(pieces), "") << nodes << " nodes";
    }
  }
}

TEST_F(CudaLinear, DevicePoolZeroesFreedSlotsAndCopiesOnItsStream) {
  const LinearShape shape = shapes(8)[0];
  kv::StatePool pool(3, 4, shape.state_shape(), *gpu_);
  EXPECT_TRUE(pool.device().is_cuda());
  const int32_t a = pool.alloc(), b = pool.alloc();
  std::mt19937_64 rng(seed_);
  const kv::StateShape& sh = pool.shape();
  std::vector<std::vector<float>> wrote;
  for (int32_t l = 0; l < 3; ++l) {
    wrote.push_back(uniform_floats(rng, size_t(sh.conv_floats() + sh.ssm_floats()), -1.f, 1.f));
    pool.write_state(l, a, wrote.back());
  }
  pool.copy_slot(a, b);
  for (int32_t l = 0; l < 3; ++l) EXPECT_EQ(pool.read_state(l, b), wrote[size_t(l)]) << l;
  pool.free(a);  // zeroed on the stream
  pool.check_integrity();  // reads the free slots back: a must be zero
  const int32_t again = pool.alloc();
  EXPECT_EQ(again, a);
  for (int32_t l = 0; l < 3; ++l) {
    const auto v = pool.read_state(l, again);
    EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.f; })) << l;
    EXPECT_EQ(pool.read_state(l, b), wrote[size_t(l)]) << "the copy lost its state";
  }
  pool.retain(b);
  pool.free(b);  // one holder left: not zeroed
  EXPECT_EQ(pool.read_state(2, b), wrote[2]);
}

TEST_F(CudaLinear, RefusesHostPoolsAndHostViews) {
  const LinearShape shape = shapes(8)[0];
  backends::CudaLinearBackend cuda({.platform = gpu_.get()});
  kv::StatePool host(1, 2, shape.state_shape());
  const int32_t s = host.alloc();
  const std::vector<LinearSeq> one = {{.slot = s, .num_tokens = 1}};
  std::vector<float> w(size_t(shape.conv_dim() * shape.conv_kernel), 0.1f), x(256, 0.f);
  const attention::LinearLayer layer{
      .shape = shape, .weights = {.conv = w.data(), .dt_bias = w.data(), .a_log = w.data(),
                                  .d = w.data()}};
  cuda.init_forward_metadata(host, one);
  try {
    cuda.forward(layer, TensorView(x.data(), DType::kF32, {1, shape.conv_dim()}, gpu_->device()),
                 TensorView(x.data(), DType::kF32, {1, shape.num_heads}, gpu_->device()),
                 TensorView(x.data(), DType::kF32, {1, shape.d_inner()}, gpu_->device()));
    ADD_FAILURE() << "a host pool was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("state pool lives on cpu"), std::string::npos)
        << e.what();
  }
  kv::StatePool dev(1, 2, shape.state_shape(), *gpu_);
  cuda.init_forward_metadata(dev, std::vector<LinearSeq>{{.slot = dev.alloc(), .num_tokens = 1}});
  try {
    cuda.forward(layer, TensorView(x.data(), DType::kF32, {1, shape.conv_dim()}),
                 TensorView(x.data(), DType::kF32, {1, shape.num_heads}),
                 TensorView(x.data(), DType::kF32, {1, shape.d_inner()}));
    ADD_FAILURE() << "host views were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
  }
}

}  // namespace
}  // namespace pagoda
