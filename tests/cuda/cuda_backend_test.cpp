/// CudaBackend end to end on a device KvPool (label "gpu": needs a GPU; skipped without one).
///
/// Eager: forward() appends the new K/V with the CUDA append kernel, then attends; the same step
/// runs through ReferenceBackend on a host pool holding the same bytes. Outputs must agree within
/// the conformance tolerances, and afterwards both pools must hold the same values (the append
/// wrote exactly the step's slots; every other slot is still NaN).
///
/// CUDA graphs through the backend hooks: a tiny 2-layer stack (layer 1's q is layer 0's output)
/// is captured once on the backend's stream with a dummy batch (row 0, slot 0, seq_len fill
/// value), then replayed for new batches of other lengths padded to the bucket. Replay must be
/// bit-identical to eager execution of the same padded batch, close to eager execution of the
/// unpadded batch, close to the reference, and must have written the new K/V. A draft-extend
/// graph (4 requests × 4 tokens) replays ragged, padded and all-ones accepted counts.
///
/// Inputs are random with the seed in every failure message (SCOPED_TRACE); outputs and unused
/// KV slots are NaN-poisoned so unwritten outputs or stray reads fail.

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_common.h"
#include "pagoda/attention/backend.h"
#include "pagoda/backends/cuda/cuda_backend.h"
#include "pagoda/backends/reference/reference_backend.h"
#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/platform/cuda/cuda_platform.h"
#include "pagoda/platform/platform.h"

namespace pagoda::cuda_test {
namespace {

using namespace pagoda::attention;
using backends::CudaBackend;
using backends::ReferenceBackend;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

#define REQUIRE_GPU() PAGODA_REQUIRE_GPU()

// ---- small host / device tensors (rank 3: [tokens, heads, dim]) ----

struct HostT {
  DType dtype = DType::kF32;
  int64_t n = 0, h = 0, d = 0;
  std::vector<uint8_t> bytes;
  HostT() = default;
  HostT(int64_t n_, int64_t h_, int64_t d_, DType t) : dtype(t), n(n_), h(h_), d(d_) {
    bytes.assign(size_t(n * h * d) * dtype_size(t), 0);
  }
  int64_t numel() const { return n * h * d; }
  float get(int64_t i) const { return read_as_f32(bytes.data(), dtype, size_t(i)); }
  void set(int64_t i, float v) { write_from_f32(bytes.data(), dtype, size_t(i), v); }
  TensorView view() const {
    return TensorView(const_cast<uint8_t*>(bytes.data()), dtype, {n, h, d});
  }
};

HostT random_host(int64_t n, int64_t h, int64_t d, DType t, std::mt19937_64& rng) {
  HostT x(n, h, d, t);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, u(rng));
  return x;
}

struct DevT {
  platform::DeviceBuffer buf;
  DType dtype = DType::kF32;
  int64_t n = 0, h = 0, d = 0;
  Device device;
  /// The first `rows` token rows (all when rows < 0).
  TensorView view(int64_t rows = -1) const {
    return TensorView(buf.get(), dtype, {rows < 0 ? n : rows, h, d}, device);
  }
  size_t bytes() const { return size_t(n * h * d) * dtype_size(dtype); }
};

DevT alloc_dev(int64_t n, int64_t h, int64_t d, DType t, platform::Allocator& a) {
  DevT x;
  x.dtype = t;
  x.n = n;
  x.h = h;
  x.d = d;
  x.device = a.device();
  x.buf = platform::make_buffer(a, std::max<size_t>(x.bytes(), 16));
  return x;
}

/// Host copy of the first `rows` rows of a device tensor.
HostT download(const DevT& src, int64_t rows, platform::Allocator& a) {
  HostT x(rows, src.h, src.d, src.dtype);
  a.copy_to_host(x.bytes.data(), src.buf.get(), x.bytes.size());
  return x;
}

/// Elements of `got` (first `rows` rows) that are non-finite or outside atol + rtol * |ref|.
int64_t count_bad(const HostT& got, const HostT& ref, int64_t rows, double atol, double rtol,
                  std::string& first, double& max_err) {
  int64_t bad = 0;
  const int64_t per_row = got.h * got.d;
  for (int64_t i = 0; i < rows * per_row; ++i) {
    const double a = got.get(i), e = ref.get(i);
    const double err = std::fabs(a - e);
    if (std::isfinite(a)) max_err = std::max(max_err, err);
    if (std::isfinite(a) && std::isfinite(e) && err <= atol + rtol * std::fabs(e)) continue;
    if (bad++ == 0) {
      first = "token " + std::to_string(i / per_row) + " head " + std::to_string((i / got.d) % got.h) +
              " dim " + std::to_string(i % got.d) + ": " + std::to_string(a) + " expected " +
              std::to_string(e);
    }
  }
  return bad;
}

#define EXPECT_CLOSE(got, ref, rows, atol, rtol)                                              \
  do {                                                                                        \
    std::string first_;                                                                       \
    double max_err_ = 0;                                                                      \
    const int64_t bad_ = count_bad(got, ref, rows, atol, rtol, first_, max_err_);             \
    EXPECT_EQ(bad_, 0) << "of " << (rows) * (got).h * (got).d << " outputs; first " << first_ \
                       << "; max |err| " << max_err_;                                         \
  } while (0)

// ---- the rig: a host pool (reference) and device pools holding the same bytes ----

struct Shape {
  int page_size = 16;
  int hq = 8, hkv = 2, d = 128;
  DType q_dtype = DType::kBF16, kv_dtype = DType::kBF16;
  float k_scale = 1.f, v_scale = 1.f;
};

constexpr int kLayers = 2;

struct Req {
  int prefix = 0;
  int ext = 1;
};

class Rig {
 public:
  Rig(const Shape& s, int num_pages, int max_reqs, int max_ctx, int num_dev_pools, uint64_t seed)
      : s_(s), rng_(seed), table_(max_reqs, max_ctx), num_pages_(num_pages) {
    cpu_ = platform::make_cpu_platform();
    gpu_ = platform::make_cuda_platform();
    const kv::KvPoolConfig cfg{.layout = kv::KvLayout::kMha,
                               .num_layers = kLayers,
                               .num_pages = num_pages,
                               .page_size = s.page_size,
                               .dtype = s.kv_dtype,
                               .num_kv_heads = s.hkv,
                               .head_dim = s.d,
                               .head_dim_v = s.d};
    host_ = std::make_unique<kv::KvPool>(cfg, cpu_->allocator());
    for (int i = 0; i < num_dev_pools; ++i) {
      dev_.push_back(std::make_unique<kv::KvPool>(cfg, gpu_->allocator()));
    }
    for (int l = 0; l < kLayers; ++l) {
      host_->set_scales(LayerId(l), s.k_scale, s.v_scale);
      for (auto& p : dev_) p->set_scales(LayerId(l), s.k_scale, s.v_scale);
      layers_.push_back(AttentionLayer{.layer_id = LayerId(l),
                                       .num_q_heads = s.hq,
                                       .num_kv_heads = s.hkv,
                                       .head_dim_qk = s.d,
                                       .head_dim_v = s.d,
                                       .scaling = 1.f / std::sqrt(float(s.d)),
                                       .k_scale = s.k_scale,
                                       .v_scale = s.v_scale});
    }
  }

