/// Times pagoda's CUDA attention on the kernel benchmark shapes of bench/cuda/cases.json (the
/// file bench/cuda/peers.py reads for the same shapes) and prints one JSON object per case:
/// {"case", "ms" (median), "samples_ms" (every timed run), "bytes", "flops", "path", ...}.
///
/// Usage: pagoda_cuda_bench CASES.json OUT.jsonl [NAME-FILTER] [--kernel-option NAME=VALUE]...
/// (NAME-FILTER: comma-separated substrings, a case runs when its name contains one)
/// (kernel options: backends/kernel_options.h; each JSON object carries them as "kernel_options").
///
/// Timing policy (the same as bench/cuda/peers.py's, which mirrors triton.testing.do_bench):
/// pages shuffled in every case; inputs random (never zeros or a constant); 3 untimed warm-up
/// runs, then 30 timed runs, each preceded by an untimed write of a 256 MiB device buffer
/// (platform::CudaL2Flusher: 2x the L2, at least do_bench's 256 MiB) and timed alone between two
/// CUDA events on the launch stream; the median is reported with every sample.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/backends/cuda/cuda_batch_attention.h"
#include "pagoda/core/dtype.h"
#include "pagoda/platform/cuda/cuda_timing.h"

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
  int bs = 0;
  int qo = 0;      // query tokens per request
  int prefix = 0;  // cached keys before the new tokens (kv = prefix + qo)
  int page_size = 0;
  DType kv = DType::kBF16;
  bool tree = false;  // a random draft tree mask (else causal)
  int hq = 32, hkv = 8, d = 128;
  int dv = 0;          // V head dim (0: d)
  bool latent = false;  // absorbed MLA: V is a strided view of K's first dv elements
};

/// The cases of bench/cuda/cases.json ("defaults" fill the fields a case leaves out).
std::vector<Case> load_cases(const char* path) {
  std::ifstream f(path);
  if (!f) {
    std::fprintf(stderr, "cannot open %s\n", path);
    std::exit(2);
  }
  const nlohmann::json doc = nlohmann::json::parse(f);
  std::vector<Case> out;
  for (const auto& j0 : doc.at("cases")) {
    nlohmann::json j = doc.at("defaults");
    j.update(j0);
    Case c;
    c.name = j.at("name").get<std::string>();
    c.bs = j.at("batch").get<int>();
    c.qo = j.at("qo").get<int>();
    c.prefix = j.at("prefix").get<int>();
    c.page_size = j.at("page").get<int>();
    const auto kv = parse_dtype(j.at("kv").get<std::string>());
    if (!kv) {
      std::fprintf(stderr, "%s: unknown kv dtype\n", c.name.c_str());
      std::exit(2);
    }
    c.kv = *kv;
    c.tree = j.at("tree").get<bool>();
    c.hq = j.at("hq").get<int>();
    c.hkv = j.at("hkv").get<int>();
    c.d = j.at("d").get<int>();
    c.dv = j.at("dv").get<int>();
    c.latent = j.at("latent").get<bool>();
    out.push_back(c);
  }
  return out;
}

