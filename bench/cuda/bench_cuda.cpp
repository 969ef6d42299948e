/// Times pagoda's CUDA attention on the H200 benchmark shapes (bench/cuda/run_h200.sh) and
/// prints one JSON object per case: {"case", "ms", "bytes", "flops", "path"}. Inputs are random
/// (never zeros); timings are the median of CUDA-event-timed single runs after warm-up.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "pagoda/backends/cuda/cuda_batch_attention.h"

using namespace pagoda;
using backends::cuda::CudaBatchAttention;

namespace {

#define CK(x)                                                                     \
  do {                                                                            \
    cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_));        \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

/// Random 16-bit (bf16/f16 in [-1, 1]) or e4m3 bytes, generated fast on the host.
void fill_random(void* dst, size_t bytes, DType t, uint64_t seed) {
  std::vector<uint8_t> h(bytes);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&]() {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  if (t == DType::kBF16) {
    auto* p = reinterpret_cast<uint16_t*>(h.data());
    for (size_t i = 0; i < bytes / 2; ++i) {
      const uint64_t r = next();
      p[i] = uint16_t(((r & 1) << 15) | ((119 + (r >> 1) % 8) << 7) | ((r >> 8) & 0x7F));
    }
  } else if (t == DType::kF16) {
    auto* p = reinterpret_cast<uint16_t*>(h.data());
    for (size_t i = 0; i < bytes / 2; ++i) {
      const uint64_t r = next();
      p[i] = uint16_t(((r & 1) << 15) | ((8 + (r >> 1) % 7) << 10) | ((r >> 8) & 0x3FF));
    }
  } else {
    for (size_t i = 0; i < bytes; ++i) {
      const uint64_t r = next();
      h[i] = uint8_t(((r & 1) << 7) | (((r >> 1) % 8) << 3) | ((r >> 4) & 7));
    }
  }
  CK(cudaMemcpy(dst, h.data(), bytes, cudaMemcpyHostToDevice));
}

struct Case {
  std::string name;
  int bs;
  int qo;          // query tokens per request
  int prefix;      // cached keys before the new tokens (kv = prefix + qo)
  int page_size;
  DType kv = DType::kBF16;
  bool permute = true;
  bool causal = true;
  bool tree = false;
  int hq = 32, hkv = 8, d = 128;
  int dv = 0;      // V head dim (0: d)
};

void run_case(const Case& c, FILE* out) {
  const int dv = c.dv > 0 ? c.dv : c.d;
  const int kv_len = c.prefix + c.qo;
  const int pages_per = (kv_len + c.page_size - 1) / c.page_size;
  const int64_t num_pages = int64_t(c.bs) * pages_per + 1;
  std::vector<int32_t> ids(size_t(num_pages - 1));
  std::iota(ids.begin(), ids.end(), 1);
  std::mt19937_64 rng(42);
  if (c.permute) std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> qo_indptr{0}, kv_indptr{0}, last;
  for (int b = 0; b < c.bs; ++b) {
    qo_indptr.push_back(qo_indptr.back() + c.qo);
    kv_indptr.push_back(kv_indptr.back() + pages_per);
    last.push_back(kv_len - (pages_per - 1) * c.page_size);
  }
  std::vector<uint8_t> mask;
  std::vector<int64_t> mask_indptr{0};
  if (c.tree) {
    for (int b = 0; b < c.bs; ++b) {
      std::vector<int> parent(c.qo, -1);
      for (int i = 1; i < c.qo; ++i) parent[i] = int(rng() % i);
      const int64_t bits = int64_t(c.qo) * kv_len;
      std::vector<uint8_t> seg((bits + 7) / 8, 0);
      for (int i = 0; i < c.qo; ++i) {
        auto set = [&](int j) { const int64_t bit = int64_t(i) * kv_len + j; seg[bit >> 3] |= uint8_t(1u << (bit & 7)); };
        for (int j = 0; j < c.prefix; ++j) set(j);
        for (int a = i; a >= 0; a = parent[a]) set(c.prefix + a);
      }
      mask.insert(mask.end(), seg.begin(), seg.end());
      mask_indptr.push_back(int64_t(mask.size()));
    }
  }
  const int nnz = qo_indptr.back();
  const size_t kvb = dtype_size(c.kv);
  const size_t cache_bytes = size_t(num_pages) * c.page_size * c.hkv * c.d * kvb;
  const size_t v_bytes = size_t(num_pages) * c.page_size * c.hkv * dv * kvb;
  void *q, *k, *v, *o;
  CK(cudaMalloc(&q, size_t(nnz) * c.hq * c.d * 2));
  CK(cudaMalloc(&o, size_t(nnz) * c.hq * dv * 2));
  CK(cudaMalloc(&k, cache_bytes));
  CK(cudaMalloc(&v, v_bytes));
  fill_random(q, size_t(nnz) * c.hq * c.d * 2, DType::kBF16, 1);
  fill_random(k, cache_bytes, c.kv, 2);
  fill_random(v, v_bytes, c.kv, 3);
  const Device dev = Device::cuda(0);
  TensorView qv(q, DType::kBF16, {nnz, c.hq, c.d}, dev);
  TensorView ov(o, DType::kBF16, {nnz, c.hq, dv}, dev);
  TensorView kc(k, c.kv, {num_pages, c.page_size, c.hkv, c.d}, dev);
  TensorView vc(v, c.kv, {num_pages, c.page_size, c.hkv, dv}, dev);
  CudaBatchAttention attn;
  attention::PagedPlanInput in{.qo_indptr = qo_indptr, .kv_indptr = kv_indptr,
                               .kv_indices = ids, .kv_last_page_len = last,
                               .page_size = c.page_size, .custom_mask = mask,
                               .mask_indptr = c.tree ? std::span<const int64_t>(mask_indptr)
                                                     : std::span<const int64_t>()};
  attention::AttentionShape shape{.num_qo_heads = c.hq, .num_kv_heads = c.hkv, .head_dim_qk = c.d,
                                  .head_dim_v = dv, .q_dtype = DType::kBF16, .kv_dtype = c.kv,
                                  .out_dtype = DType::kBF16};
  attn.plan(in, shape);
  attention::RunParams rp;
  rp.sm_scale = 1.f / std::sqrt(float(c.d));
  rp.mask = c.causal ? attention::MaskKind::kCausal : attention::MaskKind::kNonCausal;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) attn.run(qv, kc, vc, ov, TensorView(), rp);
  CK(cudaDeviceSynchronize());
  std::vector<float> ts;
  for (int i = 0; i < 30; ++i) {
    CK(cudaEventRecord(e0));
    attn.run(qv, kc, vc, ov, TensorView(), rp);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ts.push_back(ms);
  }
  CK(cudaGetLastError());
  std::sort(ts.begin(), ts.end());
  const double ms = ts[ts.size() / 2];
  const double kv_bytes = double(c.bs) * kv_len * c.hkv * (c.d + dv) * kvb;
  const double qo_bytes = double(nnz) * c.hq * (c.d + dv) * 2;
  double visible = 0;  // (query, key) pairs per head
  for (int i = 0; i < c.qo; ++i) {
    if (c.tree) {
      visible += c.prefix + 1;  // approximate: prefix + own path
    } else {
      visible += c.causal ? (c.prefix + i + 1) : kv_len;
    }
  }
  const double flops = 2.0 * c.bs * visible * c.hq * (c.d + dv);
  std::fprintf(out,
               "{\"case\": \"%s\", \"ms\": %.5f, \"bytes\": %.0f, \"flops\": %.0f, \"path\": "
               "\"%s\", \"chunk\": %d, \"items\": %d}\n",
               c.name.c_str(), ms, kv_bytes + qo_bytes, flops,
               std::string(backends::cuda::kernel_path_name(attn.path())).c_str(),
               attn.schedule().chunk_tokens, attn.schedule().num_items());
  std::fflush(out);
  cudaFree(q);
  cudaFree(o);
  cudaFree(k);
  cudaFree(v);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace

