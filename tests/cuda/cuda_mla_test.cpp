/// The MLA decode kernel (absorbed form, Dqk 576 / Dv 512, one latent head) through the CUDA
/// BatchAttention vs a plain double-loop host reference written here from the math (latent row =
/// K, its first 512 columns = V). Random inputs (seed printed, PAGODA_TEST_SEED overrides),
/// ragged batches, permuted pages, NaN in every unused slot and page, NaN-poisoned outputs; page
/// sizes 1/16/64, h_q 16/128 (and 48), bf16 and fp8 e4m3 latents, contexts up to 32k (split-KV
/// chunks, thousands of pages); mla_decode=0 (generic kernel) agrees with the new path.
/// Bf16 and fp8 latents run the Hopper wgmma kernel on sm_90 at every head count and page size
/// (mla_decode_sm90_kernel.cuh; fp8 tiles widened to bf16 in place in shared memory);
/// MlaDecode.HopperAndMmaSyncKernels checks that they do, and runs both kernels on 16/64/96/128
/// heads (fp8 on 16/128) and the Hopper one on 48 (mla_sm90=0 gives the mma.sync kernel);
/// MlaDecode.HopperTmaPagesTailsAndRescales runs its TMA and cp.async copies and its lazy
/// rescaling with both latent types; MlaDecode.HopperFewHeadsTransposed the transposed kernel
/// that serves h_q <= 16 (mla_sm90_small=0 gives the 64-row one).
/// Label "gpu".

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

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

/// q heads per MLA decode block (bf16 q / out) under kernel_options.
int block_heads(DType kv, int hq) {
  return kernels::cuda::mla_decode_block_heads(DType::kBF16, kv, DType::kBF16, hq,
                                               kernel_options.cuda);
}
constexpr int kDqk = 576, kDv = 512;

struct Buf {
  void* p = nullptr;
  explicit Buf(size_t n) { EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 16)), cudaSuccess); }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

/// Output (f32 copy of the bf16 result), LSE and the kernel path of one run.
struct MlaRun {
  std::vector<float> out, lse;
  std::string path;
};

Problem mla_problem(std::vector<int> kv_lens, int page_size, int hq, DType kv, uint64_t seed) {
  Problem p;
  p.kv_lens = std::move(kv_lens);
  p.qo_lens.assign(p.kv_lens.size(), 1);
  p.page_size = page_size;
  p.hq = hq;
  p.hkv = 1;
  p.dqk = kDqk;
  p.dv = kDv;
  p.mla = true;
  p.q_dtype = DType::kBF16;
  p.kv_dtype = kv;
  p.params.sm_scale = 1.f / std::sqrt(192.f);  // DeepSeek's softmax scale (qk_head_dim 192)
  if (kv == DType::kFp8E4M3) {
    p.params.k_scale = 0.8f;
    p.params.v_scale = 1.25f;
  }
  p.seed = seed;
  return p;
}

