#include "pagoda/cli/spec_options.h"

#include "pagoda/core/error.h"

namespace pagoda::cli {

void add_spec_options(CLI::App* cmd, SpecOptions& o) {
  cmd->add_option("--spec", o.mode, "speculative decoding: none, ngram (prompt lookup), draft or eagle")
      ->check(CLI::IsMember({"none", "ngram", "draft", "eagle"}))
      ->capture_default_str();
  cmd->add_option("--spec-steps", o.steps, "draft depth (draft forwards per round)")
      ->capture_default_str();
  cmd->add_option("--spec-topk", o.topk, "draft branching per node")->capture_default_str();
  cmd->add_option("--spec-draft-tokens", o.draft_tokens, "verify tree size, root included")
      ->capture_default_str();
  cmd->add_option("--draft-model", o.draft_model,
                  "--spec draft: builtin or a checkpoint folder with the target's vocabulary "
                  "(default: the target itself, self-draft); --spec eagle: an EAGLE-1 / EAGLE-3 "
                  "head folder, or builtin (a random EAGLE-3 head)");
  cmd->add_option("--draft-weight-seed", o.draft_weight_seed, "seed of a builtin draft's weights")
      ->capture_default_str();
  cmd->add_option("--spec-min-accepted", o.min_accepted,
                  "pause speculation while fewer draft tokens per request and round are "
                  "accepted (0 = never pause)")
      ->capture_default_str();
  cmd->add_option("--spec-graph-tokens", o.graph_tokens,
                  "CUDA graphs for verify/draft forwards of at most this many tokens "
                  "(requests x tree size; 0 = eager)")
      ->capture_default_str();
}

engine::SpecConfig make_spec_config(const SpecOptions& o, SpecDraft& draft,
                                    const model::LlamaModel* target) {
  engine::SpecConfig s;
  s.mode = engine::parse_spec_mode(o.mode);
  s.steps = o.steps;
  s.topk = o.topk;
  s.num_draft_tokens = o.draft_tokens;
  s.min_accepted = o.min_accepted;
  s.graph_tokens = o.graph_tokens;
  const bool eagle = s.mode == engine::SpecMode::kEagle;
  PAGODA_REQUIRE(o.draft_model.empty() || s.mode == engine::SpecMode::kDraft || eagle,
                 kInvalidArgument, "--draft-model needs --spec draft or --spec eagle");
  PAGODA_REQUIRE(!eagle || !o.draft_model.empty(), kInvalidArgument,
                 "--spec eagle needs --draft-model (an EAGLE head folder, or builtin)");
  if (eagle && target == nullptr) {  // options only: check them as a draft-model config
    engine::SpecConfig probe = s;
    probe.mode = engine::SpecMode::kDraft;
    probe.validate();
    return s;
  }
  if (eagle) {
    if (o.draft_model == "builtin") {
      const model::EagleConfig ec =
          model::eagle_config_for(target->config(), model::EagleLayout::kEagle3);
      draft.eagle = std::make_unique<model::EagleHead>(
          ec, model::make_random_eagle_weights(ec, target->config(), o.draft_weight_seed),
          *target);
    } else {
      draft.eagle = model::load_eagle_head(o.draft_model, *target);
    }
    s.eagle_head = draft.eagle.get();
  }
  if (s.mode == engine::SpecMode::kDraft && !o.draft_model.empty()) {
    draft.loaded = std::make_unique<model::LoadedModel>(
        model::load_model(o.draft_model, o.draft_weight_seed));
    draft.model = std::make_unique<model::LlamaModel>(draft.loaded->config,
                                                       std::move(draft.loaded->weights));
    s.draft_model = draft.model.get();
  }
  s.validate();
  return s;
}

nlohmann::json spec_stats_json(const engine::EngineConfig& cfg, const engine::EngineStats& st) {
  return {{"mode", engine::spec_mode_name(cfg.spec.mode)},
          {"steps", cfg.spec.steps},
          {"topk", cfg.spec.topk},
          {"draft_tokens", cfg.spec.num_draft_tokens},
          {"rounds", st.spec_steps},
          {"verify_graph_steps", st.spec_graph_steps},
          {"draft_forwards", st.draft_forwards},
          {"draft_graph_steps", st.draft_graph_steps},
          {"verified", st.spec.verified},
          {"drafted", st.spec.draft_tokens},
          {"accepted", st.spec.accepted},
          {"mean_accept_length", st.spec.mean_accept_length()},
          {"acceptance_rate", st.spec.draft_tokens > 0
                                  ? static_cast<double>(st.spec.accepted) /
                                        static_cast<double>(st.spec.draft_tokens)
                                  : 0.0},
          {"time_s",
           {{"draft", st.spec_time.draft_s},
            {"verify", st.spec_time.verify_s},
            {"accept", st.spec_time.accept_s},
            {"commit", st.spec_time.commit_s},
            {"draft_extend", st.spec_time.extend_s},
            {"plain_forwards", st.spec_time.plain_forward_s},
            {"plain_decode_steps", st.decode_steps}}}};
}

}  // namespace pagoda::cli
