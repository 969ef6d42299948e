#include "pagoda/kv/kv_pool.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"

namespace pagoda::kv {

namespace {

/// quantize_index_key's scale of x [dim] (the header states the rule).
float index_key_scale(const float* x, int64_t dim) {
  float amax = 0.f;
  for (int64_t j = 0; j < dim; ++j) amax = std::max(amax, std::fabs(x[j]));
  if (amax == 0.f) return 1.f;
  int e = 0;
  const float m = std::frexp(amax / 448.f, &e);  // amax / 448 = m · 2^e, m in [0.5, 1)
  return std::ldexp(1.f, m == 0.5f ? e - 1 : e);
}

}  // namespace

void quantize_index_key(const float* x, int64_t dim, uint8_t* row) {
  const float scale = index_key_scale(x, dim);
  for (int64_t j = 0; j < dim; ++j) row[j] = f32_to_e4m3(x[j] / scale);
  std::memcpy(row + dim, &scale, sizeof(float));
}

void round_to_index_grid(const float* x, int64_t dim, float* out) {
  const float scale = index_key_scale(x, dim);
  for (int64_t j = 0; j < dim; ++j) out[j] = e4m3_to_f32(f32_to_e4m3(x[j] / scale)) * scale;
}

KvPool::KvPool(const KvPoolConfig& config, platform::Allocator& allocator)
    : config_(config), allocator_(&allocator) {
  const auto& c = config_;
  PAGODA_REQUIRE(c.num_layers >= 0 && c.num_pages >= 0 && c.page_size >= 1, kInvalidArgument,
                 "KvPool needs num_layers >= 0, num_pages >= 0, page_size >= 1 (got {}, {}, {})",
                 c.num_layers, c.num_pages, c.page_size);
  PAGODA_REQUIRE(dtype_is_float(c.dtype), kInvalidArgument,
                 "KvPool storage dtype must be f32, f16, bf16, fp8_e4m3 or fp8_e5m2, not {}", c.dtype);
  if (c.layout == KvLayout::kMha) {
    if (config_.head_dim_v == 0) config_.head_dim_v = c.head_dim;
    PAGODA_REQUIRE(c.num_kv_heads >= 1 && c.head_dim >= 1 && config_.head_dim_v >= 1,
                   kInvalidArgument, "MHA pool needs num_kv_heads, head_dim, head_dim_v >= 1");
    k_row_ = int64_t{c.num_kv_heads} * c.head_dim;
    v_row_ = int64_t{c.num_kv_heads} * config_.head_dim_v;
  } else {
    PAGODA_REQUIRE(c.kv_lora_rank >= 1 && c.rope_dim >= 0, kInvalidArgument,
                   "MLA pool needs kv_lora_rank >= 1 and rope_dim >= 0 (got {}, {})",
                   c.kv_lora_rank, c.rope_dim);
    config_.num_kv_heads = 1;
    k_row_ = int64_t{c.kv_lora_rank} + c.rope_dim;
    v_row_ = c.kv_lora_rank;
    PAGODA_REQUIRE(c.index_head_dim >= 0, kInvalidArgument, "index_head_dim {} < 0",
                   c.index_head_dim);
    index_row_ = c.index_head_dim > 0 ? int64_t{c.index_head_dim} + 4 : 0;
  }
  PAGODA_REQUIRE(c.layout == KvLayout::kMla || c.index_head_dim == 0, kInvalidArgument,
                 "index keys (index_head_dim {}) need an MLA pool", c.index_head_dim);
  num_slots_ = (int64_t{c.num_pages} + 1) * c.page_size;
  const size_t elem = dtype_size(c.dtype);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const size_t k_bytes = static_cast<size_t>(num_slots_ * k_row_) * elem;
    k_buffers_.push_back(platform::make_buffer(allocator, k_bytes));
    allocator.fill_bytes(k_buffers_.back().get(), 0, k_bytes);
    allocated_bytes_ += static_cast<int64_t>(k_bytes);
    if (c.layout == KvLayout::kMha) {
      const size_t v_bytes = static_cast<size_t>(num_slots_ * v_row_) * elem;
      v_buffers_.push_back(platform::make_buffer(allocator, v_bytes));
      allocator.fill_bytes(v_buffers_.back().get(), 0, v_bytes);
      allocated_bytes_ += static_cast<int64_t>(v_bytes);
    }
    if (index_row_ > 0) {
      const auto bytes = static_cast<size_t>(num_slots_ * index_row_);
      index_buffers_.push_back(platform::make_buffer(allocator, bytes));
      allocator.fill_bytes(index_buffers_.back().get(), 0, bytes);
    }
  }
  k_scales_.assign(static_cast<size_t>(c.num_layers), 1.0f);
  v_scales_.assign(static_cast<size_t>(c.num_layers), 1.0f);
}

