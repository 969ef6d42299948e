/// CUDA BatchAttention vs an fp64 host reference on random problems (NaN-poisoned unused slots
/// and outputs, permuted pages), plus CUDA-graph capture/replay == eager. Label "gpu": needs a GPU.

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include "cuda_test_util.h"
#include "gpu_test_common.h"
#include "pagoda/backends/cuda/cuda_batch_attention.h"
#include "pagoda/kernels/cuda/launch.h"

namespace pagoda::cuda_test {
namespace {

using backends::cuda::CudaBatchAttention;

/// The kernel options every CudaBatchAttention of this file is built with: a test sets fields to
/// reach a variant and resets them (kernel_options = {}) when done.
backends::KernelOptions kernel_options;

struct Dev {
  void* p = nullptr;
  explicit Dev(size_t n) { EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 16)), cudaSuccess); }
  ~Dev() { cudaFree(p); }
};

struct Result {
  double rel_err = 0, lse_err = 0;
  bool all_finite = true;
  bool outside_poisoned = true;  // no byte of the output buffer outside the view was written
  std::string path;
  int split_chunk = 0;
  bool sm90 = false;  ///< the plan's items were made for the sm90 kernel
};

/// `tweak` may edit the host data (e.g. the custom mask) before upload and the reference.
Result run_problem(const Problem& p, const std::function<void(HostData&)>& tweak = {}) {
  HostData h = make_host_data(p);
  if (tweak) tweak(h);
  const DType out_dtype = p.q_dtype;
  const int hkv = p.mla ? 1 : p.hkv;
  Dev q(h.q.size()), k(h.k.size()), v(h.v.size());
  const size_t out_bytes = size_t(h.nnz) * p.hq * p.dv * dtype_size(out_dtype);
  // The output buffer: rows of hq heads of dv + out_pad_h elements, out_offset elements in.
  const int64_t o_sh = p.dv + p.out_pad_h, o_sn = int64_t(p.hq) * o_sh;
  const size_t buf_bytes = (size_t(h.nnz) * o_sn + p.out_offset) * dtype_size(out_dtype);
  Dev out(buf_bytes), lse(size_t(h.nnz) * p.hq * 4);
  cudaMemcpy(q.p, h.q.data(), h.q.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(k.p, h.k.data(), h.k.size(), cudaMemcpyHostToDevice);
  if (!h.v.empty()) cudaMemcpy(v.p, h.v.data(), h.v.size(), cudaMemcpyHostToDevice);
  cudaMemset(out.p, 0xFF, buf_bytes);  // NaN poison
  cudaMemset(lse.p, 0xFF, size_t(h.nnz) * p.hq * 4);
  const Device dev = Device::cuda(0);
  TensorView qv(q.p, p.q_dtype, {h.nnz, p.hq, p.dqk}, dev);
  TensorView kc(k.p, p.kv_dtype, {h.num_pages, p.page_size, hkv, p.dqk}, dev);
  TensorView vc = p.mla ? TensorView(k.p, p.kv_dtype, {h.num_pages, p.page_size, 1, p.dv},
                                     {int64_t(p.page_size) * p.dqk, p.dqk, p.dqk, 1}, dev)
                        : TensorView(v.p, p.kv_dtype, {h.num_pages, p.page_size, hkv, p.dv}, dev);
  TensorView ov(static_cast<uint8_t*>(out.p) + size_t(p.out_offset) * dtype_size(out_dtype),
                out_dtype, {h.nnz, p.hq, p.dv}, {o_sn, o_sh, 1}, dev);
  TensorView lv(lse.p, DType::kF32, {h.nnz, p.hq}, dev);
  CudaBatchAttention attn(nullptr, kernel_options);
  attention::AttentionShape shape{.num_qo_heads = p.hq, .num_kv_heads = hkv, .head_dim_qk = p.dqk,
                                  .head_dim_v = p.dv, .q_dtype = p.q_dtype,
                                  .kv_dtype = p.kv_dtype, .out_dtype = out_dtype};
  attn.plan(h.input(p.page_size), shape);
  attn.run(qv, kc, vc, ov, lv, p.params);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> buf(buf_bytes), ob(out_bytes);
  std::vector<float> lb(size_t(h.nnz) * p.hq);
  cudaMemcpy(buf.data(), out.p, buf_bytes, cudaMemcpyDeviceToHost);
  // The view's rows into ob (dense [nnz][hq][dv]); every byte outside them must still be the
  // poison (a kernel that writes past a row or into the padding fails here).
  const size_t es = dtype_size(out_dtype);
  std::vector<uint8_t> in_view(buf_bytes, 0);
  for (int n = 0; n < h.nnz; ++n) {
    for (int hh = 0; hh < p.hq; ++hh) {
      const size_t src = (size_t(p.out_offset) + size_t(n) * o_sn + size_t(hh) * o_sh) * es;
      const size_t dst = (size_t(n) * p.hq + hh) * p.dv * es;
      std::memcpy(ob.data() + dst, buf.data() + src, p.dv * es);
      std::memset(in_view.data() + src, 1, p.dv * es);
    }
  }
  bool outside_poisoned = true;
  for (size_t i = 0; i < buf_bytes; ++i) {
    if (!in_view[i] && buf[i] != 0xFF) outside_poisoned = false;
  }
  cudaMemcpy(lb.data(), lse.p, lb.size() * 4, cudaMemcpyDeviceToHost);
  std::vector<float> ref, ref_lse;
  reference(p, h, ref, ref_lse);
  Result r;
  r.outside_poisoned = outside_poisoned;
  r.path = std::string(kernel_path_name(attn.run_path()));  // after run()'s layout fallback
  r.split_chunk = attn.split_chunk();
  r.sm90 = attn.schedule().sm90_prefill;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const float x = read_as_f32(ob.data(), out_dtype, i);
    if (!std::isfinite(x)) r.all_finite = false;
    num += (double(x) - ref[i]) * (double(x) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  r.rel_err = std::sqrt(num / std::max(den, 1e-30));
  for (size_t i = 0; i < ref_lse.size(); ++i) {
    if (std::isinf(ref_lse[i])) {
      if (!(std::isinf(lb[i]) && lb[i] < 0)) r.lse_err = 1e9;
    } else {
      r.lse_err = std::max(r.lse_err, std::abs(double(lb[i]) - ref_lse[i]) / std::max(1.0, std::abs(double(ref_lse[i]))));
    }
  }
  return r;
}

/// Runs p and checks the output (finite, nothing written outside the view, within tol of the
/// reference, LSE) and the kernel path when named; returns the result for further checks.
Result expect_ok(const Problem& p, double tol, const char* want_path = nullptr,
                 const std::function<void(HostData&)>& tweak = {}) {
  const Result r = run_problem(p, tweak);
  EXPECT_TRUE(r.all_finite) << "path " << r.path << " seed " << p.seed;
  EXPECT_TRUE(r.outside_poisoned) << "path " << r.path << " seed " << p.seed;
  EXPECT_LT(r.rel_err, tol) << "path " << r.path << " seed " << p.seed;
  EXPECT_LT(r.lse_err, 1e-2) << "path " << r.path << " seed " << p.seed;
  if (want_path) {
    EXPECT_EQ(r.path, want_path);
  }
  return r;
}

Problem decode_problem(int bs, int max_len, int ps, DType kv, int d, uint64_t seed) {
  Problem p;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (int b = 0; b < bs; ++b) {
    p.qo_lens.push_back(1);
    p.kv_lens.push_back(1 + static_cast<int>(rng() % max_len));
  }
  p.page_size = ps;
  p.hq = 32;
  p.hkv = 8;
  p.dqk = p.dv = d;
  p.kv_dtype = kv;
  p.params.sm_scale = 1.f / std::sqrt(float(d));
  p.seed = seed;
  return p;
}

#define REQUIRE_GPU() PAGODA_REQUIRE_GPU()

TEST(CudaDecode, Bf16Page16Skewed) {
  REQUIRE_GPU();
  Problem p = decode_problem(7, 3000, 16, DType::kBF16, 128, 1);
  p.kv_lens[0] = 9000;  // forces split-KV
  expect_ok(p, 2e-2, "decode");
}
TEST(CudaDecode, MergeBlockSizes) {
  // The split-KV merge at every block shape it can take (merge_threads forces one; the
  // launcher sizes it by D and the mean partials per row): at D 128 (32 float4 column groups)
  // 32 threads is one subset of the partials, 160 five with none idle, 128 / 256 / 512 four, eight
  // and sixteen; at D 64 and 256 the same block sizes split differently. One request of each
  // batch is long enough to be split into several chunks, the others are not.
  REQUIRE_GPU();
  for (const char* t : {"32", "128", "160", "256", "384", "512"}) {
    kernel_options.cuda.merge_threads = std::atoi(t);
    for (int d : {64, 128, 256}) {
      SCOPED_TRACE(::testing::Message() << "merge_threads=" << t << " D " << d);
      Problem p = decode_problem(5, 2000, 16, DType::kBF16, d, 40 + uint64_t(d));
      p.kv_lens[1] = 20000;  // many chunks (partials) for one row, a few for the rest
      EXPECT_GT(expect_ok(p, 2e-2, "decode").split_chunk, 0);
    }
  }
  kernel_options = {};
}
TEST(CudaDecode, Page1AndHeadDims) {
  REQUIRE_GPU();
  expect_ok(decode_problem(5, 700, 1, DType::kBF16, 128, 2), 2e-2, "decode");
  expect_ok(decode_problem(5, 700, 16, DType::kBF16, 64, 3), 2e-2, "decode");
  expect_ok(decode_problem(5, 700, 16, DType::kBF16, 256, 4), 2e-2, "decode");
  Problem f16 = decode_problem(4, 500, 8, DType::kF16, 128, 5);
  f16.q_dtype = DType::kF16;
  expect_ok(f16, 2e-2, "decode");
}
TEST(CudaDecode, Fp8WithScalesCapSinksWindow) {
  REQUIRE_GPU();
  Problem p = decode_problem(6, 2000, 16, DType::kFp8E4M3, 128, 6);
  p.params.k_scale = 0.5f;
  p.params.v_scale = 2.f;
  expect_ok(p, 3e-2, "decode");
  std::vector<float> sinks(32);
  for (int i = 0; i < 32; ++i) sinks[i] = 0.1f * i - 1.f;
  Problem q = decode_problem(6, 2000, 16, DType::kBF16, 128, 7);
  q.params.logit_cap = 30.f;
  q.params.sinks = sinks;
  q.params.window_left = 100;
  q.kv_lens[1] = 6000;
  expect_ok(q, 2e-2, "decode");
  Problem e5 = decode_problem(3, 300, 16, DType::kFp8E5M2, 128, 8);
  expect_ok(e5, 5e-2, "generic");
}
TEST(CudaDecode, GroupSizes) {
  REQUIRE_GPU();
  Problem mqa = decode_problem(3, 900, 16, DType::kBF16, 128, 9);
  mqa.hq = 16;
  mqa.hkv = 1;  // 2 blocks per kv head in z
  expect_ok(mqa, 2e-2, "decode");
  Problem mha = decode_problem(3, 900, 16, DType::kBF16, 128, 10);
  mha.hq = mha.hkv = 4;
  expect_ok(mha, 2e-2, "decode");
}
// Tensor-core decode: 16 q heads per block, so G > 16 spans blocks in z and G < 16 pads rows.
TEST(CudaDecode, TensorCoreGroupsSplitsAndFp8) {
  REQUIRE_GPU();
  Problem g32 = decode_problem(3, 700, 16, DType::kBF16, 128, 40);
  g32.hq = 32;
  g32.hkv = 1;  // two row blocks per kv head
  expect_ok(g32, 2e-2, "decode");
  Problem g6 = decode_problem(4, 1500, 7, DType::kBF16, 64, 41);
  g6.hq = 12;
  g6.hkv = 2;  // odd page size, padded rows
  g6.kv_lens[0] = 5000;
  expect_ok(g6, 2e-2, "decode");
  Problem p1 = decode_problem(2, 100, 1, DType::kFp8E4M3, 256, 42);
  p1.kv_lens = {20000, 3};  // page 1, split, fp8, D 256, a 3-key request
  p1.params.k_scale = 0.7f;
  p1.params.v_scale = 1.5f;
  expect_ok(p1, 3e-2, "decode");
  Problem h = decode_problem(5, 3000, 16, DType::kFp8E4M3, 64, 43);
  h.q_dtype = DType::kF16;
  h.kv_lens[3] = 15000;
  h.params.window_left = 700;
  h.params.logit_cap = 20.f;
  std::vector<float> sinks(32);
  for (int i = 0; i < 32; ++i) sinks[i] = 0.05f * i;
  h.params.sinks = sinks;
  expect_ok(h, 3e-2, "decode");
  Problem empty = decode_problem(3, 50, 16, DType::kBF16, 128, 44);
  empty.kv_lens = {0, 17, 1};  // an empty request next to tiny ones
  expect_ok(empty, 2e-2, "decode");
}

// fp8 KV with groups <= 8 runs the transposed kernel (S^T = K Q^T, O^T = V^T P^T, lazy rescale);
// unused cache slots are NaN-poisoned (Problem::poison), so masked keys must never reach the MMA.
TEST(CudaDecode, TransposedFp8Groups) {
  REQUIRE_GPU();
  Problem g8 = decode_problem(6, 4000, 16, DType::kFp8E4M3, 128, 50);
  g8.hq = 16;
  g8.hkv = 2;                                   // G 8: all MMA columns used
  g8.kv_lens[1] = 30000;                        // split-KV partials + merge
  g8.kv_lens[2] = 17;                           // partial last tile
  g8.params.sm_scale = 2.f;                     // wide logits: the lazy reference max must move
  expect_ok(g8, 3e-2, "decode");
  Problem g1 = decode_problem(4, 900, 1, DType::kFp8E4M3, 64, 51);
  g1.q_dtype = DType::kF16;
  g1.hq = g1.hkv = 4;                           // G 1 (MHA), page 1, D 64
  expect_ok(g1, 3e-2, "decode");
  Problem g3 = decode_problem(3, 5000, 5, DType::kFp8E4M3, 256, 52);
  g3.hq = 6;
  g3.hkv = 2;                                   // G 3, odd page, D 256, all features
  g3.kv_lens[0] = 9000;
  g3.params.k_scale = 0.6f;
  g3.params.v_scale = 1.7f;
  g3.params.window_left = 1500;
  g3.params.logit_cap = 15.f;
  // RunParams::sinks is a span: the values must outlive the run (a temporary vector here was
  // freed at once, and the reused heap made this case fail now and then).
  const std::vector<float> g3_sinks{0.3f, -1.f, 2.f, 0.f, 1.f, -0.5f};
  g3.params.sinks = g3_sinks;
  expect_ok(g3, 3e-2, "decode");
  Problem g12 = decode_problem(3, 2000, 16, DType::kFp8E4M3, 128, 53);
  g12.hq = 12;
  g12.hkv = 1;                                  // G 12 > 8: the row-block kernel
  expect_ok(g12, 3e-2, "decode");
}

Problem extend_problem(std::vector<int> qo, std::vector<int> prefix, int ps, int d, uint64_t seed) {
  Problem p;
  p.qo_lens = qo;
  for (size_t i = 0; i < qo.size(); ++i) p.kv_lens.push_back(qo[i] + prefix[i]);
  p.page_size = ps;
  p.hq = 8;
  p.hkv = 2;
  p.dqk = p.dv = d;
  p.params.sm_scale = 1.f / std::sqrt(float(d));
  p.seed = seed;
  return p;
}

TEST(CudaExtend, CausalWithPrefix) {
  REQUIRE_GPU();
  expect_ok(extend_problem({37, 130, 1, 64}, {0, 200, 77, 1000}, 16, 128, 11), 2e-2, "prefill");
  expect_ok(extend_problem({100, 3}, {50, 0}, 1, 64, 12), 2e-2, "prefill");
  expect_ok(extend_problem({70, 20}, {33, 300}, 16, 256, 13), 2e-2, "prefill");
}
TEST(CudaExtend, NonCausalWindowCapSinksFp8) {
  REQUIRE_GPU();
  Problem nc = extend_problem({90, 17}, {10, 200}, 16, 128, 14);
  nc.params.mask = attention::MaskKind::kNonCausal;
  expect_ok(nc, 2e-2, "prefill");
  std::vector<float> sinks(8, 0.5f);
  Problem w = extend_problem({150, 40}, {100, 500}, 16, 128, 15);
  w.params.window_left = 63;
  w.params.logit_cap = 20.f;
  w.params.sinks = sinks;
  expect_ok(w, 2e-2, "prefill");
  Problem f8 = extend_problem({80, 33}, {60, 400}, 16, 128, 16);
  f8.kv_dtype = DType::kFp8E4M3;
  f8.params.k_scale = 0.25f;
  expect_ok(f8, 3e-2, "prefill");
}
TEST(CudaExtend, TreeMaskVerify) {
  REQUIRE_GPU();
  Problem p = extend_problem({16, 64, 7}, {300, 1000, 50}, 16, 128, 17);
  p.tree_mask = true;
  expect_ok(p, 2e-2, "prefill");
}
// Tree verify with the prefix columns all ones: key tiles inside the plan's mask_free_cols run
// without per-logit bit tests. Covers G 4 / 1 / 8 (full, partial and inactive warps), prefixes
// that are not multiples of the key tile or of 8 bits, an empty prefix, a window cutting
// through the free columns, a logit cap, and every head dim.
TEST(CudaExtend, TreeMaskFreePrefixColumns) {
  // Host helper first (no GPU needed): a tree over the drafts sees prefix + its root.
  {
    Problem p = extend_problem({64, 16, 1, 5}, {1001, 130, 3, 0}, 16, 128, 71);
    p.tree_mask = true;
    const HostData h = make_host_data(p);
    const std::vector<int32_t> f = backends::cuda::mask_free_columns(h.input(p.page_size));
    ASSERT_EQ(f.size(), 4u);
    EXPECT_EQ(f[0], 1001 + 1);
    EXPECT_EQ(f[1], 130 + 1);
    EXPECT_EQ(f[2], 3 + 1);  // one draft: the whole row is ones -> capped at kv_len
    EXPECT_EQ(f[3], 0 + 1);
  }
  REQUIRE_GPU();
  Problem g4 = extend_problem({64, 16, 7, 64}, {1001, 130, 0, 63}, 16, 128, 72);
  g4.tree_mask = true;
  expect_ok(g4, 2e-2, "prefill");
  Problem g1 = extend_problem({40, 64, 33}, {777, 515, 64}, 1, 128, 73);  // partial warps
  g1.hq = g1.hkv = 4;
  g1.tree_mask = true;
  expect_ok(g1, 2e-2, "prefill");
  Problem g8 = extend_problem({64, 9}, {900, 257}, 16, 64, 74);
  g8.hq = 16;
  g8.hkv = 2;
  g8.tree_mask = true;
  expect_ok(g8, 2e-2, "prefill");
  Problem w = extend_problem({64, 20}, {1001, 300}, 16, 128, 75);
  w.tree_mask = true;
  w.params.window_left = 333;  // the window edge falls inside the free columns
  w.params.logit_cap = 20.f;
  expect_ok(w, 2e-2, "prefill");
  for (int d : {64, 128, 256}) {
    Problem t = extend_problem({64, 13}, {700, 97}, 16, d, 76 + uint64_t(d));
    t.tree_mask = true;
    expect_ok(t, 2e-2, "prefill");
  }
}

// Few query tokens over long contexts (tree verify, draft steps, short extends): the prefill
// items are cut into split-KV chunks (partials + merge, sinks and LSE in the merge), including
// requests too short to split beside long ones, a window that leaves whole chunks empty, fp8
// with scales, page 1, every head dim, and the tree mask.
TEST(CudaExtend, SplitKvShortQueriesLongContexts) {
  REQUIRE_GPU();
  auto split_ok = [](const Problem& p, double tol) {
    EXPECT_GT(expect_ok(p, tol, "prefill").split_chunk, 0) << "seed " << p.seed;
  };
  Problem v = extend_problem({4, 4}, {8188, 300}, 16, 128, 91);  // B2 verify of 4 at 8k
  v.hq = 32;
  v.hkv = 8;
  v.tree_mask = true;
  split_ok(v, 2e-2);
  Problem c = extend_problem({1, 2, 30}, {32767, 5000, 20000}, 1, 128, 92);  // causal, page 1
  split_ok(c, 2e-2);
  std::vector<float> sinks(8, 0.75f);
  Problem s = extend_problem({6, 3}, {12000, 700}, 16, 128, 93);
  s.params.sinks = sinks;
  s.params.window_left = 3000;  // leading chunks see nothing
  s.params.logit_cap = 30.f;
  split_ok(s, 2e-2);
  Problem f8 = extend_problem({5}, {9000}, 64, 128, 94);
  f8.kv_dtype = DType::kFp8E4M3;
  f8.params.k_scale = 0.5f;
  f8.params.v_scale = 2.f;
  split_ok(f8, 3e-2);
  for (int d : {64, 256}) {
    Problem t = extend_problem({8, 3}, {6000, 2500}, 16, d, 95 + uint64_t(d));
    t.tree_mask = true;
    split_ok(t, 2e-2);
  }
}

// Adversarial: some prefix bits are 0, so mask_free_cols is small or falls mid-tile; segments
// are padded apart (mask_indptr offsets honoured) with 0xA5 junk between them.
TEST(CudaExtend, TreeMaskHolesInPrefix) {
  auto clear = [](HostData& h, int b, int kv, int row, int col) {
    const int64_t bit = int64_t(row) * kv + col;
    h.mask[size_t(h.mask_indptr[b] + (bit >> 3))] &= uint8_t(~(1u << (bit & 7)));
  };
  auto pad = [](HostData& h) {
    std::vector<uint8_t> m;
    std::vector<int64_t> ip{0};
    for (size_t b = 0; b + 1 < h.mask_indptr.size(); ++b) {
      m.insert(m.end(), h.mask.begin() + h.mask_indptr[b], h.mask.begin() + h.mask_indptr[b + 1]);
      m.insert(m.end(), 3, uint8_t(0xA5));
      ip.push_back(static_cast<int64_t>(m.size()));
    }
    h.mask = std::move(m);
    h.mask_indptr = std::move(ip);
  };
  std::vector<int> qo{64, 64, 33, 64, 64, 64}, prefix{1001, 700, 450, 513, 900, 256};
  std::vector<int> kv(qo.size());
  for (size_t i = 0; i < qo.size(); ++i) kv[i] = qo[i] + prefix[i];
  // Requests: free 200 (mid-tile), 0, 128 (tile boundary, last row), prefix - 1 (one before the
  // end), ~1% random holes, and untouched (prefix + 1).
  auto tweak = [&](HostData& h) {
    pad(h);
    clear(h, 0, kv[0], 37, 200);
    clear(h, 1, kv[1], 0, 0);
    clear(h, 2, kv[2], qo[2] - 1, 128);
    clear(h, 3, kv[3], 5, prefix[3] - 1);
    std::mt19937 rng(99);
    for (int n = 0; n < qo[4] * prefix[4] / 100; ++n) {
      clear(h, 4, kv[4], int(rng() % qo[4]), 300 + int(rng() % (prefix[4] - 300)));
    }
    clear(h, 4, kv[4], 63, 300);
  };
  {
    Problem p = extend_problem(qo, prefix, 16, 128, 81);
    p.tree_mask = true;
    HostData h = make_host_data(p);
    tweak(h);
    const std::vector<int32_t> f = backends::cuda::mask_free_columns(h.input(p.page_size));
    ASSERT_EQ(f.size(), qo.size());
    EXPECT_EQ(f[0], 200);
    EXPECT_EQ(f[1], 0);
    EXPECT_EQ(f[2], 128);
    EXPECT_EQ(f[3], prefix[3] - 1);
    EXPECT_EQ(f[4], 300);
    EXPECT_EQ(f[5], prefix[5] + 1);
  }
  REQUIRE_GPU();
  for (int d : {64, 128, 256}) {
    Problem p = extend_problem(qo, prefix, 16, d, 81);
    p.tree_mask = true;
    expect_ok(p, 2e-2, "prefill", tweak);
  }
  Problem g1 = extend_problem(qo, prefix, 1, 128, 82);  // G 1: partial warps
  g1.hq = g1.hkv = 4;
  g1.tree_mask = true;
  expect_ok(g1, 2e-2, "prefill", tweak);
  // The kernels measure a row's window from its mask position, which keeps its last window + 1
  // visible keys only while those reach the mask-free columns: here rows see up to 809 keys past
  // them, so a window of 809 is exact (and still cuts the free columns of the deepest rows) and
  // one of 808 is refused.
  g1.params.window_left = 809;
  expect_ok(g1, 2e-2, "prefill", tweak);
  g1.params.window_left = 808;
  try {
    run_problem(g1, tweak);
    ADD_FAILURE() << "a window of 808 under rows 809 keys past the free columns ran";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("see up to 809 keys"), std::string::npos) << e.what();
  }
}

// 128-row tiles (D <= 128: 4 warps x 32 rows) with partial warps, warp-level causal / window
// skipping, page size 1 gathers, group sizes 4 and 8, and every head dim with a tree mask.
TEST(CudaExtend, PrefillTilesPage1GroupsHeadDims) {
  REQUIRE_GPU();
  Problem g4 = extend_problem({300, 129, 5, 33}, {0, 513, 40, 0}, 1, 128, 31);
  g4.hq = 32;
  g4.hkv = 8;
  expect_ok(g4, 2e-2, "prefill");
  Problem g8 = extend_problem({77, 260}, {1000, 3}, 16, 64, 32);
  g8.hq = 16;
  g8.hkv = 2;
  g8.params.window_left = 100;
  expect_ok(g8, 2e-2, "prefill");
  Problem nc = extend_problem({190, 64}, {37, 500}, 1, 128, 33);
  nc.params.mask = attention::MaskKind::kNonCausal;
  nc.params.logit_cap = 30.f;
  expect_ok(nc, 2e-2, "prefill");
  for (int d : {64, 128, 256}) {
    Problem t = extend_problem({40, 9}, {200, 77}, 16, d, 34 + uint64_t(d));
    t.tree_mask = true;
    expect_ok(t, 2e-2, "prefill");
  }
}
// The persistent sm90 prefill (prefill_sm90_kernel) with many (item, kv head) units per block:
// the grid capped at 1, 3, 5 and 7 blocks in both unit orders, so K/V tiles stream across unit
// boundaries through one ring and each consumer loads the next unit's Q before the current
// unit's epilogue. Units of very different lengths (causal with prefixes, page 1, G 4), a
// window with a logit cap at D 64, a tree mask, and split-KV partials whose leading chunks see
// no key (units without tiles); D 256 (64-key tiles, 128-row items) with page 1, G 4, window,
// cap and sinks. The D 128 problems run under both consumer schedules (sm90_overlap: the
// intra-warpgroup overlap and tile by tile), with and without ping-pong turns. Where the sm_90a
// kernel does not run, the knobs do nothing and the problems pass through the mma.sync kernel.
TEST(CudaExtend, PersistentUnitsAcrossBlocks) {
  REQUIRE_GPU();
  struct Knob {
    int blocks;
    bool head_major;
    bool overlap;
    int pingpong;  // -1: the launcher's default
  };
  for (const Knob k : {Knob{1, true, true, -1}, Knob{3, false, false, -1},
                       Knob{5, true, true, 0}, Knob{7, false, false, 0}}) {
    SCOPED_TRACE(::testing::Message() << "sm90_max_blocks=" << k.blocks << " sm90_head_major="
                                    << k.head_major << " sm90_overlap=" << k.overlap
                                    << " sm90_pingpong=" << k.pingpong);
    kernel_options.cuda.sm90_max_blocks = k.blocks;
    kernel_options.cuda.sm90_head_major = k.head_major;
    kernel_options.cuda.sm90_overlap = k.overlap;
    kernel_options.cuda.sm90_pingpong = k.pingpong;
    Problem g4 = extend_problem({300, 129, 5, 33}, {0, 513, 40, 0}, 1, 128, 41);
    g4.hq = 32;
    g4.hkv = 8;
    expect_ok(g4, 2e-2, "prefill");
    Problem w = extend_problem({150, 40, 260}, {100, 500, 3000}, 16, 64, 42);
    w.params.window_left = 63;
    w.params.logit_cap = 20.f;
    expect_ok(w, 2e-2, "prefill");
    Problem t = extend_problem({16, 64, 7}, {300, 1000, 50}, 16, 128, 43);
    t.tree_mask = true;
    expect_ok(t, 2e-2, "prefill");
    // D 256: 64-key tiles, 2 stages, 128-row items (the plan is made for the sm90 kernel).
    const std::vector<float> sinks16(16, -0.5f);
    Problem d = extend_problem({200, 70, 3}, {60, 1500, 257}, 1, 256, 45);
    d.hq = 16;
    d.hkv = 4;
    d.params.window_left = 700;
    d.params.logit_cap = 25.f;
    d.params.sinks = sinks16;
    expect_ok(d, 2e-2, "prefill");
    std::vector<float> sinks(8, 0.75f);
    Problem s = extend_problem({6, 3}, {12000, 700}, 16, 128, 44);
    s.params.sinks = sinks;
    s.params.window_left = 3000;  // leading split chunks see nothing
    EXPECT_GT(expect_ok(s, 2e-2, "prefill").split_chunk, 0);
  }
  kernel_options = {};
}
// Output views that are not dense rows: each head's row padded (o stride h = dv + pad) and the
// view starting some elements into its buffer. On the sm90 D 128 overlap kernel, rows whose
// 16-bit elements start on 16-byte boundaries (pad 8) take the staged epilogue (through shared
// memory, then TMA stores where G divides 64 and a warpgroup's 64 rows are whole, else 16-byte
// row chunks by every thread; sm90_tma_store=0: always the latter), 4-byte aligned ones
// (pad 4, a view 2 elements in) store_tile; group sizes 1, 3, 4 and 5 step the staged copy's
// (token, head) walk differently. A view 1 element in is not 4-byte aligned and must take the
// generic kernel. The overlap schedule with and without the TMA stores, tile by tile; D 64 /
// 256, decode and split-KV partials over the same layouts. Every byte of the buffer outside the
// view must keep its NaN poison.
TEST(CudaExtend, StridedAndUnalignedOutputs) {
  REQUIRE_GPU();
  struct Layout {
    int pad, offset;
  };
  struct Mode {
    const char *overlap, *tma_store;
  };
  for (const Mode mode : {Mode{"1", "1"}, Mode{"1", "0"}, Mode{"0", "1"}}) {
    SCOPED_TRACE(std::string("sm90_overlap=") + mode.overlap +
                 " sm90_tma_store=" + mode.tma_store);
    kernel_options.cuda.sm90_overlap = std::atoi(mode.overlap) != 0;
    kernel_options.cuda.sm90_tma_store = std::atoi(mode.tma_store) != 0;
    for (const Layout lay : {Layout{8, 0}, Layout{4, 0}, Layout{0, 2}, Layout{0, 1}}) {
      SCOPED_TRACE("pad " + std::to_string(lay.pad) + " offset " + std::to_string(lay.offset));
      const bool fast = lay.offset % 2 == 0;
      const char* want = fast ? "prefill" : "generic";
      uint64_t seed = 230 + uint64_t(lay.pad) * 4 + uint64_t(lay.offset) * 16;
      for (const int g : {1, 3, 4, 5}) {
        Problem x = extend_problem({300, 129, 5, 70}, {0, 513, 40, 1000}, 16, 128, seed++);
        x.hkv = 4;
        x.hq = 4 * g;
        x.out_pad_h = lay.pad;
        x.out_offset = lay.offset;
        expect_ok(x, 2e-2, want);
      }
      for (const int d : {64, 256}) {
        Problem x = extend_problem({200, 33}, {64, 700}, 16, d, seed++);
        x.out_pad_h = lay.pad;
        x.out_offset = lay.offset;
        expect_ok(x, 2e-2, want);
      }
      Problem dec = decode_problem(9, 3000, 16, DType::kBF16, 128, seed++);
      dec.out_pad_h = lay.pad;
      dec.out_offset = lay.offset;
      expect_ok(dec, 2e-2, fast ? "decode" : "generic");
      Problem sk = extend_problem({6, 3}, {12000, 700}, 16, 128, seed++);
      sk.out_pad_h = lay.pad;
      sk.out_offset = lay.offset;
      const Result r = expect_ok(sk, 2e-2, want);
      if (fast) {
        EXPECT_GT(r.split_chunk, 0);
      }
    }
  }
  kernel_options = {};
}
// The sm90 prefill's K/V copies by TMA (the two-stage configurations, D 256 and DQK 192 / DV
// 128, at page sizes >= 16; boxes of min(page, tile keys) tokens, so whole pages at 16-64 and
// part of a page at 128 and 256 with D 256's 64-key tiles; DQK 192 at page 32 here, 16 and 64
// in MlaPrefillDims192x128),
// with the last tile of a unit that ends past kv_len (NaN-poisoned rows) and units whose first
// key is off a box boundary (window) by cp.async; D 64 and 128 (cp.async, the schedule walked
// by every warpgroup) over the same pages; every problem again with sm90_tma=0 (all tiles
// by cp.async). Where the sm_90a kernel does not run, the knob does nothing and the problems
// pass through the mma.sync kernel.
TEST(CudaExtend, Sm90TmaPagesAndTails) {
  REQUIRE_GPU();
  for (const char* tma : {"1", "0"}) {
    SCOPED_TRACE(std::string("sm90_tma=") + tma);
    kernel_options.cuda.sm90_tma = std::atoi(tma) != 0;
    for (int ps : {16, 32, 64, 128, 256}) {
      for (int d : {64, 128, 256}) {
        SCOPED_TRACE("page " + std::to_string(ps) + " D " + std::to_string(d));
        Problem p = extend_problem({300, 129, 1, 64}, {0, 513, 1000, 2047}, ps, d,
                                   uint64_t(70 + ps + d));
        p.hq = 16;
        p.hkv = 4;
        expect_ok(p, 2e-2, "prefill");
      }
    }
    Problem w = extend_problem({150, 40, 260}, {100, 500, 3000}, 64, 128, 71);
    w.params.window_left = 200;  // units start at keys off the 64-key boxes
    w.params.logit_cap = 20.f;
    expect_ok(w, 2e-2, "prefill");
    Problem t = extend_problem({16, 64, 7}, {300, 1000, 50}, 32, 128, 72);
    t.tree_mask = true;
    expect_ok(t, 2e-2, "prefill");
    Problem m = extend_problem({300, 129, 5}, {0, 513, 2000}, 32, 192, 73);  // MLA prefill dims
    m.dv = 128;
    m.hq = m.hkv = 16;
    m.params.sm_scale = 1.f / std::sqrt(192.f);
    expect_ok(m, 2e-2, kernels::cuda::prefill_sm90_serves(DType::kBF16, DType::kBF16, DType::kBF16,
                                                          192, 128)
                           ? "prefill"
                           : "generic");
  }
  kernel_options = {};
}
// A DQK 192 / DV 128 problem (the non-absorbed MLA prefill), MHA at 16 heads.
Problem mla_problem(std::vector<int> qo, std::vector<int> prefix, int ps, uint64_t seed) {
  Problem p = extend_problem(std::move(qo), std::move(prefix), ps, 192, seed);
  p.dv = 128;
  p.hq = p.hkv = 16;
  p.params.sm_scale = 1.f / std::sqrt(192.f);
  return p;
}

// DQK 192 / DV 128 under the current kernel options (seeds seed .. seed + 3): MHA over ragged
// prefixes (page 16, long causal rows), G 4 on page 1 with window, cap and sinks, a tree mask
// over a prefix, non-causal on page 64.
void expect_mla_prefill_problems(uint64_t seed, const char* want) {
  expect_ok(mla_problem({300, 129, 5, 1000}, {0, 513, 2000, 37}, 16, seed), 2e-2, want);
  std::vector<float> sinks(32, 0.25f);
  Problem g4 = mla_problem({150, 40, 260}, {100, 500, 3000}, 1, seed + 1);
  g4.hq = 32;
  g4.hkv = 8;
  g4.params.window_left = 700;
  g4.params.logit_cap = 25.f;
  g4.params.sinks = sinks;
  expect_ok(g4, 2e-2, want);
  Problem t = mla_problem({16, 64, 7}, {300, 1000, 50}, 16, seed + 2);
  t.tree_mask = true;
  expect_ok(t, 2e-2, want);
  Problem nc = mla_problem({90, 17}, {10, 200}, 64, seed + 3);
  nc.params.mask = attention::MaskKind::kNonCausal;
  expect_ok(nc, 2e-2, want);
}

// Whether the sm90 kernel serves DQK 192 / DV 128 here (else the generic kernel does).
bool mla_prefill_sm90() {
  return kernels::cuda::prefill_sm90_serves(DType::kBF16, DType::kBF16, DType::kBF16, 192, 128);
}

// DQK 192 / DV 128: split-KV partials of short queries on a long context (seed) and a
// decode-shaped batch (seed + 1; no decode kernel has these dims: the prefill path takes it).
void expect_mla_split_and_decode(uint64_t seed, bool sm90) {
  const char* want = sm90 ? "prefill" : "generic";
  const Result r = expect_ok(mla_problem({6, 3}, {12000, 700}, 16, seed), 2e-2, want);
  if (sm90) {
    EXPECT_GT(r.split_chunk, 0);
  }
  expect_ok(mla_problem({1, 1, 1, 1, 1}, {4000, 17, 600, 0, 9000}, 16, seed + 1), 2e-2, want);
}

// fp8 e4m3 K/V on the sm90 kernel (D 128 under the overlap schedule; the producer copies each
// tile's raw rows into its stage and widens them there). The plan takes the sm90 kernel for fp8
// wherever it takes it for bf16 at D 128 (not at D 64, not with the overlap off). Against the f64
// reference on the e4m3 values: pages 1 / 16 / 64 with tails, a 4,100-key prefix (many tiles), GQA
// 4 and 1, f16 queries, k / v scales, non-causal, window + cap + sinks, tree verify, split-KV
// partials; the launcher's grid and few blocks (many units per block, the pipeline across units)
// with ping-pong on and off.
TEST(CudaExtend, Sm90Fp8KvPagesScalesUnits) {
  REQUIRE_GPU();
  namespace kc = kernels::cuda;
  const bool sm90 = kc::prefill_sm90_serves(DType::kBF16, DType::kBF16, DType::kBF16, 128, 128);
  kc::CudaLaunchVariants on;
  EXPECT_EQ(kc::prefill_sm90_serves(DType::kBF16, DType::kFp8E4M3, DType::kBF16, 128, 128, on),
            sm90);
  EXPECT_FALSE(kc::prefill_sm90_serves(DType::kBF16, DType::kFp8E4M3, DType::kBF16, 64, 64, on));
  on.sm90_overlap = false;
  EXPECT_FALSE(kc::prefill_sm90_serves(DType::kBF16, DType::kFp8E4M3, DType::kBF16, 128, 128, on));
  struct Knob {
    int blocks, pingpong;  // 0: the launcher's grid; -1: the launcher's ping-pong
  };
  for (const Knob k : {Knob{0, -1}, Knob{3, 0}, Knob{5, 1}}) {
    SCOPED_TRACE(::testing::Message() << "sm90_max_blocks=" << k.blocks
                                      << " sm90_pingpong=" << k.pingpong);
    kernel_options = {};
    kernel_options.cuda.sm90_max_blocks = k.blocks;
    kernel_options.cuda.sm90_pingpong = k.pingpong;
    for (int ps : {1, 16, 64}) {
      SCOPED_TRACE("page " + std::to_string(ps));
      Problem c = extend_problem({300, 129, 5, 33}, {0, 4100, 40, 0}, ps, 128, 90 + ps);
      c.hq = 32;
      c.hkv = 8;
      c.kv_dtype = DType::kFp8E4M3;
      c.params.k_scale = 0.5f;
      c.params.v_scale = 1.75f;
      EXPECT_EQ(expect_ok(c, 3e-2, "prefill").sm90, sm90);
    }
    Problem nc = extend_problem({90, 17}, {10, 200}, 16, 128, 94);
    nc.kv_dtype = DType::kFp8E4M3;
    nc.q_dtype = DType::kF16;
    nc.params.mask = attention::MaskKind::kNonCausal;
    EXPECT_EQ(expect_ok(nc, 3e-2, "prefill").sm90, sm90);
    std::vector<float> sinks(8, 0.5f);
    Problem w = extend_problem({150, 40}, {100, 2500}, 16, 128, 95);
    w.kv_dtype = DType::kFp8E4M3;
    w.hkv = 8;  // G 1
    w.params.window_left = 300;
    w.params.logit_cap = 20.f;
    w.params.sinks = sinks;
    expect_ok(w, 3e-2, "prefill");
    Problem t = extend_problem({16, 64, 7}, {300, 1000, 50}, 16, 128, 96);
    t.kv_dtype = DType::kFp8E4M3;
    t.tree_mask = true;
    expect_ok(t, 3e-2, "prefill");
    Problem s = extend_problem({6, 3}, {12000, 700}, 16, 128, 97);
    s.kv_dtype = DType::kFp8E4M3;
    s.params.v_scale = 0.5f;
    const Result r = expect_ok(s, 3e-2, "prefill");
    if (sm90) {
      EXPECT_GT(r.split_chunk, 0);
    }
  }
  kernel_options = {};
}

// DQK 192 / DV 128 (64-key tiles, three stages, tile by tile) with ping-pong off, on the
// launcher's grid and on 3 blocks (MlaPrefillDims192x128 runs the default ping-pong): the
// problems there, units of exactly one 64-key tile, split-KV partials of short queries on a long
// context and a decode-shaped batch.
TEST(CudaExtend, MlaPrefill192PingPongOffOneTileUnits) {
  REQUIRE_GPU();
  const bool sm90 = mla_prefill_sm90();
  const char* want = sm90 ? "prefill" : "generic";
  for (const int blocks : {0, 3}) {
    SCOPED_TRACE(::testing::Message() << "sm90_pingpong=0 sm90_max_blocks=" << blocks);
    kernel_options = {};
    kernel_options.cuda.sm90_pingpong = 0;
    kernel_options.cuda.sm90_max_blocks = blocks;
    expect_mla_prefill_problems(161, want);
    expect_ok(mla_problem({64, 1, 63, 200}, {0, 64, 0, 4000}, 32, 165), 2e-2, want);
    expect_mla_split_and_decode(166, sm90);
  }
  kernel_options = {};
}

// One small problem per configuration that the epilogue's and producer's hand-offs differ in,
// quick enough for compute-sanitizer (memcheck and racecheck in bench/device/run.sh ab_kernels):
// fp8 K/V at D 128 on 3 blocks (units, the pipeline across them, rows that are not a whole 64,
// so the staged epilogue's row stores), the same with bf16 K/V, and DQK 192 on 2 blocks.
TEST(CudaExtend, Sm90SanitizerSmall) {
  REQUIRE_GPU();
  kernel_options = {};
  kernel_options.cuda.sm90_max_blocks = 3;
  Problem f = extend_problem({130, 20}, {70, 300}, 16, 128, 181);
  f.kv_dtype = DType::kFp8E4M3;
  f.params.v_scale = 1.5f;
  expect_ok(f, 3e-2, "prefill");
  // The same problem with bf16 K/V (the same epilogue and Q hand-off; racecheck names the
  // kernel instance, so a hazard in one and not the other tells fp8's producer apart).
  f.kv_dtype = DType::kBF16;
  expect_ok(f, 2e-2, "prefill");
  kernel_options = {};
  kernel_options.cuda.sm90_max_blocks = 2;
  Problem m = extend_problem({100, 9}, {40, 200}, 16, 192, 182);
  m.dv = 128;
  m.hq = m.hkv = 4;
  m.params.sm_scale = 1.f / std::sqrt(192.f);
  expect_ok(m, 2e-2, mla_prefill_sm90() ? "prefill" : "generic");
  kernel_options = {};
}

// DQK 192 / DV 128, the non-absorbed MLA prefill (DeepSeek-style: 128 nope + 64 rope dims of Q and
// K, 128 of V, kv heads = q heads): the sm90 kernel's 3-atom K and 2-atom V tiles, 3 stages of 64
// keys. MHA over ragged prefixes (page 16, long causal rows), G 4 on page 1 with window, cap and
// sinks, a tree mask over a prefix, split-KV partials of short queries on a long context, a
// decode-shaped batch (no decode kernel has these dims: the prefill path takes it), and the
// persistent grid capped at 3 blocks. Where the sm_90a kernel does not run, the generic kernel
// serves the shape.
TEST(CudaExtend, MlaPrefillDims192x128) {
  REQUIRE_GPU();
  const bool sm90 = mla_prefill_sm90();
  const char* want = sm90 ? "prefill" : "generic";
  std::printf("DQK 192 / DV 128 runs the %s path\n", want);
  for (const char* blocks : {"0", "3"}) {
    SCOPED_TRACE(std::string("sm90_max_blocks=") + blocks);
    kernel_options.cuda.sm90_max_blocks = std::atoi(blocks);
    expect_mla_prefill_problems(61, want);
  }
  kernel_options = {};
  expect_mla_split_and_decode(65, sm90);
}
TEST(CudaGeneric, MlaF32AndOddDims) {
  REQUIRE_GPU();
  Problem mla = decode_problem(4, 600, 16, DType::kBF16, 576, 18);
  mla.mla = true;
  mla.hq = 16;
  mla.hkv = 1;
  mla.dv = 512;
  mla.params.sm_scale = 0.05f;
  // This test is the generic kernel's (cuda_mla_test.cpp: the MLA kernel).
  kernel_options.mla_decode = false;
  expect_ok(mla, 2e-2, "generic");
  kernel_options = {};
  Problem mla_ext = extend_problem({20, 5}, {100, 30}, 1, 576, 19);
  mla_ext.mla = true;
  mla_ext.hq = 8;
  mla_ext.hkv = 1;
  mla_ext.dv = 512;
  mla_ext.params.sm_scale = 0.05f;
  expect_ok(mla_ext, 2e-2, "generic");
  Problem f32 = extend_problem({30, 1}, {40, 90}, 4, 96, 20);
  f32.q_dtype = DType::kF32;
  f32.kv_dtype = DType::kF32;
  expect_ok(f32, 1e-4, "generic");
}
TEST(CudaExtend, MixedDecodeAndExtend) {
  REQUIRE_GPU();
  expect_ok(extend_problem({1, 50, 1, 1, 200}, {500, 20, 3000, 0, 0}, 16, 128, 21), 2e-2,
            "prefill");
}

TEST(CudaGraph, ReplayWithNewLengthsEqualsEager) {
  REQUIRE_GPU();
  Problem a = decode_problem(8, 3000, 16, DType::kBF16, 128, 30);
  Problem b = decode_problem(8, 3000, 16, DType::kBF16, 128, 31);
  b.kv_lens[2] = 12000;  // different split schedule
  a.poison = b.poison = true;
  // Same pool for both: build b's data, then plan a's table over it for the capture.
  HostData hb = make_host_data(b);
  HostData ha = make_host_data(a);
  const int pages = std::max(ha.num_pages, hb.num_pages);
  Dev q(hb.q.size()), k(size_t(pages) * 16 * 8 * 128 * 2), v(size_t(pages) * 16 * 8 * 128 * 2);
  const size_t ob = size_t(8) * 32 * 128 * 2;
  Dev out(ob), out_eager(ob);
  cudaMemcpy(q.p, hb.q.data(), hb.q.size(), cudaMemcpyHostToDevice);
  cudaMemset(k.p, 0, size_t(pages) * 16 * 8 * 128 * 2);
  cudaMemset(v.p, 0, size_t(pages) * 16 * 8 * 128 * 2);
  cudaMemcpy(k.p, hb.k.data(), hb.k.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(v.p, hb.v.data(), hb.v.size(), cudaMemcpyHostToDevice);
  const Device dev = Device::cuda(0);
  TensorView qv(q.p, DType::kBF16, {8, 32, 128}, dev);
  TensorView kc(k.p, DType::kBF16, {pages, 16, 8, 128}, dev);
  TensorView vc(v.p, DType::kBF16, {pages, 16, 8, 128}, dev);
  TensorView ov(out.p, DType::kBF16, {8, 32, 128}, dev);
  TensorView oe(out_eager.p, DType::kBF16, {8, 32, 128}, dev);
  attention::AttentionShape shape{.num_qo_heads = 32, .num_kv_heads = 8, .head_dim_qk = 128,
                                  .head_dim_v = 128};
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  {
    CudaBatchAttention eager(s);
    eager.plan(hb.input(16), shape);
    eager.run(qv, kc, vc, oe, TensorView(), b.params);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  }
  {
  CudaBatchAttention g(s);
  g.enable_graph_mode({.max_batch_size = 8, .max_tokens = 8, .max_pages = 4096}, shape);
  g.plan(ha.input(16), shape);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  g.run(qv, kc, vc, ov, TensorView(), a.params);
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  cudaMemsetAsync(out.p, 0xFF, ob, s);
  g.plan(hb.input(16), shape);  // replay with b's lengths
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  std::vector<uint16_t> x(ob / 2), y(ob / 2);
  cudaMemcpy(x.data(), out.p, ob, cudaMemcpyDeviceToHost);
  cudaMemcpy(y.data(), out_eager.p, ob, cudaMemcpyDeviceToHost);
  EXPECT_EQ(std::memcmp(x.data(), y.data(), ob), 0) << "graph replay differs from eager";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  }  // the attention object (which syncs its stream) goes before the stream
  cudaStreamDestroy(s);
}

TEST(CudaPlan, RejectsBadTables) {
  REQUIRE_GPU();
  CudaBatchAttention attn(nullptr, kernel_options);
  std::vector<int32_t> qo{0, 1}, kvp{0, 1}, idx{-3}, last{1};
  attention::PagedPlanInput in{.qo_indptr = qo, .kv_indptr = kvp, .kv_indices = idx,
                               .kv_last_page_len = last, .page_size = 16};
  attention::AttentionShape shape{.num_qo_heads = 4, .num_kv_heads = 2, .head_dim_qk = 128,
                                  .head_dim_v = 128};
  EXPECT_THROW(attn.plan(in, shape), Error);
  idx[0] = 1;
  last[0] = 17;
  EXPECT_THROW(attn.plan(in, shape), Error);
}

}  // namespace
}  // namespace pagoda::cuda_test
