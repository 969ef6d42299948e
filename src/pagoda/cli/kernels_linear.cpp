// `pagoda kernels --op linear-*`: one linear-attention backend on one Mamba2 shape (contract in
// kernels_linear.h).
#include "pagoda/cli/kernels_linear.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>
#include <omp.h>

#include "pagoda/attention/linear_backend.h"
#include "pagoda/attention/registry.h"
#include "pagoda/backends/builtin.h"
#include "pagoda/cli/kernel_clock.h"
#include "pagoda/core/error.h"
#include "pagoda/engine/engine.h"
#include "pagoda/kv/state_pool.h"

namespace pagoda::cli {
namespace {

/// `n` floats uniform in [lo, hi) in `platform`'s memory.
platform::DeviceBuffer random_floats(platform::Platform& platform, size_t n, float lo, float hi,
                                     std::mt19937_64& rng) {
  std::vector<float> host(n);
  std::uniform_real_distribution<float> uni(lo, hi);
  for (float& x : host) x = uni(rng);
  auto buf = platform::make_buffer(platform.allocator(), std::max<size_t>(n, 1) * sizeof(float));
  platform.allocator().copy_to_device(buf.get(), host.data(), n * sizeof(float));
  return buf;
}

}  // namespace

void run_linear_kernels(const LinearKernelArgs& a) {
  PAGODA_REQUIRE(a.op == "linear-decode" || a.op == "linear-prefill", kInvalidArgument,
                 "kernels: --op must be linear-decode or linear-prefill (got '{}')", a.op);
  PAGODA_REQUIRE(a.batch >= 1 && a.tokens >= 1 && a.iters >= 1 && a.warmup >= 0 && a.threads >= 1,
                 kInvalidArgument, "kernels: sizes must be positive");
  const int t_seq = a.op == "linear-decode" ? 1 : a.tokens;
  attention::LinearShape shape{.num_heads = a.heads, .head_dim = a.head_dim,
                               .state_size = a.state_size, .num_groups = a.groups,
                               .conv_kernel = a.conv_kernel, .chunk_size = a.chunk_size};
  shape.validate();
  const int64_t rows = int64_t{a.batch} * t_seq;
  const int64_t conv_dim = shape.conv_dim(), d_inner = shape.d_inner();
  const kv::StateShape ss = shape.state_shape();
  const double io_gib = static_cast<double>(rows) * static_cast<double>(conv_dim + a.heads + d_inner) *
                        4.0 / static_cast<double>(1ull << 30);
  PAGODA_REQUIRE(rows <= (int64_t{1} << 30) && io_gib <= 32.0, kResourceExhausted,
                 "kernels: {} rows need {:.1f} GiB of xBC / dt / y (limit 32)", rows, io_gib);
  // Layers: a decode's enough that the pool's states are >= 512 MiB (each sample walks all of
  // them once); a prefill's one (it starts from a zeroed state and reads T rows per sequence).
  const bool prefill = a.op == "linear-prefill";
  const double layer_bytes = static_cast<double>(ss.bytes()) * a.batch;
  const int layers =
      prefill ? 1 : static_cast<int>(std::clamp(std::ceil(512.0 * (1 << 20) / layer_bytes), 1.0, 64.0));
  PAGODA_REQUIRE(layer_bytes * layers <= 32.0 * (1ull << 30), kResourceExhausted,
                 "kernels: the states need {:.1f} GiB (limit 32)",
                 layer_bytes * layers / static_cast<double>(1ull << 30));

  const backends::BackendSelection selection{.attention = a.backend, .linear = a.backend};
  std::unique_ptr<platform::Platform> plat = engine::make_platform_for(selection);
  const bool on_gpu = plat->device().is_cuda();
  attention::BackendRegistry registry;
  backends::register_builtin_backends(registry);
  auto backend = backends::make_linear_backend(
      registry, selection, {.dtype = DType::kF32, .device = on_gpu ? "cuda" : "cpu"},
      {.platform = plat.get()});
  kv::StatePool pool(layers, a.batch, ss, *plat);
  std::vector<int32_t> slots;
  for (int b = 0; b < a.batch; ++b) slots.push_back(pool.alloc());

  std::mt19937_64 rng(1234);
  const size_t h = static_cast<size_t>(a.heads);
  auto conv_w = random_floats(*plat, static_cast<size_t>(conv_dim) * a.conv_kernel, -0.5f, 0.5f, rng);
  auto conv_b = random_floats(*plat, static_cast<size_t>(conv_dim), -0.1f, 0.1f, rng);
  auto dt_bias = random_floats(*plat, h, -2.f, 0.f, rng);
  auto a_log = random_floats(*plat, h, 0.f, 2.7f, rng);
  auto d = random_floats(*plat, h, 0.5f, 1.5f, rng);
  auto xbc = random_floats(*plat, static_cast<size_t>(rows * conv_dim), -1.f, 1.f, rng);
  auto dt = random_floats(*plat, static_cast<size_t>(rows) * h, -1.f, 1.f, rng);
  auto y = platform::make_buffer(plat->allocator(), static_cast<size_t>(rows * d_inner) * sizeof(float));
  const Device dev = plat->device();
  const TensorView xbc_v(xbc.get(), DType::kF32, {rows, conv_dim}, dev);
  const TensorView dt_v(dt.get(), DType::kF32, {rows, a.heads}, dev);
  const TensorView y_v(y.get(), DType::kF32, {rows, d_inner}, dev);
  const attention::LinearWeights weights{
      .conv = static_cast<const float*>(conv_w.get()),
      .conv_bias = static_cast<const float*>(conv_b.get()),
      .dt_bias = static_cast<const float*>(dt_bias.get()),
      .a_log = static_cast<const float*>(a_log.get()),
      .d = static_cast<const float*>(d.get())};
  std::vector<attention::LinearSeq> seqs;
  for (int32_t s : slots) seqs.push_back({.slot = s, .num_tokens = t_seq});

  // The host backends run on the ceilings' threads: OpenMP's here, OpenBLAS's set by the host
  // clock's sgemm (measured first, so the timed forwards see them too).
  omp_set_num_threads(a.threads);
  auto clock = on_gpu ? make_cuda_clock(/*flush=*/false) : make_host_clock(a.threads, false);
  const double copy_gbps = clock->copy_gbps();
  const double gemm_tflops = clock->gemm_tflops();
  // One sample: every layer once. A prefill starts each sample from a fresh state (the zeroing
  // is outside the timed interval; frees + allocs of the same slots).
  auto sample_ms = [&] {
    if (prefill) {
      for (int32_t s : slots) pool.free(s);
      for (int b = 0; b < a.batch; ++b) slots[static_cast<size_t>(b)] = pool.alloc();
      for (size_t i = 0; i < slots.size(); ++i) seqs[i].slot = slots[i];
    }
    backend->init_forward_metadata(pool, seqs);
    plat->synchronize_stream();
    const auto t0 = std::chrono::steady_clock::now();
    for (int l = 0; l < layers; ++l)
      backend->forward({.state_layer = l, .shape = shape, .weights = weights}, xbc_v, dt_v, y_v);
    plat->synchronize_stream();
    return seconds_since(t0) * 1e3 / layers;
  };
  for (int w = 0; w < a.warmup; ++w) sample_ms();
  std::vector<double> ms;
  for (int it = 0; it < a.iters; ++it) ms.push_back(sample_ms());
  const double t_ms = median(ms);

  const double state_bytes = static_cast<double>(ss.bytes()) * a.batch * 2;  // read + write
  const double row_bytes = static_cast<double>(rows) * static_cast<double>(conv_dim + a.heads + d_inner) * 4;
  const double bytes = state_bytes + row_bytes;
  const double flops = static_cast<double>(rows) *
                       (2.0 * static_cast<double>(conv_dim) * a.conv_kernel +
                        5.0 * static_cast<double>(ss.ssm_floats()));
  const double gbps = bytes / (t_ms * 1e-3) / 1e9;
  const double tflops = flops / (t_ms * 1e-3) / 1e12;

  nlohmann::json j;
  j["backend"] = backend->name();
  j["op"] = a.op;
  j["batch"] = a.batch;
  j["tokens"] = t_seq;
  j["heads"] = a.heads;
  j["head_dim"] = a.head_dim;
  j["state_size"] = a.state_size;
  j["groups"] = a.groups;
  j["conv_kernel"] = a.conv_kernel;
  j["chunk_size"] = a.chunk_size;
  j["layers"] = layers;
  j["iters"] = a.iters;
  j["warmup"] = a.warmup;
  j["timer"] = "steady_clock_synchronized";
  j["ms"] = t_ms;
  j["ms_min"] = *std::min_element(ms.begin(), ms.end());
  j["samples_ms"] = ms;
  j["bytes"] = bytes;
  j["state_bytes"] = state_bytes;
  j["flops"] = flops;
  j["gbps"] = gbps;
  j["tflops"] = tflops;
  j["tokens_per_s"] = static_cast<double>(rows) / (t_ms * 1e-3);
  j["copy_kind"] = clock->copy_name();
  j["copy_gbps"] = copy_gbps;
  j["pct_of_copy"] = copy_gbps > 0 ? 100.0 * gbps / copy_gbps : 0.0;
  j["gemm_kind"] = clock->gemm_name();
  j["gemm_tflops"] = gemm_tflops;
  j["pct_of_gemm"] = gemm_tflops > 0 ? 100.0 * tflops / gemm_tflops : 0.0;
  if (a.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s %s: %.4f ms per layer, %.1f GB/s = %.1f%% of %s %.1f GB/s, %.3f TFLOP/s = "
                "%.2f%% of %s %.2f TFLOP/s\n",
                j["backend"].get<std::string>().c_str(), a.op.c_str(), t_ms, gbps,
                j["pct_of_copy"].get<double>(), clock->copy_name().c_str(), copy_gbps, tflops,
                j["pct_of_gemm"].get<double>(), clock->gemm_name().c_str(), gemm_tflops);
  }
}

}  // namespace pagoda::cli
