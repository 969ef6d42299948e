#include "pagoda/kv/kv_pool.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"

namespace pagoda::kv {
namespace {

class KvPoolTest : public ::testing::Test {
 protected:
  std::unique_ptr<platform::Platform> platform_ = platform::make_cpu_platform();
  platform::Allocator& alloc() { return platform_->allocator(); }
};

KvPoolConfig mha(DType dtype) {
  return KvPoolConfig{.layout = KvLayout::kMha, .num_layers = 2, .num_pages = 3, .page_size = 4,
                      .dtype = dtype, .num_kv_heads = 2, .head_dim = 3, .head_dim_v = 5};
}

TEST_F(KvPoolTest, MhaShapesAndAccounting) {
  KvPool pool(mha(DType::kBF16), alloc());
  EXPECT_EQ(pool.num_slots(), 16);
  EXPECT_EQ(pool.k_row_elems(), 6);
  EXPECT_EQ(pool.v_row_elems(), 10);
  EXPECT_EQ(pool.bytes_per_token(), (6 + 10) * 2 * 2);
  EXPECT_EQ(pool.total_bytes(), 16 * pool.bytes_per_token());
  TensorView k = pool.k_view(LayerId(1));
  EXPECT_EQ(k.rank(), 4);
  EXPECT_EQ(k.size(0), 4);
  EXPECT_EQ(k.size(1), 4);
  EXPECT_EQ(k.size(2), 2);
  EXPECT_EQ(k.size(3), 3);
  EXPECT_EQ(k.dtype(), DType::kBF16);
  EXPECT_EQ(pool.v_view(LayerId(0)).size(3), 5);
  EXPECT_NE(pool.k_view(LayerId(0)).data(), pool.k_view(LayerId(1)).data());
  EXPECT_THROW(pool.k_view(LayerId(2)), Error);
  EXPECT_EQ(pool.k_at(LayerId(0), 15, 1, 2), 0.0f);  // zero-initialised
}

TEST_F(KvPoolTest, SetKvRoundTripsEveryDtype) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kFp8E4M3, DType::kFp8E5M2}) {
    KvPool pool(mha(dt), alloc());
    pool.set_scales(LayerId(1), 0.5f, 2.0f);
    std::vector<float> k(2 * 2 * 3), v(2 * 2 * 5);
    for (size_t i = 0; i < k.size(); ++i) k[i] = 0.25f * static_cast<float>(i) - 1.0f;
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5f * static_cast<float>(i) + 1.0f;
    const std::vector<SlotIndex> loc{13, 6};
    pool.set_kv(LayerId(1), loc, TensorView(k.data(), DType::kF32, {2, 2, 3}),
                TensorView(v.data(), DType::kF32, {2, 2, 5}));
    for (int t = 0; t < 2; ++t) {
      for (int h = 0; h < 2; ++h) {
        for (int d = 0; d < 3; ++d) {
          const float x = k[(t * 2 + h) * 3 + d];
          // Independent expectation: quantise x / scale with the core converters, multiply back.
          float q = x / 0.5f;
          std::vector<uint8_t> buf(8);
          write_from_f32(buf.data(), dt, 0, q);
          EXPECT_EQ(pool.k_at(LayerId(1), loc[t], h, d), read_as_f32(buf.data(), dt, 0) * 0.5f)
              << dtype_name(dt);
        }
        for (int d = 0; d < 5; ++d) {
          const float x = v[(t * 2 + h) * 5 + d];
          std::vector<uint8_t> buf(8);
          write_from_f32(buf.data(), dt, 0, x / 2.0f);
          EXPECT_EQ(pool.v_at(LayerId(1), loc[t], h, d), read_as_f32(buf.data(), dt, 0) * 2.0f);
        }
      }
    }
    EXPECT_EQ(pool.k_at(LayerId(0), 13, 0, 0), 0.0f) << "other layer untouched";
    EXPECT_EQ(pool.k_at(LayerId(1), 12, 0, 0), 0.0f) << "other slot untouched";
  }
}

