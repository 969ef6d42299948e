#pragma once
/// `pagoda bench --spec ngram|draft ...`: the same fixed workload twice in one process — without
/// speculation, then with it — on identical engines; reports output tok/s of both, the speed-up,
/// the mean accepted length, and whether the greedy outputs are identical (they must be).
/// --tp N shards the target over N ranks in both runs (cli::start_tp).

#include <cstdint>
#include <string>

#include "pagoda/cli/spec_options.h"
#include "pagoda/engine/engine_args.h"

namespace pagoda::cli {

struct SpecBenchArgs {
  std::string model = "builtin";
  uint64_t weight_seed = 0;
  /// Both runs' engine (engine_args.h); engine.max_running 1 = single stream.
  engine::EngineArgs engine{};
  int requests = 16;
  uint64_t seed = 1;
  /// random: independent random prompts; repeat: each prompt is a random span followed by a
  /// copy of it cut at a random point (editing / retrieval: the answer continues the copy).
  std::string workload = "repeat";
  int input_len = 256;
  int output_len = 128;
  bool json = false;
  /// Tensor-parallel ranks of the target (cli::start_tp: threads on the CPU, one process per GPU
  /// on CUDA); each of the two runs gets its own group.
  int tp = 1;
  SpecOptions spec{};
};

void run_spec_bench(const SpecBenchArgs& a);

}  // namespace pagoda::cli
