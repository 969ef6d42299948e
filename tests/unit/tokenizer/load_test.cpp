// load_tokenizer / make_tokenizer_for: file selection and tokenizer_config.json.
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/tokenizer/load.h"

namespace pagoda::tokenizer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

/// A fresh, empty folder under the test temp dir.
fs::path temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("pagoda_tokenizer_load_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write(const fs::path& path, const json& j) { std::ofstream(path) << j.dump(); }

/// Byte-level vocabulary of the 94 printable ASCII characters, plus <s> and </s>, no merges.
json tiny_tokenizer_json() {
  json vocab = json::object();
  int id = 0;
  for (char c = '!'; c <= '~'; ++c) vocab[std::string(1, c)] = id++;
  vocab["<s>"] = id++;
  vocab["</s>"] = id++;
  return json{{"added_tokens", json::array({json{{"id", 94}, {"content", "<s>"}, {"special", true}},
                                            json{{"id", 95}, {"content", "</s>"}, {"special", true}}})},
              {"normalizer", nullptr},
              {"pre_tokenizer", nullptr},
              {"post_processor", nullptr},
              {"decoder", nullptr},
              {"model", json{{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
}

TEST(LoadTokenizer, BuiltinIsTheByteTokenizer) {
  const auto tok = make_tokenizer_for("builtin");
  EXPECT_EQ(tok->kind(), "byte");
  EXPECT_EQ(tok->bos_id(), 256);
  EXPECT_EQ(tok->eos_id(), 257);
}

TEST(LoadTokenizer, ReadsTokenizerConfig) {
  const fs::path dir = temp_dir("config");
  EXPECT_FALSE(has_tokenizer(dir));
  write(dir / "tokenizer.json", tiny_tokenizer_json());
  EXPECT_TRUE(has_tokenizer(dir));
  {
    const auto tok = load_tokenizer(dir);
    EXPECT_EQ(tok->kind(), "hf-bpe");
    EXPECT_EQ(tok->bos_id(), -1);
    EXPECT_EQ(tok->encode("ab", true), (std::vector<int32_t>{'a' - '!', 'b' - '!'}));
  }
  write(dir / "tokenizer_config.json",
        json{{"bos_token", json{{"content", "<s>"}}}, {"eos_token", "</s>"},
             {"add_bos_token", true}, {"add_eos_token", true}});
  const auto tok = load_tokenizer(dir / "tokenizer.json");
  EXPECT_EQ(tok->bos_id(), 94);
  EXPECT_EQ(tok->eos_id(), 95);
  EXPECT_EQ(tok->encode("ab", true), (std::vector<int32_t>{94, 'a' - '!', 'b' - '!', 95}));
  EXPECT_EQ(tok->encode("a<s>", false), (std::vector<int32_t>{'a' - '!', 94}));
  fs::remove_all(dir);
}

TEST(LoadTokenizer, FailsClearly) {
  const fs::path dir = temp_dir("empty");
  try {
    load_tokenizer(dir);
    FAIL() << "loaded a tokenizer from an empty folder";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
  }
  write(dir / "tokenizer.json", json{{"model", json{{"type", "Unigram"}, {"vocab", json::array()}}}});
  EXPECT_THROW(load_tokenizer(dir), Error);
  std::ofstream(dir / "tokenizer.json") << "{not json";
  EXPECT_THROW(load_tokenizer(dir), Error);
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.model") << "garbage";
  EXPECT_THROW(load_tokenizer(dir), Error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pagoda::tokenizer
