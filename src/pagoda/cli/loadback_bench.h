#pragma once
/// `pagoda bench --workload loadback`: what a prefix loaded back from the host tier costs the
/// request that extends it (issue 43's "the load hides behind the layers" target). On one idle
/// engine with the hierarchical cache (write_through), each round times three single requests
/// of --input-len prefix tokens (shared by the round) plus --user-len new tokens, one output
/// token each, on an otherwise idle engine:
///   cold    both tiers drained: the whole prompt is computed (what a device-only cache that lost
///           the prefix pays);
///   device  the prefix is in the device cache (a radix hit);
///   host    the device cache drained, the prefix only in the host tier: it is loaded back per
///           layer while the extend runs.
/// Each case's time is the request's TTFT (engine timestamps: arrival to first token). The
/// report gives medians with min / max over rounds, host / device and cold / host ratios, and
/// the host case's load-back bytes with the rate they imply if the whole TTFT were the copy (a
/// lower bound on the copy rate). Round 0 warms up and is not reported. A host case that the
/// host tier did not serve in full is an error: the probe would time something else.

#include <cstdint>
#include <string>

#include "pagoda/engine/engine_args.h"

namespace pagoda::cli {

struct LoadbackBenchArgs {
  std::string model = "builtin";
  uint64_t weight_seed = 0;
  engine::EngineArgs engine{};  ///< must enable the hierarchical cache
  int prefix_len = 4096;        ///< --input-len
  int extend_len = 256;         ///< --user-len (0: 256)
  int rounds = 5;               ///< --requests (each round is three requests)
  uint64_t seed = 1;
  bool json = false;
};

void run_loadback_bench(const LoadbackBenchArgs& a);

}  // namespace pagoda::cli