void run_case(const Case& c, const backends::KernelOptions& kernels, FILE* out) {
  const int dv = c.dv > 0 ? c.dv : c.d;
  const int kv_len = c.prefix + c.qo;
  const int pages_per = (kv_len + c.page_size - 1) / c.page_size;
  const int64_t num_pages = int64_t(c.bs) * pages_per + 1;
  std::vector<int32_t> ids(size_t(num_pages - 1));
  std::iota(ids.begin(), ids.end(), 1);
  std::mt19937_64 rng(42);
  std::shuffle(ids.begin(), ids.end(), rng);  // every case: pages out of order
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
  const size_t v_bytes = c.latent ? 0 : size_t(num_pages) * c.page_size * c.hkv * dv * kvb;
  void *q, *k, *v = nullptr, *o;
  CK(cudaMalloc(&q, size_t(nnz) * c.hq * c.d * 2));
  CK(cudaMalloc(&o, size_t(nnz) * c.hq * dv * 2));
  CK(cudaMalloc(&k, cache_bytes));
  fill_random(q, size_t(nnz) * c.hq * c.d * 2, DType::kBF16, 1);
  fill_random(k, cache_bytes, c.kv, 2);
  if (!c.latent) {
    CK(cudaMalloc(&v, v_bytes));
    fill_random(v, v_bytes, c.kv, 3);
  }
  const Device dev = Device::cuda(0);
  TensorView qv(q, DType::kBF16, {nnz, c.hq, c.d}, dev);
  TensorView ov(o, DType::kBF16, {nnz, c.hq, dv}, dev);
  TensorView kc(k, c.kv, {num_pages, c.page_size, c.hkv, c.d}, dev);
  TensorView vc = c.latent ? TensorView(k, c.kv, {num_pages, c.page_size, 1, dv},
                                        {int64_t{c.page_size} * c.d, c.d, c.d, 1}, dev)
                           : TensorView(v, c.kv, {num_pages, c.page_size, c.hkv, dv}, dev);
  CudaBatchAttention attn(nullptr, kernels);
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
  rp.mask = attention::MaskKind::kCausal;  // the tree cases' custom mask overrides it
  platform::CudaEventTimer timer(nullptr);  // the legacy default stream, which attn launches on
  platform::CudaL2Flusher flusher(nullptr);
  for (int i = 0; i < 3; ++i) attn.run(qv, kc, vc, ov, TensorView(), rp);
  CK(cudaDeviceSynchronize());
  std::vector<double> ts;
  for (int i = 0; i < 30; ++i) {
    flusher.flush();
    timer.start();
    attn.run(qv, kc, vc, ov, TensorView(), rp);
    ts.push_back(timer.stop_ms());
  }
  CK(cudaGetLastError());
  std::vector<double> sorted = ts;
  std::sort(sorted.begin(), sorted.end());
  const double ms = sorted[sorted.size() / 2];
  const double kv_bytes = double(c.bs) * kv_len * c.hkv * (c.d + (c.latent ? 0 : dv)) * kvb;
  const double qo_bytes = double(nnz) * c.hq * (c.d + dv) * 2;
  double visible = 0;  // (query, key) pairs per head
  for (int i = 0; i < c.qo; ++i) {
    if (c.tree) {
      visible += c.prefix + 1;  // approximate: prefix + own path
    } else {
      visible += c.prefix + i + 1;
    }
  }
  const double flops = 2.0 * c.bs * visible * c.hq * (c.d + dv);
  nlohmann::json j;
  j["case"] = c.name;
  j["ms"] = ms;
  j["samples_ms"] = ts;
  j["bytes"] = kv_bytes + qo_bytes;
  j["flops"] = flops;
  j["path"] = std::string(backends::cuda::kernel_path_name(attn.path()));
  for (const auto& [name, value] : backends::kernel_option_values(kernels)) {
    j["kernel_options"][name] = value;
  }
  j["chunk"] = attn.schedule().chunk_tokens;
  j["items"] = attn.schedule().num_items();
  // Which prefill kernel the plan was made for (an A/B of kernel options must show it).
  j["sm90"] = attn.schedule().sm90_prefill;
  j["flush_bytes"] = flusher.buffer_bytes();
  std::fprintf(out, "%s\n", j.dump().c_str());
  std::fflush(out);
  cudaFree(q);
  cudaFree(o);
  cudaFree(k);
  if (v != nullptr) cudaFree(v);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: pagoda_cuda_bench CASES.json OUT.jsonl [NAME-FILTER] "
                         "[--kernel-option NAME=VALUE]...\n");
    return 2;
  }
  // Then: an optional name filter (only the cases whose name contains one of its
  // comma-separated parts) and kernel options.
  std::string filter;
  backends::KernelOptions kernels;
  for (int i = 3; i < argc; ++i) {
    if (std::strcmp(argv[i], "--kernel-option") == 0 && i + 1 < argc) {
      try {
        backends::set_kernel_option(kernels, argv[++i]);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "pagoda_cuda_bench: %s\n", e.what());
        return 2;
      }
    } else {
      filter = argv[i];
    }
  }
  const std::vector<Case> cases = load_cases(argv[1]);
  FILE* out = std::fopen(argv[2], "w");
  if (out == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", argv[2]);
    return 2;
  }
  auto wanted = [&](const std::string& name) {
    if (filter.empty()) return true;
    for (size_t b = 0; b <= filter.size();) {
      const size_t e = std::min(filter.find(',', b), filter.size());
      if (e > b && name.find(filter.substr(b, e - b)) != std::string::npos) return true;
      b = e + 1;
    }
    return false;
  };
  for (const Case& c : cases) {
    if (!wanted(c.name)) continue;
    run_case(c, kernels, out);
    std::printf("done %s\n", c.name.c_str());
  }
  std::fclose(out);
  return 0;
}