int64_t kv_bytes_per_token(const KvPoolConfig& c) {
  PAGODA_REQUIRE(c.num_layers >= 0 && dtype_is_float(c.dtype), kInvalidArgument,
                 "a KV pool needs num_layers >= 0 and a float dtype (got {}, {})", c.num_layers,
                 c.dtype);
  const int64_t elem = static_cast<int64_t>(dtype_size(c.dtype));
  int64_t row = 0;  // bytes of one token in one layer
  if (c.layout == KvLayout::kMha) {
    PAGODA_REQUIRE(c.num_kv_heads >= 1 && c.head_dim >= 1 && c.head_dim_v >= 0, kInvalidArgument,
                   "MHA pool needs num_kv_heads, head_dim >= 1");
    row = int64_t{c.num_kv_heads} * (c.head_dim + (c.head_dim_v == 0 ? c.head_dim : c.head_dim_v)) *
          elem;
  } else {
    PAGODA_REQUIRE(c.kv_lora_rank >= 1 && c.rope_dim >= 0 && c.index_head_dim >= 0,
                   kInvalidArgument, "MLA pool needs kv_lora_rank >= 1, rope_dim and "
                   "index_head_dim >= 0");
    row = (int64_t{c.kv_lora_rank} + c.rope_dim) * elem +
          (c.index_head_dim > 0 ? int64_t{c.index_head_dim} + 4 : 0);
  }
  return row * c.num_layers;
}

int64_t KvPool::bytes_per_token() const { return kv_bytes_per_token(config_); }

void KvPool::require_layer(LayerId layer) const {
  PAGODA_REQUIRE(layer.value() >= 0 && layer.value() < config_.num_layers, kOutOfRange,
                 "layer {} outside [0, {})", layer.value(), config_.num_layers);
}

void KvPool::require_host(const char* what) const {
  PAGODA_REQUIRE(device().is_cpu(), kUnsupported,
                 "KvPool::{} runs on host pools only; this pool lives on {} (use the device "
                 "backend's KV write)",
                 what, device().to_string());
}

TensorView KvPool::k_view(LayerId layer) const {
  require_layer(layer);
  const int64_t pages = config_.num_pages + 1;
  const int64_t dim = config_.layout == KvLayout::kMha ? config_.head_dim : k_row_;
  return TensorView(k_buffers_[layer.value()].get(), config_.dtype,
                    {pages, config_.page_size, config_.num_kv_heads, dim}, device());
}

TensorView KvPool::v_view(LayerId layer) const {
  require_layer(layer);
  const int64_t pages = config_.num_pages + 1;
  if (config_.layout == KvLayout::kMha) {
    return TensorView(v_buffers_[layer.value()].get(), config_.dtype,
                      {pages, config_.page_size, config_.num_kv_heads, config_.head_dim_v},
                      device());
  }
  return TensorView(k_buffers_[layer.value()].get(), config_.dtype,
                    {pages, config_.page_size, 1, config_.kv_lora_rank},
                    {config_.page_size * k_row_, k_row_, k_row_, 1}, device());
}

