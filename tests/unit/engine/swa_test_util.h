#pragma once
// Shared by the sliding-window pool's engine tests: engine_swa_test.cpp (reference and cpu
// backends) and tests/cuda/cuda_swa_engine_test.cpp (the cuda backend). The tiny models with
// windows (a Gemma-3 layout and a Mistral-style model), the prompts (two waves sharing a 70-token
// prefix; four long unrelated prompts that make decoding retract), the small pools of an "on"
// run at each page size, and one engine run with its leak audits.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/engine/engine.h"
#include "pagoda/model/config.h"
#include "pagoda/model/llama.h"
#include "pagoda/platform/platform.h"
#include "test_model.h"

namespace pagoda::testing {

inline constexpr int kSwaWindowLeft = 15;  // HF sliding_window 16
inline constexpr uint64_t kSwaWeightSeed = 7;

/// Gemma-3 text layout: 3 sliding layers (window 16, local RoPE base) and 1 full layer.
inline model::ModelConfig gemma3_tiny_config() {
  return model::config_from_hf_json(nlohmann::json::parse(R"({
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 300,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
    "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
                    "full_attention"],
    "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "sliding_window": 16,
    "max_position_embeddings": 1024})"));
}

/// test_model_config() with a window on every layer (no full-attention layer).
inline model::ModelConfig mistral_window_config() {
  model::ModelConfig c = test_model_config();
  c.layer_window.assign(static_cast<size_t>(c.num_layers), kSwaWindowLeft);
  c.name = "test-mistral-window";
  return c;
}

/// Two waves of 4: the second shares a 70-token prefix with the first (prefix-cache hits).
inline std::vector<std::vector<int32_t>> swa_prompts(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto tokens = [&](int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t& x : t) x = static_cast<int32_t>(rng() % 300);
    return t;
  };
  const std::vector<int32_t> system = tokens(70);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> p = i % 3 == 2 ? std::vector<int32_t>{} : system;
    const auto tail = tokens(5 + static_cast<int>(rng() % 50));
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
  }
  return prompts;
}

/// Four unrelated 60-token prompts: growing by 40 tokens each in swa_retraction_pools' pool of
/// 192 tokens (one request alone fits), admitted greedily, decoding must retract.
inline std::vector<std::vector<int32_t>> swa_retraction_prompts(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> prompts(4, std::vector<int32_t>(60));
  for (auto& p : prompts)
    for (int32_t& x : p) x = static_cast<int32_t>(rng() % 300);
  return prompts;
}

/// `off` (page size set) with the SWA pool left to `auto` and small pools, so admission waits,
/// decoding retracts and the SWA side evicts, and chunked prefill of one or two pages
/// (boundaries inside and across windows).
inline engine::EngineConfig swa_small_pools(engine::EngineConfig off) {
  const int32_t page = off.page_size;
  off.swa_pool = engine::SwaPoolMode::kOn;
  off.pool_tokens = page == 64 ? 448 : (page == 16 ? 192 : 160);
  off.swa_pool_tokens = page == 64 ? 320 : (page == 16 ? 96 : 48);
  off.scheduler.chunk_size = page == 1 ? 24 : page == 16 ? 32 : 64;
  off.scheduler.new_token_ratio = engine::NewTokenRatio{.init = 0.0, .min = 0.0, .decay = 0.0};
  return off;
}

/// `off` (page 16) with the SWA pool on and the pools swa_retraction_prompts outgrow.
inline engine::EngineConfig swa_retraction_pools(engine::EngineConfig off) {
  off.swa_pool = engine::SwaPoolMode::kOn;
  off.pool_tokens = 192;
  off.swa_pool_tokens = 96;
  off.scheduler.new_token_ratio = engine::NewTokenRatio{.init = 0.0, .min = 0.0, .decay = 0.0};
  return off;
}

struct SwaRun {
  std::vector<std::vector<int32_t>> outputs;
  engine::EngineStats stats;
};

/// Runs `prompts` greedily in waves of `wave` requests (each wave to completion) on a fresh
/// engine (on `platform`, default the CPU); expects 0 leaked pages in either pool and rows, and
/// both pools empty once the prefix cache is drained. `ignore_eos`: every request decodes all
/// max_new tokens (a run that must outgrow its pools).
inline SwaRun swa_generate(model::LlamaModel& model, const engine::EngineConfig& cfg,
                           const std::vector<std::vector<int32_t>>& prompts, int max_new = 20,
                           size_t wave = 4, platform::Platform* platform = nullptr,
                           bool ignore_eos = false) {
  engine::Engine engine(model, cfg, platform);
  SwaRun run;
  std::vector<engine::RequestId> ids;
  for (size_t first = 0; first < prompts.size(); first += wave) {
    for (size_t i = first; i < std::min(prompts.size(), first + wave); ++i)
      ids.push_back(engine.add_request(
          {.prompt = prompts[i], .max_new_tokens = max_new, .ignore_eos = ignore_eos}));
    engine.run_until_idle();
  }
  for (engine::RequestId id : ids) run.outputs.push_back(engine.output(id).output_ids);
  run.stats = engine.stats();
  EXPECT_EQ(engine.memory().leaked_pages(), 0);
  EXPECT_EQ(engine.memory().leaked_swa_pages(), 0);
  EXPECT_EQ(engine.memory().leaked_rows(), 0);
  engine.memory().drain_prefix_cache();
  EXPECT_EQ(engine.memory().free_pages(), engine.memory().total_pages());
  EXPECT_EQ(engine.memory().swa_free_pages(), engine.memory().swa_total_pages());
  return run;
}

}  // namespace pagoda::testing
