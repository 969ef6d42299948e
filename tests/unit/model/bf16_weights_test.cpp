// bf16 weights kept bf16 (safetensors.h LoadOptions::keep_bf16, weights.h Bf16Matrices and
// embed_bf16 / lm_head_bf16, the Bf16Packed fields of LlamaModel, ModelOps::upload_bf16): the
// loader keeps exactly the dense GEMM matrices, the embedding and the LM head a checkpoint stores
// in BF16, their bits unchanged; packing them (fused q/k/v and
// gate/up, the partial-RoPE row permutation, a group of mixed dtypes widened) gives the widened
// model's packed matrices bit for bit; an EAGLE head over such a target widens its own embedding
// and LM head; validate() refuses a matrix given twice, a wrong size and
// bf16 on an MLA layer; and the forward pass of every CPU GEMM mode computes the same logits, bit
// for bit, from the bf16 model as from the same values widened to f32 (which the naive-model
// tests in model_forward_test.cpp check). Random weights with a printed seed.
#include <gtest/gtest.h>

#include <random>
#include <span>
#include <string>
#include <vector>

#include "pagoda/attention/paged_plan.h"
#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"
#include "pagoda/kv/page_allocator.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/model/eagle_head.h"
#include "pagoda/model/llama.h"
#include "pagoda/model/llama_worker.h"
#include "pagoda/model/safetensors.h"
#include "pagoda/model/step_input.h"
#include "pagoda/platform/platform.h"
#include "temp_dir.h"
#include "test_model.h"
#include "test_seed.h"