void KvPool::set_scales(LayerId layer, float k_scale, float v_scale) {
  require_layer(layer);
  PAGODA_REQUIRE(std::isfinite(k_scale) && k_scale > 0 && std::isfinite(v_scale) && v_scale > 0,
                 kInvalidArgument, "KV scales must be finite and > 0 (got {}, {})", k_scale,
                 v_scale);
  PAGODA_REQUIRE(config_.layout != KvLayout::kMla || v_scale == k_scale, kInvalidArgument,
                 "layer {}: an MLA pool stores one latent row per token and V is that stored row, "
                 "so v_scale must equal k_scale (got {} and {})",
                 layer.value(), k_scale, v_scale);
  k_scales_[layer.value()] = k_scale;
  v_scales_[layer.value()] = v_scale;
}

float KvPool::k_scale(LayerId layer) const {
  require_layer(layer);
  return k_scales_[layer.value()];
}

float KvPool::v_scale(LayerId layer) const {
  require_layer(layer);
  return v_scales_[layer.value()];
}

namespace {

void require_rows(const TensorView& t, const char* name, int64_t n, int64_t heads, int64_t dim) {
  PAGODA_REQUIRE(t.rank() == 3 && t.size(0) == n && t.size(1) == heads && t.size(2) == dim,
                 kInvalidArgument, "set_kv: {} is {}, expected [{}, {}, {}]", name, t.describe(),
                 n, heads, dim);
  PAGODA_REQUIRE(dtype_is_float(t.dtype()), kInvalidArgument, "set_kv: {} has dtype {}", name,
                 t.dtype());
  PAGODA_REQUIRE(t.device().is_cpu(), kUnsupported, "set_kv: {} lives on {}, not the host", name,
                 t.device().to_string());
  PAGODA_REQUIRE(n == 0 || t.data() != nullptr, kInvalidArgument, "set_kv: {} has no data", name);
}

}  // namespace

void KvPool::set_kv(LayerId layer, std::span<const SlotIndex> loc, const TensorView& k,
                    const TensorView& v) {
  require_layer(layer);
  require_host("set_kv");
  const auto n = static_cast<int64_t>(loc.size());
  if (config_.layout == KvLayout::kMha) {
    require_rows(k, "k", n, config_.num_kv_heads, config_.head_dim);
    require_rows(v, "v", n, config_.num_kv_heads, config_.head_dim_v);
  } else {
    require_rows(k, "k (latent)", n, 1, k_row_);
    PAGODA_REQUIRE(v.rank() == 0 || v.numel() == 0, kInvalidArgument,
                   "set_kv on an MLA pool takes the latent row in k; v must be empty, got {}",
                   v.describe());
  }
  for (int64_t i = 0; i < n; ++i) {
    PAGODA_REQUIRE(loc[i] >= 0 && loc[i] < num_slots_, kOutOfRange,
                   "set_kv: slot {} (token {}) outside [0, {})", loc[i], i, num_slots_);
  }
  write_rows(k_buffers_[layer.value()].get(), k_row_, loc, k, k_scales_[layer.value()]);
  if (config_.layout == KvLayout::kMha) {
    write_rows(v_buffers_[layer.value()].get(), v_row_, loc, v, v_scales_[layer.value()]);
  }
}

void KvPool::write_rows(void* base, int64_t row_elems, std::span<const SlotIndex> loc,
                        const TensorView& src, float scale) {
  const DType dst_type = config_.dtype;
  const int64_t heads = src.size(1), dim = src.size(2);
  const int64_t s0 = src.stride(0), s1 = src.stride(1), s2 = src.stride(2);
  const bool row_contiguous = s2 == 1 && s1 == dim;
  const size_t elem = dtype_size(dst_type);
  for (size_t i = 0; i < loc.size(); ++i) {
    const int64_t dst0 = static_cast<int64_t>(loc[i]) * row_elems;
    const int64_t src0 = static_cast<int64_t>(i) * s0;
    if (row_contiguous && src.dtype() == dst_type && scale == 1.0f) {
      std::memcpy(static_cast<char*>(base) + dst0 * static_cast<int64_t>(elem),
                  static_cast<const char*>(src.data()) + src0 * static_cast<int64_t>(elem),
                  static_cast<size_t>(row_elems) * elem);
      continue;
    }
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t d = 0; d < dim; ++d) {
        const float x = read_as_f32(src.data(), src.dtype(), static_cast<size_t>(src0 + h * s1 + d * s2));
        write_from_f32(base, dst_type, static_cast<size_t>(dst0 + h * dim + d), x / scale);
      }
    }
  }
}