  const Shape& shape() const { return s_; }
  std::mt19937_64& rng() { return rng_; }
  platform::Platform& cpu() { return *cpu_; }
  platform::Platform& gpu() { return *gpu_; }
  platform::Allocator& dev_alloc() { return gpu_->allocator(); }
  kv::KvPool& host_pool() { return *host_; }
  kv::KvPool& dev_pool(int i) { return *dev_[size_t(i)]; }
  kv::ReqToTokenTable& table() { return table_; }
  const AttentionLayer& layer(int l) const { return layers_[size_t(l)]; }

  /// New requests (the previous ones are freed): NaN everywhere in the host pool, random cached
  /// prefixes in every layer on permuted pages, the table rows written for prefix + ext tokens,
  /// and every device pool overwritten with the host pool's bytes. Returns the unpadded batch
  /// (kDecode: every ext must be 1).
  ForwardBatch new_step(ForwardMode mode, const std::vector<Req>& reqs) {
    for (ReqSlot r : rows_) table_.free(r);
    rows_.clear();
    host_->fill(kNaN);
    std::vector<int32_t> pages(static_cast<size_t>(num_pages_));
    std::iota(pages.begin(), pages.end(), 1);
    std::shuffle(pages.begin(), pages.end(), rng_);
    size_t next = 0;
    ForwardBatch b;
    b.mode = mode;
    b.batch_size = static_cast<int>(reqs.size());
    std::vector<SlotIndex> cached;
    for (const Req& q : reqs) {
      const ReqSlot row = *table_.alloc();
      rows_.push_back(row);
      std::vector<SlotIndex> slots;
      int32_t page = 0;
      for (int i = 0; i < q.prefix + q.ext; ++i) {
        if (i % s_.page_size == 0) page = pages.at(next++);
        slots.push_back(page * s_.page_size + i % s_.page_size);
      }
      table_.write(row, 0, slots);
      cached.insert(cached.end(), slots.begin(), slots.begin() + q.prefix);
      b.req_pool_indices.push_back(row.value());
      b.seq_lens.push_back(q.prefix + q.ext);
      if (mode != ForwardMode::kDecode) {
        b.extend_prefix_lens.push_back(q.prefix);
        b.extend_seq_lens.push_back(q.ext);
      }
      for (int i = 0; i < q.ext; ++i) {
        b.out_cache_loc.push_back(slots[size_t(q.prefix + i)]);
        b.positions.push_back(q.prefix + i);
      }
    }
    const auto n = static_cast<int64_t>(cached.size());
    for (int l = 0; l < kLayers && n > 0; ++l) {
      const HostT k = random_host(n, s_.hkv, s_.d, DType::kF32, rng_);
      const HostT v = random_host(n, s_.hkv, s_.d, DType::kF32, rng_);
      host_->set_kv(LayerId(l), cached, k.view(), v.view());
    }
    for (size_t i = 0; i < dev_.size(); ++i) sync_device_pool(static_cast<int>(i));
    return b;
  }