TEST_F(KvPoolTest, SetKvStridedBf16Input) {
  KvPool pool(mha(DType::kF32), alloc());
  // k as a transposed view: logical [1, 2, 3] over memory laid out [3, 2].
  std::vector<uint16_t> kmem(6);
  for (int i = 0; i < 6; ++i) kmem[i] = f32_to_bf16_bits(static_cast<float>(i));
  std::vector<float> v(10, 7.0f);
  pool.set_kv(LayerId(0), std::vector<SlotIndex>{5},
              TensorView(kmem.data(), DType::kBF16, {1, 2, 3}, {6, 1, 2}),
              TensorView(v.data(), DType::kF32, {1, 2, 5}));
  EXPECT_EQ(pool.k_at(LayerId(0), 5, 0, 0), 0.0f);
  EXPECT_EQ(pool.k_at(LayerId(0), 5, 0, 1), 2.0f);
  EXPECT_EQ(pool.k_at(LayerId(0), 5, 1, 0), 1.0f);
  EXPECT_EQ(pool.k_at(LayerId(0), 5, 1, 2), 5.0f);
}

TEST_F(KvPoolTest, SetKvBadInputLeavesPoolUnchanged) {
  KvPool pool(mha(DType::kF32), alloc());
  pool.fill(1.0f);
  std::vector<float> k(2 * 2 * 3, 9.0f), v(2 * 2 * 5, 9.0f);
  auto K = TensorView(k.data(), DType::kF32, {2, 2, 3});
  auto V = TensorView(v.data(), DType::kF32, {2, 2, 5});
  auto expect_code = [&](ErrorCode code, auto&& f) {
    try {
      f();
      ADD_FAILURE() << "no Error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
    }
    for (SlotIndex s = 0; s < pool.num_slots(); ++s) {
      ASSERT_EQ(pool.k_at(LayerId(0), s, 0, 0), 1.0f) << "slot " << s << " written";
      ASSERT_EQ(pool.v_at(LayerId(0), s, 1, 4), 1.0f);
    }
  };
  expect_code(ErrorCode::kOutOfRange, [&] { pool.set_kv(LayerId(0), std::vector<SlotIndex>{3, 16}, K, V); });
  expect_code(ErrorCode::kOutOfRange, [&] { pool.set_kv(LayerId(0), std::vector<SlotIndex>{-1, 2}, K, V); });
  expect_code(ErrorCode::kInvalidArgument, [&] { pool.set_kv(LayerId(0), std::vector<SlotIndex>{1}, K, V); });
  expect_code(ErrorCode::kInvalidArgument, [&] { pool.set_kv(LayerId(0), std::vector<SlotIndex>{1, 2}, V, K); });
  expect_code(ErrorCode::kOutOfRange, [&] { pool.set_kv(LayerId(5), std::vector<SlotIndex>{1, 2}, K, V); });
  std::vector<int32_t> ints(12);
  expect_code(ErrorCode::kInvalidArgument, [&] {
    pool.set_kv(LayerId(0), std::vector<SlotIndex>{1, 2}, TensorView(ints.data(), DType::kI32, {2, 2, 3}), V);
  });
  EXPECT_THROW(pool.set_scales(LayerId(0), 0.0f, 1.0f), Error);
  EXPECT_THROW(pool.set_scales(LayerId(0), 1.0f, NAN), Error);
}

