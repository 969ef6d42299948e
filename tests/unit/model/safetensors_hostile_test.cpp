// Hostile safetensors files and checkpoints: every malformed header is an Error naming the
// problem, never a crash or UB (CI runs this under ASan + UBSan), including a seeded loop that
// mutates a valid file at random. Also the strict checkpoint rules: stray tensors (an undeclared
// bias), shards that disagree, tied heads that differ.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/model/safetensors.h"
#include "temp_dir.h"
#include "test_model.h"

namespace pagoda::model {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

/// Writes `header_len` (little endian), `header`, then `data_bytes` zero bytes.
void write_raw(const fs::path& p, uint64_t header_len, const std::string& header,
               size_t data_bytes) {
  std::ofstream f(p, std::ios::binary);
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>((header_len >> (8 * i)) & 0xFF));
  f << header << std::string(data_bytes, '\0');
}
void write_raw(const fs::path& p, const std::string& header, size_t data_bytes) {
  write_raw(p, header.size(), header, data_bytes);
}

template <typename Fn>
void expect_error(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "'" << e.what() << "' does not mention '" << needle << "'";
  }
}

TEST(SafetensorsHostile, CheckedNumel) {
  EXPECT_EQ(checked_numel(std::vector<int64_t>{}), 1);
  EXPECT_EQ(checked_numel(std::vector<int64_t>{3, 0, 5}), 0);
  EXPECT_FALSE(checked_numel(std::vector<int64_t>{int64_t{1} << 32, int64_t{1} << 31}));
  EXPECT_FALSE(checked_numel(std::vector<int64_t>{2, -3}));
  SafetensorInfo info;
  info.shape = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_EQ(info.numel(), -1);
}

TEST(SafetensorsHostile, MalformedHeadersAreErrors) {
  TempDir dir("pagoda_st_hostile");
  const fs::path p = dir.path() / "t.safetensors";
  struct Case {
    std::string header;
    size_t data;
    std::string needle;
  };
  const Case cases[] = {
      {R"({"a": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}})", 16, "shape"},
      // 2^32 * 2^32 overflows int64 before any size check.
      {R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 16]}})", 16,
       "overflows"},
      {R"({"a": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 16]}})", 16,
       "overflows"},
      {R"({"a": {"dtype": "F32", "shape": [18446744073709551615], "data_offsets": [0, 16]}})", 16,
       "shape"},
      {R"({"a": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 16]}})", 16, "shape"},
      {R"({"a": {"dtype": "F32", "shape": "4", "data_offsets": [0, 16]}})", 16, "shape"},
      {R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 32]}})", 16, "data_offsets"},
      {R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [-16, 0]}})", 16, "data_offsets"},
      {R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}})", 16, "data_offsets"},
      {R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0]}})", 16, "data_offsets"},
      {R"({"a": {"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}})", 16, "bytes"},
      {R"({"a": {"dtype": "I8", "shape": [16], "data_offsets": [0, 16]}})", 16, "dtype"},
      {R"({"a": {"dtype": 7, "shape": [4], "data_offsets": [0, 16]}})", 16, "dtype"},
      {R"({"a": {"shape": [4], "data_offsets": [0, 16]}})", 16, "dtype"},
      {R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16], "x": 1}})", 16, "'x'"},
      {R"({"a": [1, 2]})", 16, "not an object"},
      {R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
           "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
       24, "overlap"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},
           "b": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})",
       16, "overlap"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})", 16, "hole"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 16, "cover"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
       16, "twice"},
      {R"([1, 2, 3])", 0, "not a JSON object"},
      {R"("just a string")", 0, "not a JSON object"},
      {R"({"a": )", 0, "JSON"},
      {R"({"__metadata__": [1]})", 0, "__metadata__"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    write_raw(p, c.header, c.data);
    expect_error([&] { SafetensorsFile f(p); }, c.needle);
  }
  // Header length beyond the file, including one whose 8 + N wraps around.
  for (uint64_t len : {uint64_t{1000}, ~uint64_t{0}, ~uint64_t{0} - 7, uint64_t{1} << 63}) {
    write_raw(p, len, "{}", 0);
    expect_error([&] { SafetensorsFile f(p); }, "header length");
  }
  // Shorter than the 8-byte length prefix.
  std::ofstream(p, std::ios::binary) << "abc";
  expect_error([&] { SafetensorsFile f(p); }, "too small");
  // A valid empty file and a valid zero-element tensor.
  write_raw(p, R"({"__metadata__": {"format": "pt"}})", 0);
  EXPECT_NO_THROW(SafetensorsFile f(p));
  write_raw(p, R"({"z": {"dtype": "BF16", "shape": [0, 3], "data_offsets": [0, 0]}})", 0);
  EXPECT_EQ(SafetensorsFile(p).read_f32("z").size(), 0u);
}

