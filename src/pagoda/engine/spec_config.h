#pragma once
/// Speculative-decoding settings of the engine (EngineConfig::spec). The loop itself is the
/// SpecWorker (spec_worker.h); the model-free parts live in spec/. Contract:
/// docs/design/spec.md.

#include <cstdint>
#include <string>

#include "pagoda/spec/ngram.h"

namespace pagoda::model {
class LlamaModel;
class EagleHead;
}

namespace pagoda::engine {

enum class SpecMode : uint8_t {
  kNone,   ///< one token per decode step
  kNgram,  ///< prompt lookup: draft trees from the request's own context (no model)
  kDraft,  ///< a draft model (same vocabulary) builds topk × steps trees (EAGLE construction)
  kEagle,  ///< an EAGLE head fed with the target's hidden states builds the same trees
};

/// "none" / "ngram" / "draft" / "eagle".
const char* spec_mode_name(SpecMode mode);
/// Parses a spec_mode_name; throws Error(kInvalidArgument) listing the choices.
SpecMode parse_spec_mode(const std::string& name);

struct SpecConfig {
  SpecMode mode = SpecMode::kNone;
  int32_t steps = 3;             ///< draft depth S (draft forwards per round)
  int32_t topk = 1;              ///< branching K
  int32_t num_draft_tokens = 4;  ///< verify tree size D, root included (>= 2)
  /// kDraft: the draft checkpoint (same vocabulary; must outlive the engine). nullptr = the
  /// target itself (self-draft: measures the mechanics; every drafted chain token is accepted).
  const model::LlamaModel* draft_model = nullptr;
  /// kEagle: the head (model::EagleHead over the engine's target model; must outlive the
  /// engine). Required for kEagle.
  const model::EagleHead* eagle_head = nullptr;
  spec::NgramConfig ngram{};
  /// Switch-off: speculation pauses (plain decode steps) when the running mean of accepted draft
  /// tokens per request and round falls below this; the pause doubles on each consecutive miss
  /// (from backoff_steps up to 512 steps). 0 = never pause.
  double min_accepted = 0.5;
  int32_t backoff_steps = 4;
  /// CUDA graphs for the verify and draft forwards (model::WorkerConfig::verify_graph_tokens):
  /// rounds of at most this many query tokens (requests × tree size, bucketed) replay graphs
  /// where decode graphs are on (EngineConfig::cuda_graph); 0 = always eager. Each captured
  /// size costs activations and logits for this many rows on the device.
  int32_t graph_tokens = 512;

  /// Throws Error(kInvalidArgument) naming the first bad field (only checked when mode != kNone).
  void validate() const;
  /// Verify-graph token capacity of a worker serving `max_running` requests (0 when off):
  /// min(graph_tokens, max_running × the largest tree a round forwards).
  int32_t worker_graph_tokens(int32_t max_running) const;
};

}  // namespace pagoda::engine
