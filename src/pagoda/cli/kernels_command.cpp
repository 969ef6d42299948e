// `pagoda kernels`: times one BatchAttention implementation (cpu, reference, cuda) on a
// synthetic paged shape with one timer for every backend (KernelClock: wall clock on the host,
// CUDA events on the GPU; cache flush before every timed run, by default on the GPU, as
// triton.testing.do_bench does for the Python peers) and reports ms, GB/s, TFLOP/s
// beside the ceilings measured in the same run: copy bandwidth and GEMM rate for every backend,
// plus the host streaming-read bandwidth for CPU decode (its historical "peak").
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <omp.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "pagoda/attention/batch_attention.h"
#include "pagoda/backends/reference/reference_batch_attention.h"
#include "pagoda/cli/commands.h"
#include "pagoda/cli/kernel_clock.h"
#include "pagoda/cli/kernel_options_flag.h"
#include "pagoda/cli/kernels_dsa.h"
#include "pagoda/cli/kernels_linear.h"
#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"
#include "pagoda/platform/platform.h"
#ifdef PAGODA_CLI_HAVE_CPU_BACKEND
#include "pagoda/backends/cpu/cpu_batch_attention.h"
#include "pagoda/kernels/cpu/paged_attention.h"
#endif
#ifdef PAGODA_HAVE_AMX_BACKEND
#include "pagoda/backends/amx/amx_backend.h"
#endif
#ifdef PAGODA_CLI_HAVE_CUDA
#include "pagoda/backends/cuda/cuda_batch_attention.h"
#include "pagoda/platform/cuda/cuda_platform.h"
#endif

namespace pagoda::cli {
namespace {

struct KernelsArgs {
  std::string backend = "cpu";
  std::string op = "decode";
  int batch = 16;
  int kv_len = 8192;
  int q_len = 0;  // 0: 1 for decode, 8 for verify, kv_len for extend
  int q_heads = 32;
  int kv_heads = 8;
  int head_dim = 128;
  int head_dim_v = 0;  // 0: head_dim
  int page_size = 16;
  std::string kv_dtype = "bf16";
  std::string q_dtype = "bf16";
  int threads = 0;
  int iters = 20;
  int warmup = 3;
  int flush_l2 = 0;  // +1 --flush-l2, -1 --no-flush-l2, 0: the backend's default (flush_default)
  backends::KernelOptions kernels;  // --kernel-option
  bool json = false;
  // --op linear-*: the Mamba2 shape beyond --q-heads (H) and --head-dim (P); --kv-len is a
  // prefill's tokens per sequence.
  int state_size = 128;
  int groups = 1;
  int conv_kernel = 4;
  int chunk_size = 256;
  // --op dsa-decode: the indexer's shape (--q-heads is the MLA query heads).
  int index_heads = 64;
  int index_dim = 128;
  int topk = 2048;
};

using Clock = std::chrono::steady_clock;

/// The backends this build can time, for the --backend check (before anything is allocated).
std::vector<std::string> known_backends() {
  std::vector<std::string> names{"reference"};
#ifdef PAGODA_CLI_HAVE_CPU_BACKEND
  names.push_back("cpu");
#endif
#ifdef PAGODA_HAVE_AMX_BACKEND
  names.push_back("amx");
#endif
#ifdef PAGODA_CLI_HAVE_CUDA
  names.push_back("cuda");
#endif
  return names;
}

std::unique_ptr<attention::BatchAttention> make_attention(const std::string& name, int threads,
                                                          const backends::KernelOptions& kernels) {
  (void)threads;
  (void)kernels;
  if (name == "reference") return backends::make_reference_batch_attention();
#ifdef PAGODA_CLI_HAVE_CPU_BACKEND
  if (name == "cpu") {
    return backends::make_cpu_batch_attention({.num_threads = threads,
                                               .bf16_tiles = kernels.cpu_bf16,
                                               .bf16_decode = kernels.cpu_bf16_decode});
  }
#endif
#ifdef PAGODA_HAVE_AMX_BACKEND
  if (name == "amx") {
    // oneDNN's matmuls run on the OpenMP pool: size it to --threads like the cpu kernels.
    omp_set_num_threads(threads);
    return backends::make_amx_batch_attention({.decode = {.num_threads = threads,
                                                          .bf16_tiles = kernels.cpu_bf16,
                                                          .bf16_decode = kernels.cpu_bf16_decode,
                                                          .amx_decode = kernels.amx_decode},
                                               .tiles = kernels.amx_tiles});
  }
#endif
#ifdef PAGODA_CLI_HAVE_CUDA
  if (name == "cuda") return backends::cuda::make_cuda_batch_attention(kernels);
#endif
  throw_error(ErrorCode::kUnsupported, "kernels: unknown backend '{}'", name);
}

/// Whether the last cache level is flushed before every timed run when neither --flush-l2 nor
/// --no-flush-l2 is given: on the GPU yes (the peers' triton.testing.do_bench zeroes a 256 MiB
/// buffer before every repetition), on the host no (bench/cpu_vs_torch.py times torch without a
/// flush). One default per side of each comparison, so both sides run under one policy.
bool flush_default(const std::string& backend) { return backend == "cuda"; }

/// Where the timed tensors live: host buffers from the CPU platform's allocator (as the engine's
/// KV pool: 2 MiB aligned, transparent huge pages where the kernel grants them), or device copies
/// (cuda). The KV copies are rotated between iterations; every copy holds its own random values
/// (constant data would let the tensor cores run cooler and faster than on real K/V).
struct KernelBuffers {
  Device device = Device::cpu();
  std::vector<void*> k, v;  // per copy; v empty for MLA
  void* q = nullptr;
  void* out = nullptr;
  std::unique_ptr<platform::Platform> cpu = platform::make_cpu_platform();
  std::vector<platform::DeviceBuffer> host;  // owners on the host
#ifdef PAGODA_CLI_HAVE_CUDA
  std::unique_ptr<platform::Platform> gpu;
  std::vector<platform::DeviceBuffer> dev;  // owners on the device
#endif