  /// Overwrites device pool i with the host pool's bytes.
  void sync_device_pool(int i) {
    const size_t elem = dtype_size(s_.kv_dtype);
    const auto k_bytes = size_t(host_->num_slots() * host_->k_row_elems()) * elem;
    const auto v_bytes = size_t(host_->num_slots() * host_->v_row_elems()) * elem;
    for (int l = 0; l < kLayers; ++l) {
      dev_alloc().copy_to_device(dev_pool(i).k_view(LayerId(l)).data(),
                                 host_->k_view(LayerId(l)).data(), k_bytes);
      dev_alloc().copy_to_device(dev_pool(i).v_view(LayerId(l)).data(),
                                 host_->v_view(LayerId(l)).data(), v_bytes);
    }
    gpu_->synchronize();
  }

  /// Elements of device pool i (slots >= first_slot) that differ from the host pool: both NaN,
  /// or |a - b| <= rel * max(|a|, |b|) count as equal.
  int64_t pool_mismatches(int i, int64_t first_slot, double rel, std::string& first) {
    int64_t bad = 0;
    const size_t elem = dtype_size(s_.kv_dtype);
    const int64_t row = host_->k_row_elems();  // == v_row (head_dim_v == head_dim)
    std::vector<uint8_t> buf(size_t(host_->num_slots() * row) * elem);
    for (int l = 0; l < kLayers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        const TensorView hv = kv == 0 ? host_->k_view(LayerId(l)) : host_->v_view(LayerId(l));
        const TensorView dv = kv == 0 ? dev_pool(i).k_view(LayerId(l)) : dev_pool(i).v_view(LayerId(l));
        dev_alloc().copy_to_host(buf.data(), dv.data(), buf.size());
        for (int64_t e = first_slot * row; e < host_->num_slots() * row; ++e) {
          const float a = read_as_f32(buf.data(), s_.kv_dtype, size_t(e));
          const float h = read_as_f32(hv.data(), s_.kv_dtype, size_t(e));
          const bool same = (std::isnan(a) && std::isnan(h)) ||
                            std::fabs(a - h) <= rel * std::max(std::fabs(a), std::fabs(h));
          if (same) continue;
          if (bad++ == 0) {
            first = std::string(kv == 0 ? "K" : "V") + " layer " + std::to_string(l) + " slot " +
                    std::to_string(e / row) + " elem " + std::to_string(e % row) + ": device " +
                    std::to_string(a) + " host " + std::to_string(h);
          }
        }
      }
    }
    return bad;
  }

 private:
  Shape s_;
  std::mt19937_64 rng_;
  std::unique_ptr<platform::Platform> cpu_, gpu_;
  std::unique_ptr<kv::KvPool> host_;
  std::vector<std::unique_ptr<kv::KvPool>> dev_;
  kv::ReqToTokenTable table_;
  int num_pages_;
  std::vector<ReqSlot> rows_;
  std::vector<AttentionLayer> layers_;
};

/// Per-layer inputs of one step: q of layer 0, k / v of every layer (layer 1's q is layer 0's out).
struct StepInputs {
  HostT q0;
  HostT k[kLayers], v[kLayers];
};

StepInputs random_inputs(Rig& rig, int64_t n) {
  const Shape& s = rig.shape();
  StepInputs in;
  in.q0 = random_host(n, s.hq, s.d, s.q_dtype, rig.rng());
  for (int l = 0; l < kLayers; ++l) {
    in.k[l] = random_host(n, s.hkv, s.d, s.q_dtype, rig.rng());
    in.v[l] = random_host(n, s.hkv, s.d, s.q_dtype, rig.rng());
  }
  return in;
}

/// The reference on the host pool: outputs of both layers (mutates the host pool: new K/V).
std::vector<HostT> run_reference(Rig& rig, const ForwardBatch& b, const StepInputs& in) {
  const Shape& s = rig.shape();
  BackendContext ctx{.platform = &rig.cpu(), .kv_pool = &rig.host_pool(), .req_to_token = &rig.table()};
  ReferenceBackend ref(ctx);
  ref.init_forward_metadata(b);
  std::vector<HostT> out;
  for (int l = 0; l < kLayers; ++l) {
    out.emplace_back(b.num_tokens(), s.hq, s.d, s.q_dtype);
    const HostT& q = l == 0 ? in.q0 : out[size_t(l - 1)];
    ref.forward(q.view(), in.k[l].view(), in.v[l].view(), rig.layer(l), b, out[size_t(l)].view());
  }
  return out;
}

/// Device copies of a step's inputs and NaN-poisoned outputs, `rows` rows each (>= tokens).
struct DevStep {
  DevT q0, k[kLayers], v[kLayers], out[kLayers];
};

DevStep alloc_step(Rig& rig, int64_t rows) {
  const Shape& s = rig.shape();
  auto& a = rig.dev_alloc();
  DevStep d;
  d.q0 = alloc_dev(rows, s.hq, s.d, s.q_dtype, a);
  for (int l = 0; l < kLayers; ++l) {
    d.k[l] = alloc_dev(rows, s.hkv, s.d, s.q_dtype, a);
    d.v[l] = alloc_dev(rows, s.hkv, s.d, s.q_dtype, a);
    d.out[l] = alloc_dev(rows, s.hq, s.d, s.q_dtype, a);
  }
  return d;
}

