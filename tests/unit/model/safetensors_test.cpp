#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"
#include "pagoda/model/safetensors.h"
#include "temp_dir.h"
#include "test_model.h"

namespace pagoda::model {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

TEST(Safetensors, F32CheckpointRoundTripsExactly) {
  const ModelConfig c = testing::test_model_config();
  const ModelWeights w = make_random_weights(c, 42);
  TempDir dir("pagoda_st_f32");
  save_hf_checkpoint(dir.path(), c, w, DType::kF32);
  const LoadedModel m = load_hf_checkpoint(dir.path());
  EXPECT_EQ(m.config.hidden_size, c.hidden_size);
  EXPECT_EQ(m.config.num_kv_heads, c.num_kv_heads);
  EXPECT_EQ(m.config.eos_token_id, c.eos_token_id);
  EXPECT_EQ(m.weights.embed, w.embed);
  EXPECT_EQ(m.weights.lm_head, w.lm_head);
  ASSERT_EQ(m.weights.layers.size(), w.layers.size());
  EXPECT_EQ(m.weights.layers[1].down_proj, w.layers[1].down_proj);
  EXPECT_EQ(m.weights.layers[0].k_proj, w.layers[0].k_proj);
}

TEST(Safetensors, GemmaCheckpointsRoundTrip) {
  for (const char* type : {"gemma2", "gemma3_text"}) {
    SCOPED_TRACE(type);
    nlohmann::json j = {{"model_type", type},       {"vocab_size", 64},
                        {"hidden_size", 32},        {"intermediate_size", 48},
                        {"num_hidden_layers", 3},   {"num_attention_heads", 2},
                        {"num_key_value_heads", 1}, {"head_dim", 16},
                        {"sliding_window", 5},      {"query_pre_attn_scalar", 12}};
    if (std::string(type) == "gemma3_text") j["sliding_window_pattern"] = 3;
    const ModelConfig c = config_from_hf_json(j);
    const ModelWeights w = make_random_weights(c, 5);
    TempDir dir("pagoda_st_gemma");
    save_hf_checkpoint(dir.path(), c, w, DType::kF32);
    const LoadedModel m = load_hf_checkpoint(dir.path());
    EXPECT_EQ(m.config.family, c.family);
    EXPECT_EQ(m.config.layer_window, c.layer_window);
    EXPECT_EQ(m.config.qk_norm, c.qk_norm);
    EXPECT_EQ(m.config.attn_logit_softcap, c.attn_logit_softcap);
    EXPECT_EQ(m.config.final_logit_softcap, c.final_logit_softcap);
    EXPECT_EQ(m.config.attention_scaling(), c.attention_scaling());
    EXPECT_EQ(m.config.local_rope.theta, c.local_rope.theta);
    EXPECT_TRUE(m.weights.lm_head.empty());
    ASSERT_EQ(m.weights.layers.size(), 3u);
    for (size_t l = 0; l < 3; ++l) {
      EXPECT_EQ(m.weights.layers[l].post_norm, w.layers[l].post_norm);
      EXPECT_EQ(m.weights.layers[l].attn_out_norm, w.layers[l].attn_out_norm);
      EXPECT_EQ(m.weights.layers[l].mlp_out_norm, w.layers[l].mlp_out_norm);
      EXPECT_EQ(m.weights.layers[l].q_norm, w.layers[l].q_norm);
      EXPECT_EQ(m.weights.layers[l].k_norm, w.layers[l].k_norm);
    }
  }
}

TEST(Safetensors, Bf16AndF16AreRoundedToNearest) {
  ModelConfig c = testing::test_model_config();
  c.tie_word_embeddings = true;
  const ModelWeights w = make_random_weights(c, 7);
  for (DType t : {DType::kBF16, DType::kF16}) {
    TempDir dir("pagoda_st_half");
    save_hf_checkpoint(dir.path(), c, w, t);
    const LoadedModel m = load_hf_checkpoint(dir.path());
    EXPECT_TRUE(m.config.tie_word_embeddings);
    EXPECT_TRUE(m.weights.lm_head.empty());
    for (size_t i = 0; i < 1000; ++i) {
      const float x = w.layers[0].q_proj[i];
      const float expect = t == DType::kBF16 ? bf16_bits_to_f32(f32_to_bf16_bits(x))
                                             : f16_bits_to_f32(f32_to_f16_bits(x));
      ASSERT_EQ(m.weights.layers[0].q_proj[i], expect) << i;
    }
  }
}

TEST(Safetensors, ShardedIndexIsFollowed) {
  const ModelConfig c = testing::test_model_config();
  const ModelWeights w = make_random_weights(c, 3);
  TempDir src("pagoda_st_src");
  save_hf_checkpoint(src.path(), c, w, DType::kF32);
  // Split the single file into two shards plus an index.
  const SafetensorsFile whole(src.path() / "model.safetensors");
  TempDir dir("pagoda_st_shard");
  fs::copy_file(src.path() / "config.json", dir.path() / "config.json");
  std::vector<std::vector<float>> keep;
  std::vector<SafetensorToWrite> a, b;
  nlohmann::json index;
  int i = 0;
  for (const auto& [name, info] : whole.tensors()) {
    keep.push_back(whole.read_f32(name));
    auto& dst = (i++ % 2 == 0) ? a : b;
    dst.push_back({name, info.shape, keep.back().data(), DType::kF32});
    index["weight_map"][name] = (&dst == &a) ? "model-00001-of-00002.safetensors"
                                             : "model-00002-of-00002.safetensors";
  }
  write_safetensors(dir.path() / "model-00001-of-00002.safetensors", a);
  write_safetensors(dir.path() / "model-00002-of-00002.safetensors", b);
  std::ofstream(dir.path() / "model.safetensors.index.json") << index.dump();
  const LoadedModel m = load_hf_checkpoint(dir.path());
  EXPECT_EQ(m.weights.layers[1].gate_proj, w.layers[1].gate_proj);
  EXPECT_EQ(m.weights.final_norm, w.final_norm);
}

TEST(Safetensors, BadFilesAreClearErrors) {
  TempDir dir("pagoda_st_bad");
  EXPECT_THROW(load_hf_checkpoint(dir.path()), Error);  // no config.json
  std::ofstream(dir.path() / "x.safetensors") << "garbage";
  EXPECT_THROW(SafetensorsFile(dir.path() / "x.safetensors"), Error);
  // A header that claims more data than the file holds.
  {
    std::string h = R"({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})";
    std::ofstream f(dir.path() / "y.safetensors", std::ios::binary);
    uint64_t n = h.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << h << "abcd";
  }
  EXPECT_THROW(SafetensorsFile(dir.path() / "y.safetensors"), Error);
  // A checkpoint with a missing tensor names it.
  const ModelConfig c = testing::test_model_config();
  const ModelWeights w = make_random_weights(c, 1);
  TempDir ck("pagoda_st_missing");
  save_hf_checkpoint(ck.path(), c, w, DType::kF32);
  const SafetensorsFile whole(ck.path() / "model.safetensors");
  std::vector<std::vector<float>> keep;
  std::vector<SafetensorToWrite> t;
  for (const auto& [name, info] : whole.tensors()) {
    if (name == "model.layers.1.mlp.up_proj.weight") continue;
    keep.push_back(whole.read_f32(name));
    t.push_back({name, info.shape, keep.back().data(), DType::kF32});
  }
  write_safetensors(ck.path() / "model.safetensors", t);
  try {
    load_hf_checkpoint(ck.path());
    FAIL() << "missing tensor accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.1.mlp.up_proj.weight"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace pagoda::model