int main(int argc, char** argv) {
  FILE* out = argc > 1 ? std::fopen(argv[1], "w") : stdout;
  const std::vector<Case> cases = {
      {"decode_p16_b64_l4096", 64, 1, 4095, 16},
      {"decode_p1_b64_l4096", 64, 1, 4095, 1},
      {"decode_p16_b8_l32768", 8, 1, 32767, 16},
      {"decode_fp8_p16_b64_l4096", 64, 1, 4095, 16, DType::kFp8E4M3},
      {"prefill_causal_b4_s4096", 4, 4096, 0, 16, DType::kBF16, false},
      {"extend_q512_prefix8192_p16", 4, 512, 8192, 16},
      {"tree_verify_d64_prefix4096_b16", 16, 64, 4096, 16, DType::kBF16, true, true, true},
      {"prefill_causal_b1_s16384", 1, 16384, 0, 16, DType::kBF16, false},
      {"prefill_causal_b16_s1024", 16, 1024, 0, 16, DType::kBF16, false},
      // One prompt: few units per head, where the unit order decides how even the SMs' loads are.
      {"prefill_causal_b1_s4096", 1, 4096, 0, 16, DType::kBF16, false},
      {"prefill_causal_b4_s4096_p1", 4, 4096, 0, 1, DType::kBF16, false},
      {"prefill_causal_b4_s4096_d64", 4, 4096, 0, 16, DType::kBF16, false, true, false, 32, 8, 64},
      {"prefill_causal_b4_s4096_d256", 4, 4096, 0, 16, DType::kBF16, false, true, false, 32, 8, 256},
      // The non-absorbed MLA prefill (DeepSeek-V2-Lite: 16 heads, Q/K 128 nope + 64 rope, V 128).
      {"mla_prefill_b4_s4096_h16", 4, 4096, 0, 16, DType::kBF16, false, true, false, 16, 16, 192, 128},
      {"mla_prefill_b1_s8192_h16", 1, 8192, 0, 16, DType::kBF16, false, true, false, 16, 16, 192, 128},
      {"mla_extend_q512_prefix8192_h16", 4, 512, 8192, 16, DType::kBF16, true, true, false, 16, 16,
       192, 128},
      // fp8 e4m3 KV on the prefill path: the mma.sync prefill kernel, on Hopper too (the wgmma
      // kernel takes 16-bit KV only). Named without "prefill" / "extend", which the sm90 A/B
      // scripts filter on.
      {"fp8kv_causal_b4_s4096", 4, 4096, 0, 16, DType::kFp8E4M3, false},
      {"fp8kv_ext_q512_prefix8192", 4, 512, 8192, 16, DType::kFp8E4M3},
  };
  // argv[2]: run only the cases whose name contains it.
  const std::string filter = argc > 2 ? argv[2] : "";
  for (const Case& c : cases) {
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
    run_case(c, out);
    if (out != stdout) std::printf("done %s\n", c.name.c_str());
  }
  if (out != stdout) std::fclose(out);
  return 0;
}