/// Copies the inputs into the first rows of `d` (rows beyond them are zeroed) and NaN-poisons
/// the outputs. Synchronous.
void load_step(Rig& rig, const StepInputs& in, DevStep& d) {
  auto& a = rig.dev_alloc();
  auto put = [&](const HostT& h, DevT& dst) {
    a.fill_bytes(dst.buf.get(), 0, dst.bytes());
    a.copy_to_device(dst.buf.get(), h.bytes.data(), h.bytes.size());
  };
  put(in.q0, d.q0);
  for (int l = 0; l < kLayers; ++l) {
    put(in.k[l], d.k[l]);
    put(in.v[l], d.v[l]);
    a.fill_bytes(d.out[l].buf.get(), 0xFF, d.out[l].bytes());  // NaN in f32 / f16 / bf16
  }
  rig.gpu().synchronize();
}

/// The 2-layer stack through `be` for `b` (b.num_tokens() rows of `d`).
void forward_stack(AttentionBackend& be, const ForwardBatch& b, const Rig& rig, DevStep& d) {
  const int64_t n = b.num_tokens();
  for (int l = 0; l < kLayers; ++l) {
    const TensorView q = l == 0 ? d.q0.view(n) : d.out[l - 1].view(n);
    be.forward(q, d.k[l].view(n), d.v[l].view(n), rig.layer(l), b, d.out[l].view(n));
  }
}

// ---- eager: CudaBackend vs ReferenceBackend ----

void check_eager(const Shape& s, ForwardMode mode, const std::vector<Req>& reqs, uint64_t seed,
                 double tol) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  int pages = 4, ctx = 8;
  for (const Req& r : reqs) {
    pages += (r.prefix + r.ext + s.page_size - 1) / s.page_size;
    ctx = std::max(ctx, r.prefix + r.ext + 8);
  }
  Rig rig(s, pages, static_cast<int>(reqs.size()) + 2, ctx, 1, seed);
  const ForwardBatch b = rig.new_step(mode, reqs);
  const StepInputs in = random_inputs(rig, b.num_tokens());
  DevStep d = alloc_step(rig, b.num_tokens());
  load_step(rig, in, d);
  {
    BackendContext ctx_dev{.platform = &rig.gpu(), .kv_pool = &rig.dev_pool(0), .req_to_token = &rig.table()};
    CudaBackend be(ctx_dev);
    be.init_forward_metadata(b);
    forward_stack(be, b, rig, d);
    rig.gpu().synchronize();
  }
  const std::vector<HostT> ref = run_reference(rig, b, in);
  for (int l = 0; l < kLayers; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const HostT got = download(d.out[l], b.num_tokens(), rig.dev_alloc());
    EXPECT_CLOSE(got, ref[size_t(l)], b.num_tokens(), tol, tol);
  }
  // The append kernel wrote exactly the step's slots (as the reference's set_kv did).
  std::string first;
  const double rel = dtype_is_fp8(s.kv_dtype) ? 0.13 : 0.0;
  EXPECT_EQ(rig.pool_mismatches(0, 0, rel, first), 0) << "pool differs after forward; first " << first;
}

TEST(CudaBackend, DecodeMatchesReference) {
  REQUIRE_GPU();
  Shape s;
  s.hq = 32;
  s.hkv = 8;
  std::vector<Req> reqs;
  std::mt19937 r(101);
  for (int b = 0; b < 6; ++b) reqs.push_back({static_cast<int>(r() % 700), 1});
  reqs[2].prefix = 3000;  // split-KV
  reqs[4].prefix = 0;     // only the new token
  check_eager(s, ForwardMode::kDecode, reqs, 101, 1.6e-2);
  s.page_size = 1;
  check_eager(s, ForwardMode::kDecode, reqs, 102, 1.6e-2);
}

TEST(CudaBackend, ExtendWithPrefixMatchesReference) {
  REQUIRE_GPU();
  Shape s;
  check_eager(s, ForwardMode::kExtend, {{0, 37}, {200, 64}, {13, 1}, {513, 100}}, 201, 1.6e-2);
  s.d = 64;
  s.hq = 16;
  s.hkv = 16;
  check_eager(s, ForwardMode::kExtend, {{31, 17}, {0, 129}, {1000, 5}}, 202, 1.6e-2);
  Shape m;
  check_eager(m, ForwardMode::kMixed, {{40, 20}, {300, 1}, {0, 9}, {77, 1}}, 203, 1.6e-2);
}