  void* keep(std::vector<unsigned char> buf) {
#ifdef PAGODA_CLI_HAVE_CUDA
    if (gpu) {
      dev.push_back(platform::make_buffer(gpu->allocator(), std::max<size_t>(buf.size(), 1)));
      gpu->allocator().copy_to_device(dev.back().get(), buf.data(), buf.size());
      return dev.back().get();
    }
#endif
    host.push_back(platform::make_buffer(cpu->allocator(), std::max<size_t>(buf.size(), 1)));
    if (!buf.empty()) std::memcpy(host.back().get(), buf.data(), buf.size());
    return host.back().get();
  }
};

/// A buffer of `n` elements of `t` filled with uniform values in [-1, 1]: a block of 2^20
/// random elements repeated (timing does not depend on the values; GiB-sized KV fills stay fast).
std::vector<unsigned char> random_buffer(DType t, size_t n, std::mt19937_64& rng) {
  const size_t es = dtype_size(t);
  std::vector<unsigned char> buf(n * es);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  const size_t block = std::min(n, size_t{1} << 20);
  for (size_t i = 0; i < block; ++i) write_from_f32(buf.data(), t, i, uni(rng));
  for (size_t off = block; off < n; off += block) {
    std::memcpy(buf.data() + off * es, buf.data(), std::min(block, n - off) * es);
  }
  return buf;
}

void run_kernels(const KernelsArgs& a) {
  if (a.op.starts_with("linear-")) {
    run_linear_kernels({.backend = a.backend, .op = a.op, .batch = a.batch, .tokens = a.kv_len,
                        .heads = a.q_heads, .head_dim = a.head_dim, .state_size = a.state_size,
                        .groups = a.groups, .conv_kernel = a.conv_kernel,
                        .chunk_size = a.chunk_size, .iters = a.iters, .warmup = a.warmup,
                        .threads = std::max(1, a.threads), .json = a.json});
    return;
  }
  const auto kv_dtype = parse_dtype(a.kv_dtype);
  const auto q_dtype = parse_dtype(a.q_dtype);
  PAGODA_REQUIRE(kv_dtype && q_dtype, kInvalidArgument, "kernels: unknown dtype '{}' / '{}'",
                 a.kv_dtype, a.q_dtype);
  if (a.op == "dsa-decode") {
    run_dsa_kernels({.backend = a.backend,
                     .batch = a.batch,
                     .kv_len = a.kv_len,
                     .q_heads = a.q_heads,
                     .page_size = a.page_size,
                     .kv_dtype = *kv_dtype,
                     .index_heads = a.index_heads,
                     .index_dim = a.index_dim,
                     .topk = a.topk,
                     .iters = a.iters,
                     .warmup = a.warmup,
                     .threads = std::max(1, a.threads),
                     .json = a.json});
    return;
  }
  PAGODA_REQUIRE(a.op == "decode" || a.op == "extend" || a.op == "verify", kInvalidArgument,
                 "kernels: --op must be decode, extend, verify, linear-decode, linear-prefill or "
                 "dsa-decode (got '{}')",
                 a.op);
  PAGODA_REQUIRE(a.batch >= 1 && a.kv_len >= 1 && a.page_size >= 1 && a.iters >= 1 &&
                     a.q_heads >= 1 && a.kv_heads >= 1 && a.head_dim >= 1 && a.threads >= 0 &&
                     a.warmup >= 0,
                 kInvalidArgument, "kernels: sizes must be positive");
  const auto names = known_backends();
  PAGODA_REQUIRE(std::find(names.begin(), names.end(), a.backend) != names.end(), kUnsupported,
                 "kernels: unknown --backend '{}' (this build has: {})", a.backend,
                 fmt::join(names, ", "));
  const int threads = a.threads > 0 ? a.threads : omp_get_max_threads();
  const int q_len = a.q_len > 0 ? a.q_len : (a.op == "decode" ? 1 : a.op == "verify" ? 8 : a.kv_len);
  PAGODA_REQUIRE(q_len <= a.kv_len, kInvalidArgument, "kernels: --q-len {} > --kv-len {}", q_len,
                 a.kv_len);
  const int dv = a.head_dim_v > 0 ? a.head_dim_v : a.head_dim;
  const bool mla = dv != a.head_dim;  // V is a strided view of K's first dv elements
  PAGODA_REQUIRE(!mla || (a.kv_heads == 1 && dv < a.head_dim), kInvalidArgument,
                 "kernels: --head-dim-v != --head-dim means MLA (kv heads 1, Dv < Dqk)");

  // Per-dimension bounds first (so sums such as Dqk + Dv stay far from int overflow), then the
  // shape products in int64 / double, bounded before anything is allocated: page and row indices
  // are int32, and the buffers must fit in memory.
  PAGODA_REQUIRE(a.q_heads <= 4096 && a.kv_heads <= 4096, kInvalidArgument,
                 "kernels: --q-heads {} / --kv-heads {} above 4096", a.q_heads, a.kv_heads);
  PAGODA_REQUIRE(a.head_dim <= 4096 && dv <= 4096, kInvalidArgument,
                 "kernels: --head-dim {} / --head-dim-v {} above 4096", a.head_dim, dv);
  const int64_t pages_wanted =
      int64_t{a.batch} * ((int64_t{a.kv_len} + a.page_size - 1) / a.page_size);
  const int64_t rows_wanted = int64_t{a.batch} * q_len;
  PAGODA_REQUIRE(pages_wanted <= INT32_MAX && rows_wanted <= INT32_MAX, kInvalidArgument,
                 "kernels: {} pages / {} query rows exceed int32 indexing", pages_wanted,
                 rows_wanted);
  const double kv_gib = static_cast<double>(pages_wanted) * a.page_size * a.kv_heads *
                        a.head_dim * static_cast<double>(dtype_size(*kv_dtype)) * (mla ? 1 : 2) /
                        static_cast<double>(1ull << 30);
  const double q_gib = static_cast<double>(rows_wanted) * a.q_heads * (a.head_dim + dv) *
                       static_cast<double>(dtype_size(*q_dtype)) / static_cast<double>(1ull << 30);
  // verify: one bit per (query, key) per request.
  const double mask_gib = a.op == "verify" ? static_cast<double>(a.batch) * q_len *
                                                 static_cast<double>(a.kv_len) / 8 /
                                                 static_cast<double>(1ull << 30)
                                           : 0.0;
  PAGODA_REQUIRE(kv_gib + q_gib + mask_gib <= 64.0, kResourceExhausted,
                 "kernels: this shape needs {:.1f} GiB of KV, {:.1f} GiB of q/out and {:.1f} GiB "
                 "of mask (limit 64)",
                 kv_gib, q_gib, mask_gib);

  // Page table: every request owns ceil(kv_len / page_size) pages, in a shuffled order.
  std::mt19937_64 rng(1234);
  const int pages_per_req = (a.kv_len + a.page_size - 1) / a.page_size;
  const int num_pages = a.batch * pages_per_req;
  std::vector<int32_t> qo_indptr{0}, kv_indptr{0}, last(a.batch), indices(num_pages);
  std::iota(indices.begin(), indices.end(), 0);
  std::shuffle(indices.begin(), indices.end(), rng);
  for (int b = 0; b < a.batch; ++b) {
    qo_indptr.push_back(qo_indptr.back() + q_len);
    kv_indptr.push_back(kv_indptr.back() + pages_per_req);
    last[b] = a.kv_len - (pages_per_req - 1) * a.page_size;
  }
  std::vector<uint8_t> mask;
  std::vector<int64_t> mask_indptr;
  if (a.op == "verify") {  // a random tree: prefix visible, draft j sees its random ancestors
    mask_indptr.push_back(0);
    for (int b = 0; b < a.batch; ++b) {
      const int64_t bits = int64_t{q_len} * a.kv_len;
      std::vector<uint8_t> m(static_cast<size_t>((bits + 7) / 8));
      std::vector<int> parent(q_len, -1);
      for (int i = 1; i < q_len; ++i) parent[i] = static_cast<int>(rng() % i);
      const int prefix = a.kv_len - q_len;
      for (int i = 0; i < q_len; ++i) {
        auto set = [&](int64_t j) { const int64_t bit = int64_t{i} * a.kv_len + j; m[bit / 8] |= uint8_t(1u << (bit % 8)); };
        for (int j = 0; j < prefix; ++j) set(j);
        for (int x = i; x >= 0; x = parent[x]) set(prefix + x);
      }
      mask.insert(mask.end(), m.begin(), m.end());
      mask_indptr.push_back(static_cast<int64_t>(mask.size()));
    }
  }

  // KV copies rotated between iterations so small problems do not run from cache.
  const int64_t kv_row = int64_t{a.kv_heads} * a.head_dim;
  const int64_t kv_elems = int64_t{num_pages} * a.page_size * kv_row;
  const double kv_bytes = static_cast<double>(kv_elems) * dtype_size(*kv_dtype) * (mla ? 1 : 2);
  const int copies = static_cast<int>(std::clamp(std::ceil(512e6 / kv_bytes), 1.0, 8.0));
  KernelBuffers bufs;
  const bool on_gpu = a.backend == "cuda";
#ifdef PAGODA_CLI_HAVE_CUDA
  if (on_gpu) {
    bufs.gpu = platform::make_cuda_platform();
    PAGODA_REQUIRE(bufs.gpu != nullptr, kUnsupported, "kernels: --backend cuda needs a GPU (none found)");
    bufs.device = bufs.gpu->device();
  }
#endif
  for (int c = 0; c < copies; ++c) {
    bufs.k.push_back(bufs.keep(random_buffer(*kv_dtype, static_cast<size_t>(kv_elems), rng)));
    if (!mla) bufs.v.push_back(bufs.keep(random_buffer(*kv_dtype, static_cast<size_t>(kv_elems), rng)));
  }
  const int nnz = qo_indptr.back();
  bufs.q = bufs.keep(random_buffer(*q_dtype, static_cast<size_t>(nnz) * a.q_heads * a.head_dim, rng));
  bufs.out = bufs.keep(
      std::vector<unsigned char>(static_cast<size_t>(nnz) * a.q_heads * dv * dtype_size(*q_dtype)));

  auto attn = make_attention(a.backend, threads, a.kernels);
  const bool flush = a.flush_l2 != 0 ? a.flush_l2 > 0 : flush_default(a.backend);
  auto clock = on_gpu ? make_cuda_clock(flush) : make_host_clock(threads, flush);
  const attention::PagedPlanInput in{.qo_indptr = qo_indptr, .kv_indptr = kv_indptr,
                                     .kv_indices = indices, .kv_last_page_len = last,
                                     .page_size = a.page_size, .custom_mask = mask,
                                     .mask_indptr = mask_indptr};
  const attention::AttentionShape shape{.num_qo_heads = a.q_heads, .num_kv_heads = a.kv_heads,
                                        .head_dim_qk = a.head_dim, .head_dim_v = dv,
                                        .q_dtype = *q_dtype, .kv_dtype = *kv_dtype,
                                        .out_dtype = *q_dtype};
  const auto tp = Clock::now();
  attn->plan(in, shape);
  const double plan_ms = seconds_since(tp) * 1e3;
  const attention::RunParams params{.sm_scale = 1.f / std::sqrt(static_cast<float>(a.head_dim))};
  const Device dev = bufs.device;
  const TensorView q(bufs.q, *q_dtype, {nnz, a.q_heads, a.head_dim}, dev);
  const TensorView out(bufs.out, *q_dtype, {nnz, a.q_heads, dv}, dev);
  auto run_once = [&](int it) {
    void* kb = bufs.k[static_cast<size_t>(it % copies)];
    const TensorView k(kb, *kv_dtype, {num_pages, a.page_size, a.kv_heads, a.head_dim}, dev);
    const TensorView v =
        mla ? TensorView(kb, *kv_dtype, {num_pages, a.page_size, 1, dv},
                         {int64_t{a.page_size} * a.head_dim, a.head_dim, a.head_dim, 1}, dev)
            : TensorView(bufs.v[static_cast<size_t>(it % copies)], *kv_dtype,
                         {num_pages, a.page_size, a.kv_heads, dv}, dev);
    attn->run(q, k, v, out, TensorView(), params);
  };
  // Warm-up (untimed), then each timed run between clock->start() and clock->stop_ms(); the
  // flush (when on) comes before start().
  for (int w = 0; w < a.warmup; ++w) run_once(w);
  std::vector<double> ms;
  for (int it = 0; it < a.iters; ++it) {
    if (flush) clock->flush();
    clock->start();
    run_once(it);
    ms.push_back(clock->stop_ms());
  }
  const double t_ms = median(ms);

  // Work: bytes touched (Q + K + V + O) and FLOPs over visible (query, key) pairs.
  const double kv_read = static_cast<double>(a.batch) * a.kv_len * a.kv_heads *
                         (a.head_dim + (mla ? 0 : dv)) * dtype_size(*kv_dtype);
  const double bytes = kv_read + static_cast<double>(nnz) * a.q_heads * (a.head_dim + dv) *
                                     dtype_size(*q_dtype);
  double pairs = 0;  // per request
  if (a.op == "verify") {
    for (uint8_t byte : mask) pairs += std::popcount(static_cast<unsigned>(byte));
    pairs /= a.batch;
  } else {
    for (int i = 0; i < q_len; ++i) pairs += std::min(a.kv_len, a.kv_len - q_len + i + 1);
  }
  const double flops = 2.0 * pairs * a.batch * a.q_heads * (a.head_dim + dv);
  const double gbps = bytes / (t_ms * 1e-3) / 1e9;
  const double tflops = flops / (t_ms * 1e-3) / 1e12;
  const bool memory_bound = a.op == "decode";
  // Same-run ceilings, measured after the timed loop.
  const double copy_gbps = clock->copy_gbps();
  const double gemm_tflops = clock->gemm_tflops();
  const double pct_copy = copy_gbps > 0 ? 100.0 * gbps / copy_gbps : 0.0;
  const double pct_gemm = gemm_tflops > 0 ? 100.0 * tflops / gemm_tflops : 0.0;
  // The headline peak: host streaming read for CPU decode (as before), else copy / GEMM.
  const bool host_read_peak = memory_bound && !on_gpu;
  const double peak = host_read_peak ? measure_host_read_gbps(threads)
                                     : (memory_bound ? copy_gbps : gemm_tflops);
  const double pct = peak > 0 ? 100.0 * (memory_bound ? gbps : tflops) / peak : 0.0;
  // Host names as before this clock existed (bench/cpu_vs_torch.py reads them).
  const std::string peak_kind = host_read_peak ? "stream_read_gbps"
                                : !on_gpu      ? "sgemm_tflops"
                                : memory_bound ? clock->copy_name() + "_gbps"
                                               : clock->gemm_name() + "_tflops";

  nlohmann::json j;
  j["backend"] = a.backend;
  j["kernel_options"] = kernel_options_json(a.kernels);
  j["op"] = a.op;
  j["batch"] = a.batch;
  j["kv_len"] = a.kv_len;
  j["q_len"] = q_len;
  j["q_heads"] = a.q_heads;
  j["kv_heads"] = a.kv_heads;
  j["head_dim"] = a.head_dim;
  j["head_dim_v"] = dv;
  j["page_size"] = a.page_size;
  j["kv_dtype"] = std::string(dtype_name(*kv_dtype));
  j["q_dtype"] = std::string(dtype_name(*q_dtype));
  j["threads"] = threads;
#ifdef PAGODA_CLI_HAVE_CPU_BACKEND
  j["simd"] = kernels::cpu::cpu_simd_target_name();
#endif
  j["iters"] = a.iters;
  j["warmup"] = a.warmup;
  j["timer"] = clock->timer_name();
  j["flush_l2"] = flush;
  j["flush_bytes"] = clock->flush_bytes();
  j["kv_copies"] = copies;
  j["plan_ms"] = plan_ms;
  j["ms"] = t_ms;
  j["ms_min"] = *std::min_element(ms.begin(), ms.end());
  j["samples_ms"] = ms;  // every timed run, in order
  j["bytes"] = bytes;
  j["flops"] = flops;
  j["gbps"] = gbps;
  j["tflops"] = tflops;
  j["copy_kind"] = clock->copy_name();
  j["copy_gbps"] = copy_gbps;
  j["pct_of_copy"] = pct_copy;
  j["gemm_kind"] = clock->gemm_name();
  j["gemm_tflops"] = gemm_tflops;
  j["pct_of_gemm"] = pct_gemm;
  j["peak_kind"] = peak_kind;
  j["peak"] = peak;
  j["pct_of_peak"] = pct;
#ifdef PAGODA_CLI_HAVE_CUDA
  // Which CUDA kernel ran (decode, mla_decode, prefill, generic) and its split-KV plan.
  if (const auto* c = dynamic_cast<const backends::cuda::CudaBatchAttention*>(attn.get())) {
    j["path"] = std::string(backends::cuda::kernel_path_name(c->path()));
    j["chunk_tokens"] = c->schedule().chunk_tokens;
    j["work_items"] = c->schedule().num_items();
  }
#endif
  if (a.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s %s: %.3f ms (%s%s), %.1f GB/s = %.1f%% of %s %.1f GB/s, %.3f TFLOP/s = %.1f%% "
                "of %s %.2f TFLOP/s; headline %.1f%% of %s %.2f\n",
                a.backend.c_str(), a.op.c_str(), t_ms, clock->timer_name().c_str(),
                flush ? ", flushed" : "", gbps, pct_copy, clock->copy_name().c_str(),
                copy_gbps, tflops, pct_gemm, clock->gemm_name().c_str(), gemm_tflops, pct,
                peak_kind.c_str(), peak);
  }
}

}  // namespace