float KvPool::read_elem(const void* base, int64_t row_elems, SlotIndex slot, int64_t index,
                        float scale) const {
  PAGODA_REQUIRE(slot >= 0 && slot < num_slots_, kOutOfRange, "slot {} outside [0, {})", slot,
                 num_slots_);
  return read_as_f32(base, config_.dtype, static_cast<size_t>(slot * row_elems + index)) * scale;
}

float KvPool::k_at(LayerId layer, SlotIndex slot, int32_t head, int32_t d) const {
  require_layer(layer);
  require_host("k_at");
  const int64_t dim = config_.layout == KvLayout::kMha ? config_.head_dim : k_row_;
  PAGODA_REQUIRE(head >= 0 && head < config_.num_kv_heads && d >= 0 && d < dim, kOutOfRange,
                 "k_at: head {} / dim {} outside [{}, {}]", head, d, config_.num_kv_heads, dim);
  return read_elem(k_buffers_[layer.value()].get(), k_row_, slot, int64_t{head} * dim + d,
                   k_scales_[layer.value()]);
}

float KvPool::v_at(LayerId layer, SlotIndex slot, int32_t head, int32_t d) const {
  require_layer(layer);
  require_host("v_at");
  if (config_.layout == KvLayout::kMla) {
    PAGODA_REQUIRE(head == 0 && d >= 0 && d < config_.kv_lora_rank, kOutOfRange,
                   "v_at: head {} / dim {} outside MLA [1, {}]", head, d, config_.kv_lora_rank);
    return read_elem(k_buffers_[layer.value()].get(), k_row_, slot, d, v_scales_[layer.value()]);
  }
  PAGODA_REQUIRE(head >= 0 && head < config_.num_kv_heads && d >= 0 && d < config_.head_dim_v,
                 kOutOfRange, "v_at: head {} / dim {} outside [{}, {}]", head, d,
                 config_.num_kv_heads, config_.head_dim_v);
  return read_elem(v_buffers_[layer.value()].get(), v_row_, slot,
                   int64_t{head} * config_.head_dim_v + d, v_scales_[layer.value()]);
}

void KvPool::set_index_keys(LayerId layer, std::span<const SlotIndex> loc, const float* k) {
  require_layer(layer);
  require_host("set_index_keys");
  PAGODA_REQUIRE(index_row_ > 0, kInvalidArgument,
                 "set_index_keys: the pool has no index keys (index_head_dim 0)");
  for (size_t i = 0; i < loc.size(); ++i)
    PAGODA_REQUIRE(loc[i] >= 0 && loc[i] < num_slots_, kOutOfRange,
                   "set_index_keys: slot {} (token {}) outside [0, {})", loc[i], i, num_slots_);
  const int64_t d = config_.index_head_dim;
  auto* base = static_cast<uint8_t*>(index_buffers_[layer.value()].get());
  for (size_t i = 0; i < loc.size(); ++i)
    quantize_index_key(k + static_cast<int64_t>(i) * d, d,
                       base + static_cast<int64_t>(loc[i]) * index_row_);
}

const uint8_t* KvPool::index_rows(LayerId layer) const {
  require_layer(layer);
  require_host("index_rows");
  PAGODA_REQUIRE(index_row_ > 0, kInvalidArgument, "the pool has no index keys");
  return static_cast<const uint8_t*>(index_buffers_[layer.value()].get());
}