// Ragged attention (save_kv, gather_kv, forward_ragged: MLA's expanded prefill form at
// DeepSeek's 192 / 128, 16 heads) against the reference backend on the same step: the pools
// equal after save_kv, the gathered rows bit-equal, the ragged outputs within tolerance.
TEST(CudaBackend, RaggedMatchesReference) {
  REQUIRE_GPU();
  const uint64_t seed = 204;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Shape s;  // the pool: MHA, page 16, 8 / 2 heads of 128
  const std::vector<Req> reqs = {{0, 150}, {200, 37}, {41, 1}, {0, 3}};
  int pages = 4, ctx = 8;
  for (const Req& r : reqs) {
    pages += (r.prefix + r.ext + s.page_size - 1) / s.page_size;
    ctx = std::max(ctx, r.prefix + r.ext + 8);
  }
  Rig rig(s, pages, static_cast<int>(reqs.size()) + 2, ctx, 1, seed);
  const ForwardBatch b = rig.new_step(ForwardMode::kMixed, reqs);
  const int64_t t = b.num_tokens(), n = b.seq_lens_sum();
  const StepInputs in = random_inputs(rig, t);
  DevStep d = alloc_step(rig, t);
  load_step(rig, in, d);
  BackendContext ctx_dev{
      .platform = &rig.gpu(), .kv_pool = &rig.dev_pool(0), .req_to_token = &rig.table()};
  BackendContext ctx_host{
      .platform = &rig.cpu(), .kv_pool = &rig.host_pool(), .req_to_token = &rig.table()};
  CudaBackend be(ctx_dev);
  ReferenceBackend ref(ctx_host);
  ASSERT_TRUE(be.capabilities().ragged);
  be.init_forward_metadata(b);
  ref.init_forward_metadata(b);
  be.save_kv(d.k[1].view(t), d.v[1].view(t), rig.layer(1), b);
  ref.save_kv(in.k[1].view(), in.v[1].view(), rig.layer(1), b);
  rig.gpu().synchronize();
  std::string first;
  EXPECT_EQ(rig.pool_mismatches(0, 0, 0.0, first), 0) << "pool differs after save_kv; " << first;
  // gather_kv: the device rows equal the host backend's bit for bit (NaN-poisoned first).
  auto& a = rig.dev_alloc();
  DevT gk = alloc_dev(n, s.hkv, s.d, s.kv_dtype, a), gv = alloc_dev(n, s.hkv, s.d, s.kv_dtype, a);
  a.fill_bytes(gk.buf.get(), 0xFF, gk.bytes());
  a.fill_bytes(gv.buf.get(), 0xFF, gv.bytes());
  HostT hk(n, s.hkv, s.d, s.kv_dtype), hv(n, s.hkv, s.d, s.kv_dtype);
  be.gather_kv(rig.layer(1), b, {}, gk.view(), gv.view());
  ref.gather_kv(rig.layer(1), b, {}, hk.view(), hv.view());
  rig.gpu().synchronize();
  EXPECT_EQ(download(gk, n, a).bytes, hk.bytes) << "gathered K";
  EXPECT_EQ(download(gv, n, a).bytes, hv.bytes) << "gathered V";
  // forward_ragged at 192 / 128 over 16 heads (MHA): the sm90 prefill kernel on Hopper.
  const int hq = 16, dqk = 192, dv = 128;
  const HostT q = random_host(t, hq, dqk, DType::kBF16, rig.rng());
  const HostT k = random_host(n, hq, dqk, DType::kBF16, rig.rng());
  const HostT v = random_host(n, hq, dv, DType::kBF16, rig.rng());
  DevT dq = alloc_dev(t, hq, dqk, DType::kBF16, a), dk = alloc_dev(n, hq, dqk, DType::kBF16, a),
       dvv = alloc_dev(n, hq, dv, DType::kBF16, a), dout = alloc_dev(t, hq, dv, DType::kBF16, a);
  a.copy_to_device(dq.buf.get(), q.bytes.data(), q.bytes.size());
  a.copy_to_device(dk.buf.get(), k.bytes.data(), k.bytes.size());
  a.copy_to_device(dvv.buf.get(), v.bytes.data(), v.bytes.size());
  a.fill_bytes(dout.buf.get(), 0xFF, dout.bytes());
  const AttentionLayer layer{.layer_id = LayerId(1),
                             .num_q_heads = hq,
                             .num_kv_heads = hq,
                             .head_dim_qk = dqk,
                             .head_dim_v = dv,
                             .scaling = 1.f / std::sqrt(float(dqk))};
  HostT want(t, hq, dv, DType::kBF16);
  for (int round = 0; round < 2; ++round) {  // the second reuses the step's ragged plan
    be.forward_ragged(dq.view(), dk.view(), dvv.view(), layer, b, {}, dout.view(), {});
    rig.gpu().synchronize();
    if (round == 0) ref.forward_ragged(q.view(), k.view(), v.view(), layer, b, {}, want.view(), {});
    const HostT got = download(dout, t, a);
    EXPECT_CLOSE(got, want, t, 1.6e-2, 1.6e-2);
    a.fill_bytes(dout.buf.get(), 0xFF, dout.bytes());
  }
  // Key windows with the LSE, on both backends over the first m caller rows: prefix windows
  // (every query sees them; requests 0 and 3 see none: out 0, lse -inf), then the new tokens'
  // windows (causal within them).
  auto check_windows = [&](const std::vector<int32_t>& wb, const std::vector<int32_t>& we) {
    const attention::KeyWindows win{.begin = wb, .end = we};
    int64_t m = 0;
    for (size_t i = 0; i < wb.size(); ++i) m += we[i] - wb[i];
    SCOPED_TRACE(::testing::Message() << "windows of " << m << " keys");
    DevT glat = alloc_dev(m, s.hkv, s.d, s.kv_dtype, a),
         glv = alloc_dev(m, s.hkv, s.d, s.kv_dtype, a);
    HostT wk(m, s.hkv, s.d, s.kv_dtype), wv(m, s.hkv, s.d, s.kv_dtype);
    be.gather_kv(rig.layer(1), b, win, glat.view(), glv.view());
    ref.gather_kv(rig.layer(1), b, win, wk.view(), wv.view());
    rig.gpu().synchronize();
    EXPECT_EQ(download(glat, m, a).bytes, wk.bytes) << "window-gathered K";
    EXPECT_EQ(download(glv, m, a).bytes, wv.bytes) << "window-gathered V";
    platform::DeviceBuffer dlse = platform::make_buffer(a, size_t(t * hq) * 4);
    a.fill_bytes(dlse.get(), 0xFF, size_t(t * hq) * 4);
    a.fill_bytes(dout.buf.get(), 0xFF, dout.bytes());
    std::vector<float> want_lse(size_t(t * hq));
    be.forward_ragged(dq.view(), dk.view(m), dvv.view(m), layer, b, win, dout.view(),
                      TensorView(dlse.get(), DType::kF32, {t, hq}, Device::cuda(0)));
    ref.forward_ragged(q.view(), k.view().slice0(0, m), v.view().slice0(0, m), layer, b, win,
                       want.view(), TensorView(want_lse.data(), DType::kF32, {t, hq}));
    rig.gpu().synchronize();
    EXPECT_CLOSE(download(dout, t, a), want, t, 1.6e-2, 1.6e-2);
    std::vector<float> got_lse(size_t(t * hq));
    a.copy_to_host(got_lse.data(), dlse.get(), got_lse.size() * 4);
    for (size_t i = 0; i < got_lse.size(); ++i) {
      if (std::isinf(want_lse[i])) {
        EXPECT_EQ(got_lse[i], want_lse[i]) << "lse " << i;
      } else {
        EXPECT_NEAR(got_lse[i], want_lse[i], 1e-2 * (1 + std::fabs(want_lse[i]))) << "lse " << i;
      }
    }
  };
  check_windows({0, 50, 7, 0}, {0, 170, 30, 0});
  check_windows({0, 200, 41, 0}, {150, 237, 42, 3});
}