namespace pagoda::model {
namespace {

std::vector<uint16_t> rounded_bits(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16_bits(v[i]);
  return out;
}

/// The seven dense matrices of a layer: f32 field, bf16 field, name.
struct MatrixField {
  std::vector<float> LayerWeights::*f32;
  std::vector<uint16_t> Bf16Matrices::*bf16;
  const char* name;
};
constexpr MatrixField kMatrices[] = {
    {&LayerWeights::q_proj, &Bf16Matrices::q_proj, "q_proj"},
    {&LayerWeights::k_proj, &Bf16Matrices::k_proj, "k_proj"},
    {&LayerWeights::v_proj, &Bf16Matrices::v_proj, "v_proj"},
    {&LayerWeights::o_proj, &Bf16Matrices::o_proj, "o_proj"},
    {&LayerWeights::gate_proj, &Bf16Matrices::gate_proj, "gate_proj"},
    {&LayerWeights::up_proj, &Bf16Matrices::up_proj, "up_proj"},
    {&LayerWeights::down_proj, &Bf16Matrices::down_proj, "down_proj"},
};

/// `w` with every dense matrix, the embedding and the LM head rounded to bf16: `as_bits` puts them
/// in the bf16 fields (the f32 ones emptied), else keeps them f32 (the widened values).
ModelWeights rounded(ModelWeights w, bool as_bits) {
  for (auto [f32, bf16] :
       {std::pair{&w.embed, &w.embed_bf16}, std::pair{&w.lm_head, &w.lm_head_bf16}}) {
    std::vector<uint16_t> bits = rounded_bits(*f32);
    if (as_bits) {
      *bf16 = std::move(bits);
      f32->clear();
    } else {
      *f32 = widened_bf16(bits);
    }
  }
  for (LayerWeights& l : w.layers)
    for (const MatrixField& m : kMatrices) {
      std::vector<uint16_t> bits = rounded_bits(l.*m.f32);
      if (as_bits) {
        l.bf16.*m.bf16 = std::move(bits);
        (l.*m.f32).clear();
      } else {
        l.*m.f32 = widened_bf16(bits);
      }
    }
  return w;
}

TEST(Bf16Weights, LoaderKeepsExactlyTheBf16StoredMatrices) {
  const testing::TestSeed seed;
  ModelConfig c = testing::test_model_config();
  c.qkv_bias = true;  // Llama with attention_bias: the biases stay f32 however stored
  const ModelWeights w = make_random_weights(c, seed);
  testing::TempDir bf16_dir("pagoda_bf16_keep"), f32_dir("pagoda_bf16_f32");
  save_hf_checkpoint(bf16_dir.path(), c, w, DType::kBF16);
  save_hf_checkpoint(f32_dir.path(), c, w, DType::kF32);
  const LoadedModel kept = load_hf_checkpoint(bf16_dir.path(), {.keep_bf16 = true});
  const LoadedModel wide = load_hf_checkpoint(bf16_dir.path());
  const LoadedModel f32 = load_hf_checkpoint(f32_dir.path(), {.keep_bf16 = true});
  for (size_t l = 0; l < w.layers.size(); ++l) {
    SCOPED_TRACE(::testing::Message() << "layer " << l);
    for (const MatrixField& m : kMatrices) {
      SCOPED_TRACE(m.name);
      const std::vector<uint16_t> want = rounded_bits(w.layers[l].*m.f32);
      EXPECT_TRUE((kept.weights.layers[l].*m.f32).empty());
      EXPECT_EQ(kept.weights.layers[l].bf16.*m.bf16, want);
      EXPECT_TRUE((wide.weights.layers[l].bf16.*m.bf16).empty());
      EXPECT_EQ(wide.weights.layers[l].*m.f32, widened_bf16(want));
      EXPECT_TRUE((f32.weights.layers[l].bf16.*m.bf16).empty());  // stored F32: read as f32
      EXPECT_EQ(f32.weights.layers[l].*m.f32, w.layers[l].*m.f32);
    }
    EXPECT_EQ(kept.weights.layers[l].q_bias, wide.weights.layers[l].q_bias);
    EXPECT_EQ(kept.weights.layers[l].input_norm, wide.weights.layers[l].input_norm);
  }
  EXPECT_TRUE(kept.weights.embed.empty() && kept.weights.lm_head.empty());
  EXPECT_EQ(kept.weights.embed_bf16, rounded_bits(w.embed));
  EXPECT_EQ(kept.weights.lm_head_bf16, rounded_bits(w.lm_head));
  EXPECT_EQ(widened_bf16(kept.weights.embed_bf16), wide.weights.embed);
  EXPECT_TRUE(f32.weights.embed_bf16.empty());
  EXPECT_EQ(f32.weights.embed, w.embed);
  // Tied: a stored lm_head equal to the embedding is dropped in either form.
  ModelConfig tied_c = c;
  tied_c.tie_word_embeddings = true;
  ModelWeights tied_w = w;
  tied_w.lm_head.clear();
  testing::TempDir tied_dir("pagoda_bf16_tied");
  save_hf_checkpoint(tied_dir.path(), tied_c, tied_w, DType::kBF16);
  const LoadedModel tied = load_hf_checkpoint(tied_dir.path(), {.keep_bf16 = true});
  EXPECT_TRUE(tied.weights.lm_head.empty() && tied.weights.lm_head_bf16.empty());
  EXPECT_EQ(tied.weights.embed_bf16, rounded_bits(w.embed));
  // Saving such weights would need the bf16 fields written: refused, not written as nothing.
  testing::TempDir again("pagoda_bf16_resave");
  try {
    save_hf_checkpoint(again.path(), c, kept.weights, DType::kBF16);
    ADD_FAILURE() << "weights with bf16 matrices were saved";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
  }
}

TEST(Bf16Weights, PackingMatchesTheWidenedModel) {
  const testing::TestSeed seed;
  ModelConfig partial = testing::test_model_config();
  partial.rotary_dim = 32;  // q/k rows permuted per head when packed
  partial.name = "partial-rope";
  for (const ModelConfig& c :
       {testing::test_model_config(), testing::qwen2_test_config(), partial}) {
    SCOPED_TRACE(c.name);
    const ModelWeights w = make_random_weights(c, seed);
    ModelWeights bits = rounded(w, true);
    // Layer 1's k_proj as the checkpoint might store it, in f32: its q/k/v group packs in f32.
    bits.layers[1].k_proj = widened_bf16(bits.layers[1].bf16.k_proj);
    bits.layers[1].bf16.k_proj.clear();
    const LlamaModel wide(c, rounded(w, false));
    const LlamaModel kept(c, std::move(bits));
    EXPECT_EQ(kept.weight_elements(), wide.weight_elements());
    EXPECT_EQ(kept.lm_head_tied(), wide.lm_head_tied());
    EXPECT_TRUE(kept.has_bf16_weights());
    EXPECT_FALSE(wide.has_bf16_weights());
    EXPECT_TRUE(kept.embed_weights().empty() && kept.lm_head_weights().empty());
    EXPECT_EQ(widened_bf16(kept.embed_bf16()), wide.embed_weights());
    EXPECT_EQ(widened_bf16(kept.lm_head_bf16()), wide.lm_head_weights());
    for (size_t l = 0; l < wide.packed_layers().size(); ++l) {
      SCOPED_TRACE(::testing::Message() << "layer " << l);
      const LlamaModel::PackedLayer& a = wide.packed_layers()[l];
      const LlamaModel::PackedLayer& b = kept.packed_layers()[l];
      if (l == 1) {
        EXPECT_TRUE(b.bf16.qkv_proj.empty());
        EXPECT_EQ(b.qkv_proj, a.qkv_proj);
      } else {
        EXPECT_TRUE(b.qkv_proj.empty());
        EXPECT_EQ(widened_bf16(b.bf16.qkv_proj), a.qkv_proj);
      }
      EXPECT_TRUE(b.o_proj.empty() && b.gate_up.empty() && b.down_proj.empty());
      EXPECT_EQ(widened_bf16(b.bf16.o_proj), a.o_proj);
      EXPECT_EQ(widened_bf16(b.bf16.gate_up), a.gate_up);
      EXPECT_EQ(widened_bf16(b.bf16.down_proj), a.down_proj);
      EXPECT_EQ(b.qkv_bias, a.qkv_bias);
    }
  }
}

// An EAGLE-1 head (the target's embedding and LM head) over a target that keeps them in bf16
// widens its own copies: the values the f32 target would have shared.
TEST(Bf16Weights, EagleHeadOverABf16TargetWidensItsEmbeddingAndLmHead) {
  const testing::TestSeed seed;
  const ModelConfig c = testing::test_model_config();
  const ModelWeights w = make_random_weights(c, seed);
  const LlamaModel wide(c, rounded(w, false));
  const LlamaModel kept(c, rounded(w, true));
  const EagleConfig ec = eagle_config_for(c, EagleLayout::kEagle1);
  const EagleWeights ew = make_random_eagle_weights(ec, c, seed);
  const EagleHead over_wide(ec, ew, wide), over_kept(ec, ew, kept);
  EXPECT_EQ(&over_wide.embed(), &wide.embed_weights());  // shared, not copied
  EXPECT_EQ(over_kept.embed(), wide.embed_weights());
  EXPECT_EQ(over_kept.lm_head(), wide.lm_head_weights());
}

/// Runs `fn` and returns the Error's message, failing the test when nothing is thrown.
template <typename Fn>
std::string error_of(Fn&& fn, ErrorCode code) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(Bf16Weights, ValidateRefusesTwiceGivenMisSizedAndMlaMatrices) {
  const testing::TestSeed seed;
  const ModelConfig c = testing::test_model_config();
  const ModelWeights w = make_random_weights(c, seed);
  ModelWeights twice = rounded(w, true);
  twice.layers[0].gate_proj = widened_bf16(twice.layers[0].bf16.gate_proj);
  EXPECT_NE(error_of([&] { twice.validate(c); }, ErrorCode::kInvalidArgument)
                .find("layers.0.gate_proj is given both in f32 and in bf16"),
            std::string::npos);
  ModelWeights short_one = rounded(w, true);
  short_one.layers[1].bf16.down_proj.pop_back();
  EXPECT_NE(error_of([&] { short_one.validate(c); }, ErrorCode::kInvalidArgument)
                .find("layers.1.down_proj has"),
            std::string::npos);
  const ModelConfig mla = testing::mla_test_config(true);
  ModelWeights mw = make_random_weights(mla, seed);
  mw.layers[0].bf16.o_proj = rounded_bits(mw.layers[0].o_proj);
  mw.layers[0].o_proj.clear();
  EXPECT_NE(error_of([&] { mw.validate(mla); }, ErrorCode::kInvalidArgument).find("MLA"),
            std::string::npos);
}

/// Logits of a 23-token prefill and two decode steps of `model` on the CPU ops in `gemm`.
std::vector<float> forward_logits(const LlamaModel& model, CpuGemm gemm, uint64_t seed) {
  auto platform = platform::make_cpu_platform();
  const int32_t page = 16, num_pages = 16;
  kv::PageAllocator alloc(num_pages, page);
  kv::ReqToTokenTable table(1, 64);
  LlamaWorker worker(model, make_cpu_ops(*platform, DType::kF32, gemm),
                     WorkerConfig{.page_size = page,
                                  .num_pages = num_pages,
                                  .backend = {.attention = "cpu"},
                                  .cuda_graph = false,
                                  .max_batch_size = 1},
                     table);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<int32_t> tokens(23);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 256);
  std::vector<float> all;
  auto run = [&](const StepInput& in) {
    WorkerBatch b{.forward = build_forward_batch(in)};
    b.input_ids.assign(in.seqs[0].tokens.begin(), in.seqs[0].tokens.end());
    b.logit_rows.push_back(1);
    b.sampling.push_back(SamplingParams{});
    b.sample_step.push_back(0);
    b.return_logits = true;
    const std::vector<float> logits = worker.run(b).logits;
    all.insert(all.end(), logits.begin(), logits.end());
    return logits;
  };
  const ReqSlot row = *table.alloc();
  const int32_t zero = 0, n = static_cast<int32_t>(tokens.size()), none = -1;
  auto s = *alloc.alloc_extend(std::span(&zero, 1), std::span(&n, 1), std::span(&none, 1));
  table.write(row, 0, s);
  std::vector<float> logits = run(
      StepInput{.mode = attention::ForwardMode::kExtend,
                .seqs = {{.req_slot = row.value(), .prefix_len = 0, .tokens = std::span(tokens)}},
                .out_cache_loc = s});
  for (int step = 0; step < 2; ++step) {
    tokens.push_back(static_cast<int32_t>(rng() % 256));
    const int32_t len = static_cast<int32_t>(tokens.size());
    const SlotIndex last = table.row(row)[len - 2];
    auto d = *alloc.alloc_decode(std::span(&len, 1), std::span(&last, 1));
    table.write(row, len - 1, d);
    logits = run(StepInput{.mode = attention::ForwardMode::kDecode,
                           .seqs = {{.req_slot = row.value(),
                                     .prefix_len = len - 1,
                                     .tokens = std::span(tokens).subspan(len - 1, 1)}},
                           .out_cache_loc = d});
  }
  return all;
}

class Bf16Forward : public ::testing::TestWithParam<CpuGemm> {};

TEST_P(Bf16Forward, LogitsEqualTheWidenedModelsBitForBit) {
  const CpuGemm gemm = GetParam();
  if (const std::string why = cpu_gemm_unavailable(gemm); !why.empty())
    GTEST_SKIP() << "--cpu-gemm " << cpu_gemm_name(gemm) << " cannot run here: " << why;
  const testing::TestSeed seed;
  for (const ModelConfig& c : {testing::test_model_config(), testing::qwen2_test_config()}) {
    SCOPED_TRACE(c.name);
    ModelWeights w = make_random_weights(c, seed);
    if (c.tie_word_embeddings) w.lm_head.clear();
    const LlamaModel wide(c, rounded(w, false));
    const LlamaModel kept(c, rounded(w, true));
    const std::vector<float> a = forward_logits(wide, gemm, seed);
    const std::vector<float> b = forward_logits(kept, gemm, seed);
    ASSERT_EQ(a.size(), static_cast<size_t>(3 * c.vocab_size));
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_FALSE(std::isnan(a[i])) << i;
      ASSERT_EQ(a[i], b[i]) << "logit " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, Bf16Forward,
                         ::testing::Values(CpuGemm::kOpenBlas, CpuGemm::kOnednn, CpuGemm::kAmx),
                         [](const auto& info) { return std::string(cpu_gemm_name(info.param)); });

}  // namespace
}  // namespace pagoda::model