void* KvPool::index_data(LayerId layer) const {
  require_layer(layer);
  PAGODA_REQUIRE(index_row_ > 0, kInvalidArgument, "the pool has no index keys");
  return index_buffers_[layer.value()].get();
}

float KvPool::index_key_at(LayerId layer, SlotIndex slot, int32_t d) const {
  const uint8_t* rows = index_rows(layer);
  PAGODA_REQUIRE(slot >= 0 && slot < num_slots_ && d >= 0 && d < config_.index_head_dim,
                 kOutOfRange, "index_key_at: slot {} / dim {} outside [{}, {}]", slot, d,
                 num_slots_, config_.index_head_dim);
  const uint8_t* row = rows + slot * index_row_;
  float scale = 0.f;
  std::memcpy(&scale, row + config_.index_head_dim, sizeof(float));
  return e4m3_to_f32(row[d]) * scale;
}

void KvPool::fill(float value) {
  require_host("fill");
  auto fill_buffer = [&](void* base, int64_t row_elems) {
    const int64_t n = num_slots_ * row_elems;
    if (n == 0) return;
    write_from_f32(base, config_.dtype, 0, value);
    const size_t elem = dtype_size(config_.dtype);
    for (int64_t i = 1; i < n; ++i) {
      std::memcpy(static_cast<char*>(base) + i * static_cast<int64_t>(elem), base, elem);
    }
  };
  for (auto& b : k_buffers_) fill_buffer(b.get(), k_row_);
  for (auto& b : v_buffers_) fill_buffer(b.get(), v_row_);
}

void KvPool::fill_bytes(uint8_t byte) {
  const size_t elem = dtype_size(config_.dtype);
  for (auto& b : k_buffers_) {
    allocator_->fill_bytes(b.get(), byte, static_cast<size_t>(num_slots_ * k_row_) * elem);
  }
  for (auto& b : v_buffers_) {
    allocator_->fill_bytes(b.get(), byte, static_cast<size_t>(num_slots_ * v_row_) * elem);
  }
  for (auto& b : index_buffers_)
    allocator_->fill_bytes(b.get(), byte, static_cast<size_t>(num_slots_ * index_row_));
}

void KvPool::move_kv(std::span<const SlotIndex> src, std::span<const SlotIndex> dst) {
  PAGODA_REQUIRE(src.size() == dst.size(), kInvalidArgument,
                 "move_kv got {} sources and {} destinations", src.size(), dst.size());
  for (size_t i = 0; i < src.size(); ++i)
    PAGODA_REQUIRE(src[i] >= 0 && src[i] < num_slots_ && dst[i] >= 0 && dst[i] < num_slots_,
                   kOutOfRange, "move_kv pair {} ({} -> {}) outside [0, {})", i, src[i], dst[i],
                   num_slots_);
  if (src.empty()) return;
  const size_t elem = dtype_size(config_.dtype);
  std::vector<uint8_t> rows;
  auto move = [&](void* base, int64_t row_elems, size_t elem_bytes) {
    const size_t bytes = static_cast<size_t>(row_elems) * elem_bytes;
    auto* b = static_cast<uint8_t*>(base);
    rows.resize(bytes * src.size());
    for (size_t i = 0; i < src.size(); ++i)
      allocator_->copy_to_host(rows.data() + i * bytes, b + static_cast<size_t>(src[i]) * bytes,
                               bytes);
    for (size_t i = 0; i < dst.size(); ++i)
      allocator_->copy_to_device(b + static_cast<size_t>(dst[i]) * bytes,
                                 rows.data() + i * bytes, bytes);
  };
  for (auto& b : k_buffers_) move(b.get(), k_row_, elem);
  for (auto& b : v_buffers_) move(b.get(), v_row_, elem);
  for (auto& b : index_buffers_) move(b.get(), index_row_, 1);
}

}  // namespace pagoda::kv