/// The bytes of a small valid file with three tensors.
std::string valid_file_bytes(const fs::path& p) {
  std::vector<float> a(6, 1.5f), b(4, -2.f), c(3, 0.25f);
  write_safetensors(p, {{"alpha", {2, 3}, a.data(), DType::kF32},
                        {"beta", {4}, b.data(), DType::kBF16},
                        {"gamma", {3, 1}, c.data(), DType::kF16}});
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(SafetensorsHostile, SeededMutationsGiveErrorsNeverCrashes) {
  const uint64_t seed = 0x5AFE7E45;
  std::printf("safetensors mutation seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  TempDir dir("pagoda_st_fuzz");
  const fs::path p = dir.path() / "f.safetensors";
  const std::string valid = valid_file_bytes(p);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(valid[i]);
  // Interesting replacements for digits in the header: huge, negative, fractional numbers.
  const char* tokens[] = {"-1",
                          "9223372036854775807",
                          "18446744073709551616",
                          "4294967296",
                          "1e30",
                          "0.5",
                          "null",
                          "[]",
                          "{}",
                          "\"F32\"",
                          ",",
                          "]",
                          "}"};
  int opened = 0, rejected = 0;
  for (int it = 0; it < 1500; ++it) {
    std::string bytes = valid;
    const int kind = static_cast<int>(rng() % 5);
    if (kind == 0) {  // flip bytes anywhere in the header (and the length prefix)
      const int n = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < n; ++k) bytes[rng() % (8 + header_len)] = static_cast<char>(rng() & 0xFF);
    } else if (kind == 1) {  // replace a number in the header by a hostile token
      std::vector<size_t> digits;
      for (size_t i = 8; i < 8 + header_len; ++i)
        if (bytes[i] >= '0' && bytes[i] <= '9') digits.push_back(i);
      const size_t at = digits[rng() % digits.size()];
      size_t end = at;
      while (end < 8 + header_len && bytes[end] >= '0' && bytes[end] <= '9') ++end;
      const std::string tok = tokens[rng() % std::size(tokens)];
      bytes.replace(at, end - at, tok);
      const uint64_t len = header_len + tok.size() - (end - at);
      for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((len >> (8 * i)) & 0xFF);
    } else if (kind == 2) {  // truncate
      bytes.resize(rng() % bytes.size());
    } else if (kind == 3) {  // a random header length
      const uint64_t len = rng() % 3 == 0 ? rng() : rng() % (bytes.size() + 16);
      for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((len >> (8 * i)) & 0xFF);
    } else {  // append or remove data bytes
      if (rng() % 2 == 0) {
        bytes.append(1 + rng() % 8, 'x');
      } else {
        bytes.resize(bytes.size() - 1 - rng() % 4);
      }
    }
    std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
    try {
      SafetensorsFile f(p);
      for (const auto& [name, info] : f.tensors()) {
        const auto v = f.read_f32(name);
        ASSERT_EQ(static_cast<int64_t>(v.size()), info.numel());
      }
      ++opened;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "iteration " << it << " (seed " << seed << "): non-pagoda exception "
                    << e.what();
    }
  }
  EXPECT_GT(rejected, 1000);  // of 1500
  std::printf("safetensors mutations: %d opened, %d rejected\n", opened, rejected);
}

/// Rewrites `dir`/model.safetensors through `edit`, which gets (and may change) its tensors.
template <typename Edit>
void rewrite_checkpoint(const fs::path& dir, Edit&& edit) {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::vector<float>> values;
  {
    const SafetensorsFile f(dir / "model.safetensors");
    for (const auto& [name, info] : f.tensors()) {
      names.push_back(name);
      shapes.push_back(info.shape);
      values.push_back(f.read_f32(name));
    }
  }
  edit(names, shapes, values);
  std::vector<SafetensorToWrite> t;
  for (size_t i = 0; i < names.size(); ++i)
    t.push_back({names[i], shapes[i], values[i].data(), DType::kF32});
  write_safetensors(dir / "model.safetensors", t);
}

using Names = std::vector<std::string>;
using Shapes = std::vector<std::vector<int64_t>>;
using Values = std::vector<std::vector<float>>;

TEST(CheckpointStrict, StrayTensorsAreErrorsNamingThem) {
  const ModelConfig c = testing::test_model_config();
  const ModelWeights w = make_random_weights(c, 5);
  TempDir dir("pagoda_ck_stray");
  save_hf_checkpoint(dir.path(), c, w, DType::kF32);
  // A Qwen2-style bias in a checkpoint whose config does not declare one.
  rewrite_checkpoint(dir.path(), [&](Names& n, Shapes& s, Values& v) {
    n.push_back("model.layers.1.self_attn.k_proj.bias");
    s.push_back({c.num_kv_heads * c.head_dim});
    v.emplace_back(c.num_kv_heads * c.head_dim, 0.5f);
  });
  expect_error([&] { load_hf_checkpoint(dir.path()); }, "model.layers.1.self_attn.k_proj.bias");
  // rotary_emb.inv_freq (old transformers saved it) is the one harmless extra.
  rewrite_checkpoint(dir.path(), [&](Names& n, Shapes& s, Values& v) {
    for (size_t i = 0; i < n.size(); ++i) {
      if (n[i].ends_with("k_proj.bias")) {
        n[i] = "model.layers.0.self_attn.rotary_emb.inv_freq";
        s[i] = {c.head_dim / 2};
        v[i].resize(c.head_dim / 2);
      }
    }
  });
  EXPECT_NO_THROW(load_hf_checkpoint(dir.path()));
  rewrite_checkpoint(dir.path(), [&](Names& n, Shapes& s, Values& v) {
    n.push_back("model.layers.0.mlp.extra_scale");
    s.push_back({1});
    v.push_back({1.f});
  });
  expect_error([&] { load_hf_checkpoint(dir.path()); }, "model.layers.0.mlp.extra_scale");
}

TEST(CheckpointStrict, Qwen2BiasesRoundTripAndAreRequired) {
  ModelConfig c = testing::test_model_config();
  c.family = ModelFamily::kQwen2;
  c.qkv_bias = true;
  c.tie_word_embeddings = true;
  c.hidden_size = c.num_q_heads * c.head_dim;  // Qwen2 has no separate head_dim
  c.layer_window = {-1, 15};
  ModelWeights w = make_random_weights(c, 9);
  w.lm_head.clear();
  TempDir dir("pagoda_ck_qwen2");
  save_hf_checkpoint(dir.path(), c, w, DType::kF32);
  const LoadedModel m = load_hf_checkpoint(dir.path());
  EXPECT_EQ(m.config.family, ModelFamily::kQwen2);
  EXPECT_TRUE(m.config.qkv_bias);
  EXPECT_EQ(m.config.layer_window, c.layer_window);
  EXPECT_EQ(m.config.weights_dtype, DType::kF32);
  EXPECT_EQ(m.weights.layers[1].q_bias, w.layers[1].q_bias);
  EXPECT_EQ(m.weights.layers[0].v_bias, w.layers[0].v_bias);
  EXPECT_TRUE(m.weights.lm_head.empty());
  // Without its biases the checkpoint is incomplete, and the error names the tensor.
  rewrite_checkpoint(dir.path(), [](Names& n, Shapes& s, Values& v) {
    for (size_t i = 0; i < n.size(); ++i) {
      if (n[i] == "model.layers.1.self_attn.v_proj.bias") {
        n.erase(n.begin() + i);
        s.erase(s.begin() + i);
        v.erase(v.begin() + i);
        return;
      }
    }
  });
  expect_error([&] { load_hf_checkpoint(dir.path()); }, "model.layers.1.self_attn.v_proj.bias");
  // The weights must match the config as well.
  ModelWeights no_bias = w;
  for (auto& l : no_bias.layers) l.q_bias.clear();
  expect_error([&] { no_bias.validate(c); }, "q_proj.bias");
}

TEST(CheckpointStrict, TiedHeadCopyMustMatchEmbedding) {
  ModelConfig c = testing::test_model_config();
  c.tie_word_embeddings = true;
  ModelWeights w = make_random_weights(c, 4);
  w.lm_head.clear();
  TempDir dir("pagoda_ck_tied");
  save_hf_checkpoint(dir.path(), c, w, DType::kF32);
  rewrite_checkpoint(dir.path(), [&](Names& n, Shapes& s, Values& v) {
    n.push_back("lm_head.weight");
    s.push_back({c.vocab_size, c.hidden_size});
    v.push_back(w.embed);
  });
  EXPECT_TRUE(load_hf_checkpoint(dir.path()).weights.lm_head.empty());
  rewrite_checkpoint(dir.path(), [](Names& n, Shapes&, Values& v) {
    for (size_t i = 0; i < n.size(); ++i)
      if (n[i] == "lm_head.weight") v[i][3] += 1.f;
  });
  expect_error([&] { load_hf_checkpoint(dir.path()); }, "lm_head.weight");
}

TEST(CheckpointStrict, ShardsAndIndexAreChecked) {
  const ModelConfig c = testing::test_model_config();
  const ModelWeights w = make_random_weights(c, 2);
  TempDir dir("pagoda_ck_shards");
  save_hf_checkpoint(dir.path(), c, w, DType::kF32);
  // The same tensor in two files.
  std::vector<float> norm = w.final_norm;
  write_safetensors(dir.path() / "extra.safetensors",
                    {{"model.norm.weight", {c.hidden_size}, norm.data(), DType::kF32}});
  expect_error([&] { load_hf_checkpoint(dir.path()); }, "model.norm.weight");
  fs::remove(dir.path() / "extra.safetensors");
  // An index naming a file outside the folder.
  std::ofstream(dir.path() / "model.safetensors.index.json")
      << R"({"weight_map": {"model.norm.weight": "../model.safetensors"}})";
  expect_error([&] { load_hf_checkpoint(dir.path()); }, "not a file name");
  std::ofstream(dir.path() / "model.safetensors.index.json") << R"({"weight_map": [1]})";
  expect_error([&] { load_hf_checkpoint(dir.path()); }, "weight_map");
}

TEST(CheckpointStrict, SaveRefusesWhatTransformersCannotExpress) {
  ModelConfig c = testing::test_model_config();
  c.layer_window = {5, -1};  // Llama has no sliding window
  const ModelWeights w = make_random_weights(c, 1);
  TempDir dir("pagoda_ck_save");
  EXPECT_THROW(save_hf_checkpoint(dir.path(), c, w, DType::kF32), Error);
  c.family = ModelFamily::kMistral;  // Mistral slides every layer or none
  EXPECT_THROW(save_hf_checkpoint(dir.path(), c, w, DType::kF32), Error);
  c.layer_window = {5, 5};
  save_hf_checkpoint(dir.path(), c, w, DType::kBF16);
  const LoadedModel m = load_hf_checkpoint(dir.path());
  EXPECT_EQ(m.config.family, ModelFamily::kMistral);
  EXPECT_EQ(m.config.layer_window, c.layer_window);
  EXPECT_EQ(m.config.weights_dtype, DType::kBF16);
}

}  // namespace
}  // namespace pagoda::model
