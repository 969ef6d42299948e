// bench_logit: the per-step cost of the penalties' logit entries (logit_processing.h) on long
// histories: a decode batch of 16 sequences with 8,192 tokens each (7,168 prompt + 1,024 output,
// vocab 32,000, uniform ids), presence, frequency and repetition penalties on. Each iteration is
// one decode step: every sequence appends one sampled token, its TokenCounts counts it, and the
// step's LogitAdjust entries are built (what the engine's build_batch does). Results:
// bench/results/logit_cpu.md.
//
// BM_ConstrainedStep / BM_ConstrainedApply: structured output's per-step host cost for a decode
// batch of 8 constrained rows over a 128,256-token vocabulary (Llama 3), the allowed share of
// tokens the argument (percent): building the step's token masks as build_batch does (each row's
// words written in place into WorkerBatch::token_mask; the matcher's own fill is a memcpy of a
// precomputed mask here) and, on the CPU platform, applying them (apply_token_mask).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
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

constexpr int kMaskRows = 8;
constexpr int64_t kMaskVocab = 128256;

/// kMaskRows random masks allowing `percent` % of the tokens, packed row after row.
std::vector<uint32_t> random_masks(int64_t percent) {
  std::mt19937_64 rng(1);
  std::bernoulli_distribution on(static_cast<double>(percent) / 100.0);
  const auto words = static_cast<size_t>(token_mask_words(kMaskVocab));
  std::vector<uint32_t> m(kMaskRows * words, 0u);
  for (int r = 0; r < kMaskRows; ++r)
    for (int64_t t = 0; t < kMaskVocab; ++t)
      if (on(rng)) m[r * words + static_cast<size_t>(t / 32)] |= 1u << (t % 32);
  return m;
}

void BM_ConstrainedStep(benchmark::State& state) {
  const std::vector<uint32_t> src = random_masks(state.range(0));
  const auto words = static_cast<size_t>(token_mask_words(kMaskVocab));
  std::vector<int32_t> mask_rows;
  std::vector<uint32_t> token_mask;
  for (auto _ : state) {
    mask_rows.clear();
    token_mask.clear();
    for (int r = 0; r < kMaskRows; ++r) {
      const size_t at = token_mask.size();
      mask_rows.push_back(r);
      token_mask.resize(at + words, 0u);
      std::memcpy(token_mask.data() + at, src.data() + r * words, words * sizeof(uint32_t));
    }
    benchmark::DoNotOptimize(token_mask.data());
  }
  state.counters["upload_bytes"] =
      static_cast<double>(token_mask.size() * sizeof(uint32_t) + mask_rows.size() * 4 + 4);
}
BENCHMARK(BM_ConstrainedStep)->Arg(1)->Arg(50)->Arg(99)->Unit(benchmark::kMicrosecond);

void BM_ConstrainedApply(benchmark::State& state) {
  const std::vector<uint32_t> masks = random_masks(state.range(0));
  std::vector<int32_t> rows(kMaskRows);
  for (int r = 0; r < kMaskRows; ++r) rows[static_cast<size_t>(r)] = r;
  std::vector<float> logits(static_cast<size_t>(kMaskRows * kMaskVocab), 1.f);
  for (auto _ : state) {
    apply_token_mask(logits.data(), kMaskVocab, rows, masks);
    benchmark::DoNotOptimize(logits.data());
  }
}
BENCHMARK(BM_ConstrainedApply)->Arg(1)->Arg(50)->Arg(99)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pagoda::model

BENCHMARK_MAIN();