TEST_F(KvPoolTest, MlaLatentAndValueView) {
  KvPoolConfig c{.layout = KvLayout::kMla, .num_layers = 1, .num_pages = 2, .page_size = 2,
                 .dtype = DType::kF32, .kv_lora_rank = 4, .rope_dim = 2};
  KvPool pool(c, alloc());
  // V is the stored latent row: one scale for both (the oracle and every backend agree on it).
  EXPECT_THROW(pool.set_scales(LayerId(0), 0.5f, 2.0f), Error);
  EXPECT_EQ(pool.v_scale(LayerId(0)), 1.0f);
  pool.set_scales(LayerId(0), 0.5f, 0.5f);
  pool.set_scales(LayerId(0), 1.0f, 1.0f);
  EXPECT_EQ(pool.k_row_elems(), 6);
  EXPECT_EQ(pool.bytes_per_token(), 6 * 4);
  std::vector<float> lat{1, 2, 3, 4, 5, 6};
  pool.set_kv(LayerId(0), std::vector<SlotIndex>{3}, TensorView(lat.data(), DType::kF32, {1, 1, 6}),
              TensorView());
  TensorView k = pool.k_view(LayerId(0));
  TensorView v = pool.v_view(LayerId(0));
  EXPECT_EQ(k.size(3), 6);
  EXPECT_EQ(v.size(3), 4);
  EXPECT_EQ(v.data(), k.data());
  EXPECT_EQ(v.stride(1), 6);
  EXPECT_FALSE(v.is_contiguous());
  EXPECT_EQ(pool.v_at(LayerId(0), 3, 0, 3), 4.0f);
  EXPECT_EQ(pool.k_at(LayerId(0), 3, 0, 5), 6.0f);
  EXPECT_EQ(k.data_as<float>()[3 * 6 + 4], 5.0f);
  std::vector<float> vv(4);
  EXPECT_THROW(pool.set_kv(LayerId(0), std::vector<SlotIndex>{3},
                           TensorView(lat.data(), DType::kF32, {1, 1, 6}),
                           TensorView(vv.data(), DType::kF32, {1, 1, 4})),
               Error);
}

TEST_F(KvPoolTest, DsaIndexKeysQuantiseMoveAndCount) {
  KvPoolConfig c{.layout = KvLayout::kMla, .num_layers = 2, .num_pages = 3, .page_size = 2,
                 .dtype = DType::kF32, .kv_lora_rank = 4, .rope_dim = 2, .index_head_dim = 8};
  KvPool pool(c, alloc());
  EXPECT_EQ(pool.index_row_bytes(), 8 + 4);
  EXPECT_EQ(pool.bytes_per_token(), 2 * (6 * 4 + 12));
  // amax 3.5: scale 2^ceil(log2(3.5 / 448)) = 2^-7; 0.3 / 2^-7 = 38.4 → e4m3 40 (quantum 4).
  std::vector<float> k{3.5f, -1.0f, 0.3f, 0.f, 0.001f, -3.5f, 2.0f, 1.25f};
  pool.set_index_keys(LayerId(1), std::vector<SlotIndex>{5}, k.data());
  const float scale = 1.0f / 128;
  for (int d = 0; d < 8; ++d) {
    const float want = e4m3_to_f32(f32_to_e4m3(k[d] / scale)) * scale;
    EXPECT_EQ(pool.index_key_at(LayerId(1), 5, d), want) << "dim " << d;
  }
  EXPECT_EQ(pool.index_key_at(LayerId(1), 5, 2), 40.0f / 128);
  EXPECT_EQ(pool.index_key_at(LayerId(0), 5, 0), 0.0f);  // the other layer untouched
  // move_kv carries the index row with the latent row.
  pool.move_kv(std::vector<SlotIndex>{5}, std::vector<SlotIndex>{2});
  EXPECT_EQ(pool.index_key_at(LayerId(1), 2, 2), 40.0f / 128);
  EXPECT_EQ(pool.index_key_at(LayerId(1), 2, 5), -3.5f);
  // Bad slots write nothing; MHA pools and pools without index keys refuse.
  EXPECT_THROW(pool.set_index_keys(LayerId(0), std::vector<SlotIndex>{1, 8}, k.data()), Error);
  EXPECT_EQ(pool.index_key_at(LayerId(0), 1, 0), 0.0f);
  KvPoolConfig plain = c;
  plain.index_head_dim = 0;
  KvPool none(plain, alloc());
  EXPECT_THROW(none.set_index_keys(LayerId(0), std::vector<SlotIndex>{1}, k.data()), Error);
  KvPoolConfig m = mha(DType::kF32);
  m.index_head_dim = 8;
  EXPECT_THROW(KvPool(m, alloc()), Error);
}

