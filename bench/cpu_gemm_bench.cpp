// The CPU model's bf16 GEMMs at the Llama-3.2-1B layout's projection shapes: pagoda's AMX GEMM
// (kernels/cpu/amx_linear.h, --cpu-gemm amx) against oneDNN's matmul (onednn_linear.h,
// --cpu-gemm onednn), the same f32 input rounded to bf16 by each, the weights packed once.
// Counters: GFLOP/s and the weights' bf16 bytes per second (decode is bound by the latter).
// Run with --benchmark_enable_random_interleaving=true --benchmark_repetitions=N so the two
// sides share the machine's noise; rows that cannot run here are skipped with the reason.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "pagoda/kernels/cpu/amx_linear.h"
#include "pagoda/kernels/cpu/onednn_linear.h"

namespace {

using pagoda::kernels::cpu::AmxLinear;
using pagoda::kernels::cpu::OnednnLinear;

std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

template <class Linear>
void run(benchmark::State& state, const std::string& why) {
  if (!why.empty()) {
    state.SkipWithError(why.c_str());
    return;
  }
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const std::vector<float> w = random_floats(static_cast<size_t>(n * k), 1);
  const std::vector<float> x = random_floats(static_cast<size_t>(m * k), 2);
  std::vector<float> y(static_cast<size_t>(m * n));
  std::unique_ptr<Linear> lin;
  if constexpr (std::is_same_v<Linear, AmxLinear>) {
    lin = std::make_unique<AmxLinear>(w.data(), n, k);
  } else {
    lin = std::make_unique<OnednnLinear>(w.data(), n, k, pagoda::DType::kBF16);
  }
  lin->forward(x.data(), y.data(), m);  // warm-up: caches, primitives
  for (auto _ : state) {
    lin->forward(x.data(), y.data(), m);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(m * n * k) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.counters["weight_GB/s"] = benchmark::Counter(2.0 * static_cast<double>(n * k) * 1e-9,
                                                     benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Amx(benchmark::State& state) { run<AmxLinear>(state, pagoda::kernels::cpu::amx_linear_unavailable()); }
void BM_Onednn(benchmark::State& state) {
  run<OnednnLinear>(state, pagoda::kernels::cpu::onednn_linear_unavailable(pagoda::DType::kBF16));
}

/// (M, N, K): q/k/v fused, o, gate/up fused, down of the 1B layout; M decode-sized and prefill.
void shapes(benchmark::internal::Benchmark* b) {
  for (int64_t m : {1, 8, 256, 1024})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{3072, 2048}, {2048, 2048}, {16384, 2048},
                        {2048, 8192}})
      b->Args({m, n, k});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_Amx)->Apply(shapes);
BENCHMARK(BM_Onednn)->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