/// Uploads the problem, plans and runs it on the CUDA BatchAttention; NaN-poisoned out and LSE.
MlaRun run_cuda(const Problem& p, const HostData& h) {
  Buf q(h.q.size()), k(h.k.size());
  const size_t out_bytes = size_t(h.nnz) * p.hq * kDv * 2;
  Buf out(out_bytes), lse(size_t(h.nnz) * p.hq * 4);
  EXPECT_EQ(cudaMemcpy(q.p, h.q.data(), h.q.size(), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(k.p, h.k.data(), h.k.size(), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemset(out.p, 0xFF, out_bytes), cudaSuccess);
  EXPECT_EQ(cudaMemset(lse.p, 0xFF, size_t(h.nnz) * p.hq * 4), cudaSuccess);
  const Device dev = Device::cuda(0);
  TensorView qv(q.p, DType::kBF16, {h.nnz, p.hq, kDqk}, dev);
  TensorView kc(k.p, p.kv_dtype, {h.num_pages, p.page_size, 1, kDqk}, dev);
  TensorView vc(k.p, p.kv_dtype, {h.num_pages, p.page_size, 1, kDv},
                {int64_t(p.page_size) * kDqk, kDqk, kDqk, 1}, dev);
  TensorView ov(out.p, DType::kBF16, {h.nnz, p.hq, kDv}, dev);
  TensorView lv(lse.p, DType::kF32, {h.nnz, p.hq}, dev);
  CudaBatchAttention attn(nullptr, kernel_options);
  const attention::AttentionShape shape{.num_qo_heads = p.hq, .num_kv_heads = 1,
                                        .head_dim_qk = kDqk, .head_dim_v = kDv,
                                        .q_dtype = DType::kBF16, .kv_dtype = p.kv_dtype,
                                        .out_dtype = DType::kBF16};
  attn.plan(h.input(p.page_size), shape);
  attn.run(qv, kc, vc, ov, lv, p.params);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> ob(out_bytes);
  MlaRun r;
  r.lse.resize(size_t(h.nnz) * p.hq);
  EXPECT_EQ(cudaMemcpy(ob.data(), out.p, out_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(r.lse.data(), lse.p, r.lse.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  r.out.resize(size_t(h.nnz) * p.hq * kDv);
  for (size_t i = 0; i < r.out.size(); ++i) r.out[i] = read_as_f32(ob.data(), DType::kBF16, i);
  r.path = std::string(kernel_path_name(attn.path()));
  return r;
}

/// Double-precision MLA decode from the definition: s_j = sm_scale * k_scale * q·c_j over the 576
/// latent columns, o = sum_j softmax(s)_j * v_scale * c_j[0:512]; LSE in base 2. Every query
/// row sees every key of its request (decode; non-causal for qo_len > 1). Threads over
/// (request, head).
MlaRun reference_mla(const Problem& p, const HostData& h) {
  const int bs = static_cast<int>(p.kv_lens.size());
  MlaRun r;
  r.out.assign(size_t(h.nnz) * p.hq * kDv, 0.f);
  r.lse.assign(size_t(h.nnz) * p.hq, -INFINITY);
  // Latent rows of every request, in key order, widened once.
  std::vector<std::vector<double>> lat(bs);
  for (int b = 0; b < bs; ++b) {
    lat[b].resize(size_t(p.kv_lens[b]) * kDqk);
    for (int j = 0; j < p.kv_lens[b]; ++j) {
      const int64_t slot =
          int64_t(h.kv_indices[h.kv_indptr[b] + j / p.page_size]) * p.page_size + j % p.page_size;
      for (int e = 0; e < kDqk; ++e) {
        lat[b][size_t(j) * kDqk + e] = read_as_f32(h.k.data(), p.kv_dtype, size_t(slot) * kDqk + e);
      }
    }
  }
  const int tasks = bs * p.hq;
  auto work = [&](int t0, int stride) {
    std::vector<double> qd(kDqk), s, acc(kDv);
    for (int t = t0; t < tasks; t += stride) {
      const int b = t / p.hq, hh = t % p.hq, n = p.kv_lens[b];
      if (n == 0) continue;
      for (int row = h.qo_indptr[b]; row < h.qo_indptr[b + 1]; ++row) {  // non-causal rows
      for (int e = 0; e < kDqk; ++e) {
        qd[e] = read_as_f32(h.q.data(), DType::kBF16, (size_t(row) * p.hq + hh) * kDqk + e);
      }
      s.assign(size_t(n), 0.0);
      double m = -INFINITY;
      for (int j = 0; j < n; ++j) {
        const double* c = lat[b].data() + size_t(j) * kDqk;
        double d = 0;
        for (int e = 0; e < kDqk; ++e) d += qd[e] * c[e];
        s[j] = d * p.params.k_scale * p.params.sm_scale;
        m = std::max(m, s[j]);
      }
      double tot = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int j = 0; j < n; ++j) {
        const double w = std::exp(s[j] - m);
        tot += w;
        const double* c = lat[b].data() + size_t(j) * kDqk;
        for (int e = 0; e < kDv; ++e) acc[e] += w * c[e];
      }
      for (int e = 0; e < kDv; ++e) {
        r.out[(size_t(row) * p.hq + hh) * kDv + e] = float(acc[e] / tot * p.params.v_scale);
      }
      r.lse[size_t(row) * p.hq + hh] = float((m + std::log(tot)) / std::log(2.0));
      }
    }
  };
  const int nt = std::max(1, std::min(32, static_cast<int>(std::thread::hardware_concurrency())));
  std::vector<std::thread> pool;
  for (int i = 0; i < nt; ++i) pool.emplace_back(work, i, nt);
  for (auto& th : pool) th.join();
  return r;
}

/// Relative L2 error over all outputs, max LSE error, and whether everything is finite.
struct Cmp {
  double rel = 0, lse = 0;
  bool finite = true;
};
Cmp compare(const MlaRun& got, const MlaRun& want) {
  Cmp c;
  double num = 0, den = 0;
  for (size_t i = 0; i < want.out.size(); ++i) {
    if (!std::isfinite(got.out[i])) c.finite = false;
    num += (double(got.out[i]) - want.out[i]) * (double(got.out[i]) - want.out[i]);
    den += double(want.out[i]) * want.out[i];
  }
  c.rel = std::sqrt(num / std::max(den, 1e-30));
  for (size_t i = 0; i < want.lse.size(); ++i) {
    if (std::isinf(want.lse[i])) {
      if (!(std::isinf(got.lse[i]) && got.lse[i] < 0)) c.lse = 1e9;
    } else {
      c.lse = std::max(c.lse, std::abs(double(got.lse[i]) - want.lse[i]) /
                                  std::max(1.0, std::abs(double(want.lse[i]))));
    }
  }
  return c;
}

/// Runs p (host data h) on the CUDA backend and checks it against the reference and the
/// expected path.
void check(const Problem& p, const HostData& h, double tol, const char* want_path = "mla_decode") {
  SCOPED_TRACE(::testing::Message() << "seed " << p.seed << " page " << p.page_size << " hq " << p.hq
                                  << " kv " << dtype_name(p.kv_dtype));
  const MlaRun got = run_cuda(p, h);
  const MlaRun want = reference_mla(p, h);
  const Cmp c = compare(got, want);
  EXPECT_EQ(got.path, want_path);
  EXPECT_TRUE(c.finite);
  EXPECT_LT(c.rel, tol);
  EXPECT_LT(c.lse, 1e-3);
}
void check(const Problem& p, double tol, const char* want_path = "mla_decode") {
  check(p, make_host_data(p), tol, want_path);
}

/// "Spike" keys: keys first, first + step, ... of every request get their latent row scaled by 12
/// (still finite in bf16 and e4m3: the latents are uniform in [-1, 1]). Their logits jump by far
/// more than the lazy rescaling's threshold mid-chunk, so the running max moves (and O is
/// rescaled) after tiles that did not move it.
void add_spikes(const Problem& p, HostData& h, int first, int step) {
  const int ps = p.page_size;
  for (size_t b = 0; b < p.kv_lens.size(); ++b) {
    for (int j = first; j < p.kv_lens[b]; j += step) {
      const int64_t slot = int64_t(h.kv_indices[h.kv_indptr[b] + j / ps]) * ps + j % ps;
      for (int e = 0; e < kDqk; ++e) {
        const size_t at = size_t(slot) * kDqk + e;
        write_from_f32(h.k.data(), p.kv_dtype, at, 12.f * read_as_f32(h.k.data(), p.kv_dtype, at));
      }
    }
  }
}

/// Runs p with the MLA kernel and again with mla_decode=0 (the generic kernel), expects
/// both paths and their agreement; returns the MLA kernel's run.
MlaRun expect_matches_generic(const Problem& p, const HostData& h) {
  const MlaRun fast = run_cuda(p, h);
  kernel_options.mla_decode = false;
  const MlaRun slow = run_cuda(p, h);
  kernel_options = {};
  EXPECT_EQ(fast.path, "mla_decode");
  EXPECT_EQ(slow.path, "generic");
  const Cmp c = compare(fast, slow);
  EXPECT_TRUE(c.finite);
  EXPECT_LT(c.rel, 1.5e-2);
  EXPECT_LT(c.lse, 1e-3);
  return fast;
}

/// Ragged lengths in [1, max_len] for bs requests, plus the given extra lengths.
std::vector<int> ragged(int bs, int max_len, std::vector<int> extra, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int> v;
  for (int b = 0; b < bs; ++b) v.push_back(1 + static_cast<int>(rng() % uint64_t(max_len)));
  v.insert(v.end(), extra.begin(), extra.end());
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

class MlaDecode : public testing::Test {
 protected:
  void SetUp() override {
    PAGODA_REQUIRE_GPU();
    int dev = 0, smem = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    // The kernel needs up to 226 KB of shared memory per block (fp8, 32 heads); A100-class GPUs
    // take the generic path.
    if (smem < 226304) PAGODA_SKIP_GPU_TEST("MLA decode kernel needs an sm_90-class shared memory limit");
    kernel_options = {};
    seed_ = gpu_test::test_seed(20261201);
    std::printf("MLA decode test seed %llu (PAGODA_TEST_SEED to re-run)\n",
                static_cast<unsigned long long>(seed_));
  }
  uint64_t seed_ = 0;
};

TEST_F(MlaDecode, PageSizesHeadsDtypesRagged) {
  for (DType kv : {DType::kBF16, DType::kFp8E4M3}) {
    const double tol = kv == DType::kBF16 ? 1.5e-2 : 2e-2;
    for (int ps : {1, 16, 64}) {
      const uint64_t s = seed_ + uint64_t(ps) * 7 + (kv == DType::kBF16 ? 0 : 1000);
      // h_q 16: a ragged batch with 1- and 2-key requests and one split request.
      check(mla_problem(ragged(6, 1500, {1, 2, 7000}, s), ps, 16, kv, s), tol);
      // h_q 128 (8 blocks per work item): ragged, one request over several chunks.
      check(mla_problem(ragged(3, 900, {63, 65, 5000}, s + 1), ps, 128, kv, s + 1), tol);
    }
  }
}

TEST_F(MlaDecode, LongContexts32k) {
  // B = 1 at 32k keys: the split-KV planner fills the GPU with chunks of one request (page 1:
  // 32,768 pages; page 64: 512 pages); h_q 16 and 128.
  check(mla_problem({32768}, 64, 16, DType::kBF16, seed_ + 11), 1.5e-2);
  check(mla_problem({32768}, 1, 16, DType::kFp8E4M3, seed_ + 12), 2e-2);
  check(mla_problem({20000, 12000}, 16, 128, DType::kBF16, seed_ + 13), 1.5e-2);
}

TEST_F(MlaDecode, MergeBlockSizes) {
  // The split-KV merge at D 512 (128 float4 column groups) under every block size it can take
  // (merge_threads forces one): 128 threads sum each group over all of a row's partials,
  // 256 / 384 / 512 split the partials two, three and four ways and reduce in shared memory, 160
  // leaves 32 threads idle, 32 makes four passes over the groups. A ragged batch with one request
  // over many chunks.
  int i = 0;
  for (const char* t : {"32", "128", "160", "256", "384", "512"}) {
    kernel_options.cuda.merge_threads = std::atoi(t);
    for (int hq : {16, 128}) {
      SCOPED_TRACE(::testing::Message() << "merge_threads=" << t << " hq " << hq);
      const uint64_t s = seed_ + 301 + uint64_t(i++);
      check(mla_problem(ragged(3, 3000, {1, 24000}, s), 64, hq, DType::kBF16, s), 1.5e-2);
    }
  }
  kernel_options = {};
}

TEST_F(MlaDecode, HeadCountsNotMultipleOf64AndFeatures) {
  // 48 heads (a 32-head block and a block whose second 16-head group is empty), odd page size, sliding window, soft cap and sinks (natural-log
  // logits), which the reference above does not model: checked against the generic kernel.
  Problem p = mla_problem(ragged(4, 3000, {9000}, seed_ + 21), 7, 48, DType::kBF16, seed_ + 21);
  check(p, 1.5e-2);
  p.params.window_left = 777;
  p.params.logit_cap = 25.f;
  std::vector<float> sinks(48);
  for (int i = 0; i < 48; ++i) sinks[i] = 0.05f * float(i) - 1.f;
  p.params.sinks = sinks;
  expect_matches_generic(p, make_host_data(p));
}

TEST_F(MlaDecode, HopperAndMmaSyncKernels) {
  // On sm_90 the wgmma kernel serves every bf16 latent (one block per 64 heads, the live heads
  // first); mla_sm90=0 gives the mma.sync kernel. Both against the reference: 16, 64, 96
  // (a block with 32 live heads) and 128 heads, pages 1 / 64, a ragged batch with a split
  // request; then window, soft cap and sinks against the generic kernel.
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  const bool hopper = major == 9 && minor == 0;
  namespace kc = kernels::cuda;
  if (hopper) {
    EXPECT_EQ(block_heads(DType::kBF16, 128), 64)
        << "the sm_90a image of the Hopper MLA kernel is missing";
    // Below 64 heads too, at any page size; at 16 heads and fewer its transposed form
    // (mla_decode_sm90_small_kernel.cuh), unless mla_sm90_small=0.
    EXPECT_EQ(block_heads(DType::kBF16, 16), 16);
    EXPECT_EQ(block_heads(DType::kBF16, 17), 64);
    EXPECT_EQ(block_heads(DType::kBF16, 48), 64);
    kernel_options.cuda.mla_sm90_small = false;
    EXPECT_EQ(block_heads(DType::kBF16, 16), 64);
    kernel_options = {};
  }
  // fp8 latents: the Hopper kernel widens them in shared memory.
  EXPECT_EQ(block_heads(DType::kFp8E4M3, 128),
            hopper ? 64 : 32);
  for (const char* sm90 : {"1", "0"}) {
    kernel_options.cuda.mla_sm90 = std::atoi(sm90) != 0;
    if (std::strcmp(sm90, "0") == 0) {
      EXPECT_EQ(block_heads(DType::kBF16, 128), 32);
      EXPECT_EQ(block_heads(DType::kBF16, 48), 32);
      EXPECT_EQ(block_heads(DType::kFp8E4M3, 128), 32);
    }
    int i = 0;
    for (int hq : {16, 64, 96, 128}) {  // 16: 48 empty rows of the Hopper block; mma.sync: 16
      for (int ps : {1, 64}) {
        for (DType kv : {DType::kBF16, DType::kFp8E4M3}) {
          if (kv == DType::kFp8E4M3 && hq != 16 && hq != 128) continue;
          const uint64_t s = seed_ + 61 + uint64_t(i++);
          SCOPED_TRACE(::testing::Message() << "mla_sm90=" << sm90);
          check(mla_problem(ragged(4, 2000, {1, 64, 65, 9000}, s), ps, hq, kv, s),
                kv == DType::kBF16 ? 1.5e-2 : 2e-2);
        }
      }
    }
    Problem p = mla_problem(ragged(3, 3000, {7000}, seed_ + 71), 16, 128, DType::kBF16, seed_ + 71);
    p.params.window_left = 1000;
    p.params.logit_cap = 30.f;
    std::vector<float> sinks(128);
    for (int h = 0; h < 128; ++h) sinks[h] = 0.02f * float(h) - 1.5f;
    p.params.sinks = sinks;
    expect_matches_generic(p, make_host_data(p));
  }
  // The default route at 16 heads (the transposed kernel) and 48 (48 live rows of the 64-row
  // kernel), page 16 and page 1.
  kernel_options = {};
  for (int hq : {16, 48}) {
    for (int ps : {16, 1}) {
      const uint64_t s = seed_ + 81 + uint64_t(hq + ps);
      SCOPED_TRACE(::testing::Message() << "default route, hq " << hq << " page " << ps);
      check(mla_problem(ragged(5, 2500, {2, 6000}, s), ps, hq, DType::kBF16, s), 1.5e-2);
    }
  }
}

TEST_F(MlaDecode, HopperTmaPagesTailsAndRescales) {
  // The Hopper kernel copies whole 64-key tiles by TMA at page sizes >= 16 (one box per page
  // and atom column, or one per tile when the page is larger) and the last tile of a chunk
  // that ends past its keys by cp.async; mla_tma=0 copies every tile by cp.async. Both
  // against the reference on pages 16 / 64 / 128 / 256, bf16 and fp8 latents (fp8: raw tiles
  // of 5 half-width atom columns, widened in place), lengths with and without tails, a request
  // split over several chunks, and spike keys (add_spikes) every 1,500 keys.
  if (block_heads(DType::kBF16, 128) != 64) {
    PAGODA_SKIP_GPU_TEST("the Hopper MLA decode kernel does not run on this device");
  }
  int i = 0;
  for (const char* tma : {"1", "0"}) {
    kernel_options.cuda.mla_tma = std::atoi(tma) != 0;
    for (DType kv : {DType::kBF16, DType::kFp8E4M3}) {
      for (int ps : {16, 64, 128, 256}) {
        const uint64_t s = seed_ + 91 + uint64_t(i++);
        SCOPED_TRACE(::testing::Message() << "mla_tma=" << tma << " seed " << s << " page "
                                        << ps << " kv " << dtype_name(kv));
        const Problem p = mla_problem({64, 640, 1000, 4096, 129, 11000}, ps, 128, kv, s);
        HostData h = make_host_data(p);
        add_spikes(p, h, 700, 1500);
        check(p, h, kv == DType::kBF16 ? 1.5e-2 : 2e-2);
      }
    }
  }
  kernel_options = {};
}

TEST_F(MlaDecode, HopperFewHeadsTransposed) {
  // h_q <= 16 runs the transposed kernel (keys fill the wgmma's 64 rows, heads are its N = 16):
  // h_q 1, 8 (rows past Hq zero) and 16, pages 1 / 16 / 64, bf16 and fp8, ragged lengths with
  // 1- and 2-key requests and a request split over chunks (partials and the merge), "spike"
  // keys (latent row x 12) that move one head's running max mid-chunk (lazy rescaling per
  // head), against the reference; then the same problems on the 64-row kernel
  // (mla_sm90_small=0) against the reference, and window, soft cap and sinks against the
  // generic kernel.
  if (block_heads(DType::kBF16, 16) != 16) {
    PAGODA_SKIP_GPU_TEST("the transposed Hopper MLA decode kernel does not run on this device");
  }
  int i = 0;
  for (const char* small : {"1", "0"}) {
    kernel_options.cuda.mla_sm90_small = std::atoi(small) != 0;
    for (DType kv : {DType::kBF16, DType::kFp8E4M3}) {
      for (int hq : {1, 8, 16}) {
        for (int ps : {1, 16, 64}) {
          const uint64_t s = seed_ + 201 + uint64_t(i++);
          SCOPED_TRACE(::testing::Message() << "mla_sm90_small=" << small << " hq " << hq
                                          << " page " << ps << " kv " << dtype_name(kv));
          const Problem p = mla_problem(ragged(5, 2500, {1, 2, 64, 65, 9000}, s), ps, hq, kv, s);
          HostData h = make_host_data(p);
          add_spikes(p, h, 300, 1700);
          check(p, h, kv == DType::kBF16 ? 1.5e-2 : 2e-2);
        }
      }
    }
  }
  kernel_options = {};
  Problem p = mla_problem(ragged(4, 3000, {8000}, seed_ + 251), 16, 16, DType::kBF16, seed_ + 251);
  p.params.window_left = 900;
  p.params.logit_cap = 30.f;
  std::vector<float> sinks(16);
  for (int h = 0; h < 16; ++h) sinks[h] = 0.1f * float(h) - 1.f;
  p.params.sinks = sinks;
  expect_matches_generic(p, make_host_data(p));
}

TEST_F(MlaDecode, SwitchOffAgreesWithGeneric) {
  for (DType kv : {DType::kBF16, DType::kFp8E4M3}) {
    const Problem p = mla_problem(ragged(5, 2500, {0, 12000}, seed_ + 31), 64, 128, kv, seed_ + 31);
    const HostData h = make_host_data(p);
    const MlaRun fast = expect_matches_generic(p, h);
    // The empty request (kv_len 0) writes zeros and LSE -inf on both paths.
    const Cmp r = compare(fast, reference_mla(p, h));
    EXPECT_LT(r.rel, 2e-2);
    EXPECT_LT(r.lse, 1e-3);
  }
}

// Small enough for compute-sanitizer (memcheck / racecheck: bench/device/run.sh --sanitize): a
// partial last tile, a 1-key request, a split request with its merge, both latent types.
TEST_F(MlaDecode, SanitizerSmall) {
  for (DType kv : {DType::kBF16, DType::kFp8E4M3}) {
    check(mla_problem({1, 70, 700, 2100}, 16, 32, kv, seed_ + 51), 2e-2);
  }
  // sm_90: the wgmma kernel, its TMA copies by page (16) and by tile inside a page (128), and
  // the fp8 producer's widening (the gather at page 1).
  for (DType kv : {DType::kBF16, DType::kFp8E4M3}) {
    const uint64_t s = seed_ + 52 + (kv == DType::kBF16 ? 0 : 10);
    check(mla_problem({1, 70, 700, 2100}, 16, 64, kv, s), 2e-2);
    check(mla_problem({1, 70, 700, 2100}, 128, 64, kv, s + 1), 2e-2);
  }
  check(mla_problem({1, 70, 700, 2100}, 1, 64, DType::kFp8E4M3, seed_ + 64), 2e-2);
  // The transposed kernel (16 heads and fewer), both latents, TMA (page 16) and gather (page 1).
  for (DType kv : {DType::kBF16, DType::kFp8E4M3}) {
    check(mla_problem({1, 70, 700, 2100}, 16, 16, kv, seed_ + 65), 2e-2);
    check(mla_problem({1, 70, 700, 2100}, 1, 8, kv, seed_ + 66), 2e-2);
  }
}

TEST_F(MlaDecode, PrefillShapesStayGeneric) {
  // qo_len > 1 (MLA extend) is not the decode kernel's: the schedule must route it elsewhere.
  Problem p = mla_problem({40, 300}, 16, 16, DType::kBF16, seed_ + 41);
  p.qo_lens = {3, 1};
  p.params.mask = attention::MaskKind::kNonCausal;  // the reference above has no causal mask
  check(p, 1.5e-2, "generic");
}

}  // namespace
}  // namespace pagoda::cuda_test