TEST(CudaBackend, Fp8WithScalesMatchesReference) {
  REQUIRE_GPU();
  Shape s;
  s.hq = 32;
  s.hkv = 8;
  s.kv_dtype = DType::kFp8E4M3;
  s.k_scale = 0.5f;
  s.v_scale = 2.f;
  std::vector<Req> dec;
  std::mt19937 r(301);
  for (int b = 0; b < 5; ++b) dec.push_back({static_cast<int>(r() % 1500), 1});
  check_eager(s, ForwardMode::kDecode, dec, 301, 3e-2);
  s.hq = 8;
  s.hkv = 2;
  check_eager(s, ForwardMode::kExtend, {{100, 50}, {0, 20}, {700, 3}}, 302, 3e-2);
}

// ---- CUDA graphs through the backend hooks ----

ForwardBatch empty_decode() {
  ForwardBatch b;
  b.mode = ForwardMode::kDecode;
  return b;
}

/// `real` padded to `bucket` requests as the graph runner does: row 0, seq_len `fill`, slot 0.
ForwardBatch pad_to(const ForwardBatch& real, int bucket, int fill) {
  ForwardBatch p = real;
  p.batch_size = bucket;
  for (int b = real.batch_size; b < bucket; ++b) {
    p.req_pool_indices.push_back(0);
    p.seq_lens.push_back(fill);
    p.positions.push_back(0);
    p.out_cache_loc.push_back(0);
  }
  return p;
}

/// Plans the capture of `b` and captures the 2-layer stack on the backend's stream into
/// `graph` / `exec` (gtest failures on error; callers check HasFatalFailure()).
void capture_stack(CudaBackend& be, const ForwardBatch& b, const Rig& rig, DevStep& d,
                   cudaGraph_t& graph, cudaGraphExec_t& exec) {
  be.init_forward_metadata_capture_cuda_graph(b);
  cudaStream_t stream = be.stream();
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  bool captured = true;
  try {
    forward_stack(be, b, rig, d);
  } catch (const Error& err) {
    ADD_FAILURE() << "forward during capture threw: " << err.what();
    captured = false;
  }
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(captured);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
}

TEST(CudaBackendGraph, CaptureNeedsEagerForwardFirst) {
  REQUIRE_GPU();
  Shape s;
  Rig rig(s, 8, 4, 64, 1, 5);
  BackendContext ctx{.platform = &rig.gpu(), .kv_pool = &rig.dev_pool(0), .req_to_token = &rig.table()};
  CudaBackend be(ctx);
  be.init_cuda_graph_state(2, 2);
  const ForwardBatch dummy = pad_to(empty_decode(), 2,
                                    be.cuda_graph_seq_len_fill_value());
  EXPECT_THROW(be.init_forward_metadata_capture_cuda_graph(dummy), Error);
}

