// LlamaModel's constructor moves the weights it is given as an rvalue (the loaders' path: one
// copy of the model in memory instead of two) and copies an lvalue: both must pack the same
// model, for every family shape the packing treats apart (plain, q/k/v biases with tied
// embeddings, partial RoPE, MLA with and without q LoRA). Random weights with a printed seed.
#include <gtest/gtest.h>

#include <initializer_list>
#include <utility>
#include <vector>

#include "pagoda/model/llama.h"
#include "pagoda/model/weights.h"
#include "test_model.h"
#include "test_seed.h"

namespace pagoda::model {
namespace {

using Field = std::vector<float> LlamaModel::PackedLayer::*;
constexpr Field kFields[] = {
    &LlamaModel::PackedLayer::input_norm,   &LlamaModel::PackedLayer::qkv_proj,
    &LlamaModel::PackedLayer::qkv_bias,     &LlamaModel::PackedLayer::o_proj,
    &LlamaModel::PackedLayer::post_norm,    &LlamaModel::PackedLayer::gate_up,
    &LlamaModel::PackedLayer::down_proj,    &LlamaModel::PackedLayer::attn_out_norm,
    &LlamaModel::PackedLayer::mlp_out_norm, &LlamaModel::PackedLayer::q_norm,
    &LlamaModel::PackedLayer::k_norm,       &LlamaModel::PackedLayer::q_a_proj,
    &LlamaModel::PackedLayer::q_a_norm,     &LlamaModel::PackedLayer::q_proj,
    &LlamaModel::PackedLayer::kv_a_proj,    &LlamaModel::PackedLayer::kv_a_norm,
    &LlamaModel::PackedLayer::w_uk_t,       &LlamaModel::PackedLayer::w_uv,
};

TEST(LlamaModelPacking, MovedWeightsPackTheModelCopiedWeightsDo) {
  const testing::TestSeed seed;
  ModelConfig partial = testing::test_model_config();
  partial.rotary_dim = 32;  // RoPE on half of each head (q/k rows permuted when packed)
  partial.name = "partial-rope";
  for (const ModelConfig& c : {testing::test_model_config(), testing::qwen2_test_config(), partial,
                               testing::mla_test_config(true), testing::mla_test_config(false)}) {
    SCOPED_TRACE(c.name);
    const ModelWeights w = make_random_weights(c, seed);
    const LlamaModel copied(c, w);
    ModelWeights moved_from = w;
    const LlamaModel moved(c, std::move(moved_from));
    EXPECT_EQ(moved.embed_weights(), copied.embed_weights());
    EXPECT_EQ(moved.lm_head_weights(), copied.lm_head_weights());
    EXPECT_EQ(moved.final_norm_weights(), copied.final_norm_weights());
    ASSERT_EQ(moved.packed_layers().size(), copied.packed_layers().size());
    for (size_t l = 0; l < copied.packed_layers().size(); ++l)
      for (size_t f = 0; f < std::size(kFields); ++f)
        EXPECT_EQ(moved.packed_layers()[l].*kFields[f], copied.packed_layers()[l].*kFields[f])
            << "layer " << l << ", field " << f;
    // Against the checkpoint's own matrices (fields the packing does not permute).
    auto cat = [](std::initializer_list<const std::vector<float>*> parts) {
      std::vector<float> out;
      for (const auto* p : parts) out.insert(out.end(), p->begin(), p->end());
      return out;
    };
    for (size_t l = 0; l < w.layers.size(); ++l) {
      const LayerWeights& src = w.layers[l];
      const LlamaModel::PackedLayer& p = moved.packed_layers()[l];
      EXPECT_EQ(p.o_proj, src.o_proj) << "layer " << l;
      EXPECT_EQ(p.down_proj, src.down_proj) << "layer " << l;
      EXPECT_EQ(p.gate_up, cat({&src.gate_proj, &src.up_proj})) << "layer " << l;
      if (c.is_mla()) {
        EXPECT_EQ(p.q_proj, c.mla.q_lora_rank > 0 ? src.q_b_proj : src.q_proj) << "layer " << l;
        EXPECT_EQ(p.kv_a_proj, src.kv_a_proj) << "layer " << l;
        EXPECT_TRUE(p.qkv_proj.empty());
      } else if (c.rotary_dim == 0) {
        EXPECT_EQ(p.qkv_proj, cat({&src.q_proj, &src.k_proj, &src.v_proj})) << "layer " << l;
      }
    }
    // The copy made from an lvalue left the caller's weights whole.
    EXPECT_EQ(w.layers.front().down_proj.size(),
              static_cast<size_t>(c.hidden_size) * static_cast<size_t>(c.intermediate_size));
  }
}

}  // namespace
}  // namespace pagoda::model