TEST_F(KvPoolTest, FillPoisonsWithNan) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kFp8E4M3, DType::kFp8E5M2}) {
    KvPool pool(mha(dt), alloc());
    pool.fill(NAN);
    EXPECT_TRUE(std::isnan(pool.k_at(LayerId(1), 7, 1, 2)));
    EXPECT_TRUE(std::isnan(pool.v_at(LayerId(0), 0, 0, 4)));
    pool.fill_bytes(0);
    EXPECT_EQ(pool.v_at(LayerId(0), 0, 0, 4), 0.0f);
  }
}

/// Forwards to another allocator and counts the bytes it hands out.
class CountingAllocator final : public platform::Allocator {
 public:
  explicit CountingAllocator(platform::Allocator& inner) : inner_(&inner) {}
  Device device() const override { return inner_->device(); }
  void* allocate(size_t bytes, size_t alignment) override {
    allocated += static_cast<int64_t>(bytes);
    ++buffers;
    return inner_->allocate(bytes, alignment);
  }
  void deallocate(void* ptr) override { inner_->deallocate(ptr); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    inner_->copy_to_device(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    inner_->copy_to_host(dst, src, bytes);
  }
  void fill_bytes(void* dst, uint8_t value, size_t bytes) override {
    inner_->fill_bytes(dst, value, bytes);
  }
  int64_t allocated = 0;
  int buffers = 0;

 private:
  platform::Allocator* inner_;
};

// A pool allocates exactly its layers (the SWA pool's split by layer kind depends on it): K and V
// of (pages + 1) x page_size rows per layer, nothing for a pool of 0 layers (page ids only).
TEST_F(KvPoolTest, AllocatesExactlyItsLayers) {
  for (int32_t layers : {0, 1, 3, 22}) {
    SCOPED_TRACE(::testing::Message() << layers << " layers");
    CountingAllocator counting(alloc());
    KvPoolConfig c = mha(DType::kBF16);  // 2 heads, K dim 3, V dim 5
    c.num_layers = layers;
    c.num_pages = 7;
    KvPool pool(c, counting);
    const int64_t expected = int64_t{layers} * (7 + 1) * 4 * 2 * (3 + 5) * 2;
    EXPECT_EQ(counting.allocated, expected);
    EXPECT_EQ(counting.buffers, 2 * layers);
    EXPECT_EQ(pool.total_bytes(), expected);
    EXPECT_EQ(pool.num_layers(), layers);
    EXPECT_THROW(pool.k_view(LayerId(layers)), Error);
  }
  CountingAllocator counting(alloc());
  KvPoolConfig mla{.layout = KvLayout::kMla, .num_layers = 2, .num_pages = 5, .page_size = 2,
                   .dtype = DType::kF16, .kv_lora_rank = 4, .rope_dim = 2};
  KvPool pool(mla, counting);
  EXPECT_EQ(counting.allocated, int64_t{2} * (5 + 1) * 2 * (4 + 2) * 2);
  EXPECT_EQ(pool.total_bytes(), counting.allocated);
}

TEST_F(KvPoolTest, BadConfigs) {
  auto c = mha(DType::kI32);
  EXPECT_THROW(KvPool(c, alloc()), Error);
  c = mha(DType::kF16);
  c.num_kv_heads = 0;
  EXPECT_THROW(KvPool(c, alloc()), Error);
  KvPoolConfig mla{.layout = KvLayout::kMla, .num_layers = 1, .num_pages = 1, .page_size = 1};
  EXPECT_THROW(KvPool(mla, alloc()), Error);
  c = mha(DType::kF16);
  c.num_layers = -1;
  EXPECT_THROW(KvPool(c, alloc()), Error);
}

}  // namespace
}  // namespace pagoda::kv
