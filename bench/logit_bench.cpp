// bench_logit: the per-step cost of the penalties' logit entries (logit_processing.h) on long
// histories: a decode batch of 16 sequences with 8,192 tokens each (7,168 prompt + 1,024 output,
// vocab 32,000, uniform ids), presence, frequency and repetition penalties on. Each iteration is
// one decode step: every sequence appends one sampled token, its TokenCounts counts it, and the
// step's LogitAdjust entries are built (what the engine's build_batch does). Results:
// bench/results/logit_cpu.md.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "pagoda/model/logit_processing.h"

namespace pagoda::model {
namespace {

void BM_PenaltyStep(benchmark::State& state) {
  const int batch = 16, prompt_len = 7168, output_len = 1024, vocab = 32000;
  std::mt19937_64 rng(1);
  const LogitProcessing p{.presence_penalty = 0.5f, .frequency_penalty = 0.3f,
                          .repetition_penalty = 1.2f};
  std::vector<std::vector<int32_t>> tokens(batch);
  std::vector<TokenCounts> counts(batch);
  for (int s = 0; s < batch; ++s) {
    tokens[s].resize(prompt_len + output_len);
    for (auto& t : tokens[s]) t = static_cast<int32_t>(rng() % vocab);
    counts[s].extend(tokens[s], prompt_len);
  }
  std::vector<LogitAdjust> adj;
  for (auto _ : state) {
    adj.clear();
    for (int s = 0; s < batch; ++s) {
      tokens[s].push_back(static_cast<int32_t>(rng() % vocab));
      counts[s].extend(tokens[s], prompt_len);
      append_logit_adjust(counts[s], p, s, adj);
    }
    benchmark::DoNotOptimize(adj.data());
  }
  state.counters["entries"] = static_cast<double>(adj.size());
}
BENCHMARK(BM_PenaltyStep)->Unit(benchmark::kMicrosecond)->Iterations(512);  // 8,192 -> 8,704 tokens

}  // namespace
}  // namespace pagoda::model

BENCHMARK_MAIN();