TEST(CudaBackendGraph, TwoLayerStackReplayEqualsEager) {
  REQUIRE_GPU();
  const uint64_t seed = 401;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Shape s;
  s.hq = 32;
  s.hkv = 8;
  constexpr int kBucket = 8, kMaxLen = 4000;
  const int pages = kBucket * (kMaxLen / s.page_size + 2) + 4;
  // Pool 0: the graph backend; pool 1: the eager backend (same bytes before each step).
  Rig rig(s, pages, 2 * kBucket, kMaxLen + 8, 2, seed);
  BackendContext gctx{.platform = &rig.gpu(), .kv_pool = &rig.dev_pool(0), .req_to_token = &rig.table()};
  BackendContext ectx{.platform = &rig.gpu(), .kv_pool = &rig.dev_pool(1), .req_to_token = &rig.table()};
  CudaBackend graph_be(gctx), eager_be(ectx);
  DevStep g = alloc_step(rig, kBucket), e = alloc_step(rig, kBucket);
  auto rand_reqs = [&](int bs, int longest) {
    std::vector<Req> reqs;
    for (int b = 0; b < bs; ++b) {
      reqs.push_back({1 + static_cast<int>(rig.rng()() % 1200), 1});
    }
    reqs[size_t(bs / 2)].prefix = longest;
    return reqs;
  };

  // One eager step first (the backend learns the layer shape), then capture with the dummy batch.
  {
    const ForwardBatch warm = rig.new_step(ForwardMode::kDecode, rand_reqs(kBucket, 500));
    load_step(rig, random_inputs(rig, kBucket), g);
    graph_be.init_forward_metadata(warm);
    forward_stack(graph_be, warm, rig, g);
    rig.gpu().synchronize();
  }
  graph_be.init_cuda_graph_state(kBucket, kBucket);
  const int fill = graph_be.cuda_graph_seq_len_fill_value();
  const ForwardBatch dummy = pad_to(empty_decode(), kBucket, fill);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  capture_stack(graph_be, dummy, rig, g, graph, exec);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  cudaStream_t stream = graph_be.stream();

  struct Trial {
    int bs;
    int longest;
  };
  bool all_bit_identical_padded = true, all_bit_identical_unpadded = true;
  double worst_unpadded = 0;
  for (const Trial t : {Trial{3, 3500}, Trial{8, 900}, Trial{5, kMaxLen - 1}, Trial{1, 40},
                        Trial{8, 2600}}) {
    SCOPED_TRACE("replay bs " + std::to_string(t.bs) + " longest " + std::to_string(t.longest));
    const ForwardBatch real = rig.new_step(ForwardMode::kDecode, rand_reqs(t.bs, t.longest));
    const ForwardBatch padded = pad_to(real, kBucket, fill);
    const StepInputs in = random_inputs(rig, t.bs);

    // Graph: rewrite the persistent buffers, replay.
    load_step(rig, in, g);
    graph_be.init_forward_metadata_replay_cuda_graph(padded);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    HostT gout[kLayers];
    for (int l = 0; l < kLayers; ++l) gout[l] = download(g.out[l], t.bs, rig.dev_alloc());

    // Eager, same padded batch (same schedule): must be bit-identical.
    load_step(rig, in, e);
    eager_be.init_forward_metadata(padded);
    forward_stack(eager_be, padded, rig, e);
    rig.gpu().synchronize();
    for (int l = 0; l < kLayers; ++l) {
      const HostT eo = download(e.out[l], t.bs, rig.dev_alloc());
      const bool same = std::memcmp(eo.bytes.data(), gout[l].bytes.data(), eo.bytes.size()) == 0;
      all_bit_identical_padded = all_bit_identical_padded && same;
      EXPECT_TRUE(same) << "layer " << l << ": replay differs from eager on the same padded batch";
      EXPECT_CLOSE(gout[l], eo, t.bs, 1.6e-2, 1.6e-2);
    }

    // Eager, unpadded batch (its own split schedule): equal within rounding.
    rig.sync_device_pool(1);
    load_step(rig, in, e);
    eager_be.init_forward_metadata(real);
    forward_stack(eager_be, real, rig, e);
    rig.gpu().synchronize();
    for (int l = 0; l < kLayers; ++l) {
      const HostT eo = download(e.out[l], t.bs, rig.dev_alloc());
      if (std::memcmp(eo.bytes.data(), gout[l].bytes.data(), eo.bytes.size()) != 0) {
        all_bit_identical_unpadded = false;
      }
      std::string first;
      double max_err = 0;
      EXPECT_EQ(count_bad(gout[l], eo, t.bs, 1.6e-2, 1.6e-2, first, max_err), 0)
          << "layer " << l << " vs unpadded eager; first " << first;
      worst_unpadded = std::max(worst_unpadded, max_err);
    }

    // The reference on the host (mutates the host pool with the real rows' K/V).
    const std::vector<HostT> ref = run_reference(rig, real, in);
    for (int l = 0; l < kLayers; ++l) {
      SCOPED_TRACE("vs reference, layer " + std::to_string(l));
      EXPECT_CLOSE(gout[l], ref[size_t(l)], t.bs, 3e-2, 3e-2);
    }
    // The replayed append wrote the real rows' K/V; slot 0 (page 0) took the padding's writes.
    std::string first;
    EXPECT_EQ(rig.pool_mismatches(0, s.page_size, 0.0, first), 0)
        << "graph pool differs from the reference pool after replay; first " << first;
  }
  std::printf("[ graph    ] replay vs eager(same padded batch): %s; replay vs eager(unpadded "
              "batch): %s (max |diff| %.3g)\n",
              all_bit_identical_padded ? "bit-identical" : "NOT bit-identical",
              all_bit_identical_unpadded ? "bit-identical" : "within rounding", worst_unpadded);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// ---- a draft-extend CUDA graph: one capture, replays with any accepted counts ----

/// A kDraftExtend `real` padded to `bucket` requests: row 0, prefix fill - 1, one token, slot 0.
ForwardBatch pad_draft_extend(const ForwardBatch& real, int bucket, int fill) {
  ForwardBatch p = real;
  p.batch_size = bucket;
  for (int b = real.batch_size; b < bucket; ++b) {
    p.req_pool_indices.push_back(0);
    p.seq_lens.push_back(fill);
    p.extend_prefix_lens.push_back(fill - 1);
    p.extend_seq_lens.push_back(1);
    p.positions.push_back(fill - 1);
    p.out_cache_loc.push_back(0);
  }
  return p;
}

/// Captured for 4 requests × 4 tokens (num_steps 3, every draft accepted), replayed with ragged
/// accepted counts, fewer requests (padded) and all ones (a batch the eager schedule runs on the
/// decode kernel, split-KV over the long prefixes): the graph keeps the prefill kernel and must
/// match eager execution of the unpadded batch and the reference, and write exactly the real
/// tokens' K/V (the captured append's spare rows go to slot 0, page 0).
TEST(CudaBackendGraph, DraftExtendReplayWithAnyAcceptedCounts) {
  REQUIRE_GPU();
  const uint64_t seed = 411;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Shape s;
  s.hq = 32;
  s.hkv = 8;
  constexpr int kBucket = 4, kSteps = 3, kTokens = kBucket * (kSteps + 1), kMaxLen = 1500;
  const int pages = kBucket * (kMaxLen / s.page_size + 2) + 4;
  Rig rig(s, pages, 2 * kBucket, kMaxLen + 8, 2, seed);
  BackendContext gctx{.platform = &rig.gpu(), .kv_pool = &rig.dev_pool(0), .req_to_token = &rig.table()};
  BackendContext ectx{.platform = &rig.gpu(), .kv_pool = &rig.dev_pool(1), .req_to_token = &rig.table()};
  CudaBackend graph_be(gctx), eager_be(ectx);
  DevStep g = alloc_step(rig, kTokens), e = alloc_step(rig, kTokens);
  auto reqs_with = [&](const std::vector<int>& accepted) {
    std::vector<Req> reqs;
    for (int a : accepted) reqs.push_back({300 + static_cast<int>(rig.rng()() % 1100), a});
    return reqs;
  };
  {
    const ForwardBatch warm = rig.new_step(ForwardMode::kDraftExtend, reqs_with({4, 1, 2, 3}));
    load_step(rig, random_inputs(rig, warm.num_tokens()), g);
    graph_be.init_forward_metadata(warm);
    forward_stack(graph_be, warm, rig, g);
    rig.gpu().synchronize();
  }
  graph_be.init_cuda_graph_state(kBucket, kTokens);
  const ForwardBatch full = rig.new_step(ForwardMode::kDraftExtend, reqs_with({4, 4, 4, 4}));
  ASSERT_EQ(full.num_tokens(), kTokens);
  load_step(rig, random_inputs(rig, kTokens), g);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  capture_stack(graph_be, full, rig, g, graph, exec);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  cudaStream_t stream = graph_be.stream();

  const int fill = graph_be.cuda_graph_seq_len_fill_value();
  const std::vector<std::vector<int>> trials = {
      {1, 1, 1, 1}, {4, 1, 3}, {2, 4, 1, 4}, {1}, {3, 3}, {4, 4, 4, 4}};
  for (const auto& accepted : trials) {
    std::string name;
    for (int a : accepted) name += std::to_string(a) + " ";
    SCOPED_TRACE("replay accepted " + name);
    const ForwardBatch real = rig.new_step(ForwardMode::kDraftExtend, reqs_with(accepted));
    const ForwardBatch padded = pad_draft_extend(real, kBucket, fill);
    const int n = real.num_tokens();
    const StepInputs in = random_inputs(rig, n);

    load_step(rig, in, g);
    graph_be.init_forward_metadata_replay_cuda_graph(padded);
    EXPECT_EQ(graph_be.batch_attention().path(), pagoda::backends::cuda::KernelPath::kPrefill);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    HostT gout[kLayers];
    for (int l = 0; l < kLayers; ++l) gout[l] = download(g.out[l], n, rig.dev_alloc());

    load_step(rig, in, e);
    eager_be.init_forward_metadata(real);
    forward_stack(eager_be, real, rig, e);
    rig.gpu().synchronize();
    if (accepted == std::vector<int>{1, 1, 1, 1}) {
      EXPECT_EQ(eager_be.batch_attention().path(), pagoda::backends::cuda::KernelPath::kDecode)
          << "all-ones draft extend should run the decode kernel eagerly";
    }
    for (int l = 0; l < kLayers; ++l) {
      SCOPED_TRACE("vs eager, layer " + std::to_string(l));
      const HostT eo = download(e.out[l], n, rig.dev_alloc());
      EXPECT_CLOSE(gout[l], eo, n, 1.6e-2, 1.6e-2);
    }
    const std::vector<HostT> ref = run_reference(rig, real, in);
    for (int l = 0; l < kLayers; ++l) {
      SCOPED_TRACE("vs reference, layer " + std::to_string(l));
      EXPECT_CLOSE(gout[l], ref[size_t(l)], n, 3e-2, 3e-2);
    }
    std::string first;
    EXPECT_EQ(rig.pool_mismatches(0, s.page_size, 0.0, first), 0)
        << "graph pool differs from the reference pool after replay; first " << first;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace
}  // namespace pagoda::cuda_test