void add_kernels_command(CLI::App& app) {
  auto args = std::make_shared<KernelsArgs>();
  CLI::App* cmd = app.add_subcommand("kernels", "Time a BatchAttention backend on one shape");
  cmd->add_option("--backend", args->backend, "cpu | amx | reference | cuda (as built)")
      ->capture_default_str();
  add_kernel_option_flag(cmd, args->kernels);
  cmd->add_option("--op", args->op,
                  "decode | extend | verify (attention), linear-decode | linear-prefill (the "
                  "Mamba2 recurrence of a linear-attention backend; kernels_linear.h), "
                  "dsa-decode (an MLA decode step with the DSA indexer's selection vs dense; "
                  "kernels_dsa.h)")
      ->capture_default_str();
  cmd->add_option("--batch", args->batch, "requests")->capture_default_str();
  cmd->add_option("--kv-len", args->kv_len,
                  "keys per request (including the queries); linear-prefill: tokens per sequence")
      ->capture_default_str();
  cmd->add_option("--q-len", args->q_len, "queries per request (0: 1 decode, 8 verify, kv-len extend)");
  cmd->add_option("--q-heads", args->q_heads, "attention q heads; linear-*: Mamba2 heads (H)")
      ->capture_default_str();
  cmd->add_option("--kv-heads", args->kv_heads)->capture_default_str();
  cmd->add_option("--head-dim", args->head_dim, "Dqk; linear-*: the Mamba2 head dim (P)")
      ->capture_default_str();
  cmd->add_option("--state-size", args->state_size, "linear-*: d_state (N)")->capture_default_str();
  cmd->add_option("--groups", args->groups, "linear-*: B / C groups (G)")->capture_default_str();
  cmd->add_option("--conv-kernel", args->conv_kernel, "linear-*: d_conv (K)")->capture_default_str();
  cmd->add_option("--chunk-size", args->chunk_size, "linear-*: the SSD chunk hint")
      ->capture_default_str();
  cmd->add_option("--index-heads", args->index_heads, "dsa-decode: indexer heads")
      ->capture_default_str();
  cmd->add_option("--index-dim", args->index_dim, "dsa-decode: indexer head dim")
      ->capture_default_str();
  cmd->add_option("--topk", args->topk, "dsa-decode: tokens each row keeps")->capture_default_str();
  cmd->add_option("--head-dim-v", args->head_dim_v, "Dv (0: head-dim; smaller = MLA strided V)");
  cmd->add_option("--page-size", args->page_size)->capture_default_str();
  cmd->add_option("--kv-dtype", args->kv_dtype, "f32 | f16 | bf16 | fp8_e4m3 | fp8_e5m2")
      ->capture_default_str();
  cmd->add_option("--q-dtype", args->q_dtype, "f32 | f16 | bf16 (also the output dtype)")
      ->capture_default_str();
  cmd->add_option("--threads", args->threads, "0: all OpenMP threads");
  cmd->add_option("--iters", args->iters, "timed iterations (median reported)")
      ->capture_default_str();
  cmd->add_option("--warmup", args->warmup, "untimed runs before the timed ones")
      ->capture_default_str();
  cmd->add_flag("--flush-l2,!--no-flush-l2", args->flush_l2,
                "before each timed run, write a buffer of 2x the L2 (GPU, at least 256 MiB) / LLC "
                "(host), untimed; default: on for cuda, off for cpu and reference");
  cmd->add_flag("--json", args->json, "print one JSON object");
  cmd->callback([args] { run_kernels(*args); });
}

}  // namespace pagoda::cli
