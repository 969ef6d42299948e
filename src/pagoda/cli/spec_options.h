#pragma once
/// The speculative-decoding options shared by `pagoda generate` and `pagoda bench`:
/// --spec none|ngram|draft|eagle --spec-steps S --spec-topk K --spec-draft-tokens N
/// [--draft-model builtin|DIR --draft-weight-seed X] [--spec-min-accepted A].

#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "pagoda/engine/engine.h"
#include "pagoda/model/eagle_head.h"
#include "pagoda/model/llama.h"
#include "pagoda/model/safetensors.h"

namespace pagoda::cli {

struct SpecOptions {
  std::string mode = "none";
  int steps = 3;
  int topk = 1;
  int draft_tokens = 4;
  std::string draft_model;  ///< empty: the target itself (self-draft)
  uint64_t draft_weight_seed = 0;
  double min_accepted = 0.5;
  int graph_tokens = 512;  ///< SpecConfig::graph_tokens
};

/// Registers the options on `cmd`.
void add_spec_options(CLI::App* cmd, SpecOptions& o);

/// The draft model a run needs (loaded once; outlives the engine).
struct SpecDraft {
  std::unique_ptr<model::LoadedModel> loaded;
  std::unique_ptr<model::LlamaModel> model;
  std::unique_ptr<model::EagleHead> eagle;  ///< --spec eagle
};

/// The engine's SpecConfig for `o`; loads --draft-model into `draft`. Throws Error
/// (kInvalidArgument) naming the option for a bad value. --spec eagle loads the head for
/// `target` (--draft-model DIR, or builtin: a random EAGLE-3 head of the target's shapes seeded
/// by --draft-weight-seed); without `target` only the options are checked (no head).
engine::SpecConfig make_spec_config(const SpecOptions& o, SpecDraft& draft,
                                    const model::LlamaModel* target = nullptr);

/// Speculation counters of a run as JSON (mode, rounds, accept length, acceptance rate).
nlohmann::json spec_stats_json(const engine::EngineConfig& cfg, const engine::EngineStats& st);

}  // namespace pagoda::cli
