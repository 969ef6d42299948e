// Unit tests of the tokenizer pieces: UTF-8 helpers, ICU normalisation, PCRE2 splitting, BPE
// merges, added tokens, decoders, the byte tokenizer and the incremental detokenizer.
#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/tokenizer/byte_tokenizer.h"
#include "pagoda/tokenizer/hf_tokenizer.h"
#include "pagoda/tokenizer/incremental_detokenizer.h"
#include "pagoda/tokenizer/regex.h"
#include "pagoda/tokenizer/unicode.h"

namespace pagoda::tokenizer {
namespace {

using nlohmann::json;

TEST(Utf8, ValidityAndCompletePrefix) {
  EXPECT_TRUE(is_valid_utf8("h\xC3\xA9llo \xF0\x9F\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("\xC0\x80"));          // overlong
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(is_valid_utf8("\xF0\x9F\x98"));      // truncated
  EXPECT_EQ(utf8_complete_prefix("ab\xF0\x9F\x98"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xFF"), 3u);    // invalid never completes
  EXPECT_EQ(utf8_lossy("a\xF0\x9F" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(utf8_lossy("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(Unicode, IcuNormalisationAndLowercase) {
  EXPECT_EQ(normalize("e\xCC\x81", NormalForm::kNfc), "\xC3\xA9");      // e + U+0301 -> é
  EXPECT_EQ(normalize("\xEF\xAC\x81", NormalForm::kNfkc), "fi");        // ﬁ ligature
  EXPECT_EQ(to_lower("\xC3\x89T\xC3\x89 \xCE\xA3"), "\xC3\xA9t\xC3\xA9 \xCF\x83");
}

TEST(Unicode, ByteLevelTableRoundTrips) {
  const auto& t = ByteLevelTable::get();
  EXPECT_EQ(t.encode(" "), "\xC4\xA0");  // Ġ
  EXPECT_EQ(t.encode("a"), "a");
  for (int b = 0; b < 256; ++b) {
    size_t i = 0;
    EXPECT_EQ(t.decode_cp(next_cp(t.encode_byte(static_cast<unsigned char>(b)), i)), b);
  }
}

TEST(Regex, Gpt2PatternSplits) {
  const Regex re(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
  const std::string text = "Hello world's  12 \xE4\xB8\xAD\xE6\x96\x87!!\n";
  std::vector<std::string> parts;
  for (auto [b, e] : re.find_all(text)) parts.push_back(text.substr(b, e - b));
  const std::vector<std::string> want = {"Hello", " world", "'s", " ", " 12",
                                         " \xE4\xB8\xAD\xE6\x96\x87", "!!", "\n"};
  EXPECT_EQ(parts, want);
  EXPECT_THROW(Regex("(unclosed"), Error);
  // Oniguruma's \s excludes U+180E and its \w includes marks, all numbers and ZWJ.
  EXPECT_EQ(translate_oniguruma(R"([^\s\w]+|\S\W)"),
            R"([^\p{White_Space}\p{L}\p{M}\p{N}\p{Pc}\x{200C}\x{200D}]+|\P{White_Space})"
            R"([^\p{L}\p{M}\p{N}\p{Pc}\x{200C}\x{200D}])");
  EXPECT_TRUE(Regex(R"(\s)").find_all("a\xE1\xA0\x8E" "b").empty());       // U+180E
  EXPECT_EQ(Regex(R"(\w+)").find_all("a\xE2\x80\x8D" "b\xC2\xB2").size(), 1u);  // ZWJ, ²
}

/// A tiny byte-level tokenizer.json: vocabulary of the byte alphabet plus merges.
json tiny_byte_level() {
  json vocab = json::object();
  const auto& t = ByteLevelTable::get();
  for (int b = 0; b < 256; ++b) vocab[t.encode_byte(static_cast<unsigned char>(b))] = b;
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  vocab["hello"] = 259;
  vocab["\xC4\xA0w"] = 260;  // "Ġw"
  return json{
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens",
       json::array({json{{"id", 261}, {"content", "<|bos|>"}, {"special", true},
                         {"lstrip", false}, {"rstrip", false}, {"single_word", false},
                         {"normalized", false}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", json{{"type", "ByteLevel"}, {"add_prefix_space", false},
                             {"trim_offsets", true}, {"use_regex", true}}},
      {"post_processor",
       json{{"type", "TemplateProcessing"},
            {"single", json::array({json{{"SpecialToken", {{"id", "<|bos|>"}, {"type_id", 0}}}},
                                    json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
            {"pair", json::array()},
            {"special_tokens", json{{"<|bos|>", {{"id", "<|bos|>"}, {"ids", {261}},
                                                 {"tokens", {"<|bos|>"}}}}}}}},
      {"decoder", json{{"type", "ByteLevel"}}},
      {"model", json{{"type", "BPE"},
                     {"dropout", nullptr},
                     {"unk_token", nullptr},
                     {"byte_fallback", false},
                     {"vocab", vocab},
                     {"merges", json::array({"h e", "l l", "he ll", "hell o", "\xC4\xA0 w"})}}}};
}

TEST(HfTokenizer, ByteLevelMergesAddedTokensAndTemplate) {
  const HfTokenizer tok(tiny_byte_level());
  EXPECT_EQ(tok.bos_id(), 261);
  EXPECT_EQ(tok.vocab_size(), 262);
  const auto ids = tok.encode("hello world<|bos|>hell", true);
  const std::vector<int32_t> want = {261, 259, 260, 'o', 'r', 'l', 'd', 261, 258};
  EXPECT_EQ(ids, want);
  EXPECT_EQ(tok.decode(ids, false), "<|bos|>hello world<|bos|>hell");
  EXPECT_EQ(tok.decode(ids, true), "hello worldhell");
  EXPECT_EQ(tok.token_to_id("\xC4\xA0w"), 260);
  EXPECT_FALSE(tok.token_to_id("nope").has_value());
  EXPECT_THROW(tok.encode("\xFF", true), Error);
  const std::vector<int32_t> unknown = {'a', 9999, 'b'};  // left out, as `tokenizers` does
  EXPECT_EQ(tok.decode(unknown, false), "ab");
}

TEST(HfTokenizer, UnsupportedFieldsAreErrorsNamingTheField) {
  json j = tiny_byte_level();
  j["normalizer"] = json{{"type", "Precompiled"}, {"precompiled_charsmap", "xx"}};
  try {
    HfTokenizer t(j);
    FAIL() << "accepted an unsupported normalizer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Precompiled"), std::string::npos) << e.what();
  }
  j = tiny_byte_level();
  j["model"]["dropout"] = 0.1;
  EXPECT_THROW(HfTokenizer t(j), Error);
  j = tiny_byte_level();
  j["model"]["type"] = "WordPiece";
  EXPECT_THROW(HfTokenizer t(j), Error);
}

// Hostile ids: a huge vocab id would size the id table (a 20-byte file asking for 2^31
// strings), a float / string / negative / 64-bit id would be narrowed silently, and an added
// token id of INT32_MAX made `id + 1` overflow. Each is an Error naming the field.
TEST(HfTokenizer, HostileTokenIdsAreErrorsNamingTheField) {
  auto expect_error = [](json j, const std::string& field) {
    try {
      HfTokenizer t(j);
      ADD_FAILURE() << "accepted " << field << ": " << j.dump().substr(0, 200);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  for (const json& bad : {json(2147483647), json(int64_t{1} << 40), json(-1), json(1.5),
                         json("3"), json(uint64_t{18446744073709551615ull})}) {
    json j = tiny_byte_level();
    j["model"]["vocab"]["hello"] = bad;
    expect_error(j, "model.vocab['hello']");
    j = tiny_byte_level();
    j["added_tokens"][0]["id"] = bad;
    expect_error(j, "added_tokens[].id");
  }
  json sparse = tiny_byte_level();  // a valid id, but 16M unused ids below it
  sparse["model"]["vocab"]["hello"] = (1 << 24) - 1;
  expect_error(sparse, "unused ids");
  json holes = tiny_byte_level();  // a few holes are fine
  holes["model"]["vocab"]["hello"] = 1000;
  EXPECT_EQ(HfTokenizer(holes).token_to_id("hello"), 1000);
}

TEST(HfTokenizer, SentencePieceStyleByteFallback) {
  json vocab = json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 2 + b;
  vocab["\xE2\x96\x81"] = 258;  // ▁
  vocab["a"] = 259;
  vocab["\xE2\x96\x81" "a"] = 260;
  const json j{
      {"added_tokens", json::array({json{{"id", 1}, {"content", "<s>"}, {"special", true},
                                         {"normalized", false}}})},
      {"normalizer", json{{"type", "Sequence"},
                          {"normalizers", json::array({json{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
                                                       json{{"type", "Replace"},
                                                            {"pattern", {{"String", " "}}},
                                                            {"content", "\xE2\x96\x81"}}})}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       json{{"type", "TemplateProcessing"},
            {"single", json::array({json{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                    json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
            {"special_tokens", json{{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder", json{{"type", "Sequence"},
                       {"decoders", json::array({json{{"type", "Replace"},
                                                      {"pattern", {{"String", "\xE2\x96\x81"}}},
                                                      {"content", " "}},
                                                 json{{"type", "ByteFallback"}},
                                                 json{{"type", "Fuse"}},
                                                 json{{"type", "Strip"}, {"content", " "},
                                                      {"start", 1}, {"stop", 0}}})}}},
      {"model", json{{"type", "BPE"}, {"unk_token", "<unk>"}, {"byte_fallback", true},
                     {"fuse_unk", true}, {"vocab", vocab},
                     {"merges", json::array({json::array({"\xE2\x96\x81", "a"})})}}}};
  const HfTokenizer tok(j);
  const auto ids = tok.encode("a a\xC3\xA9", true);
  // <s> ▁a ▁a <0xC3> <0xA9>
  const std::vector<int32_t> want = {1, 260, 260, 2 + 0xC3, 2 + 0xA9};
  EXPECT_EQ(ids, want);
  EXPECT_EQ(tok.decode(ids, true), "a a\xC3\xA9");
  // A lone continuation byte token decodes to U+FFFD.
  const std::vector<int32_t> lone = {2 + 0xA9};
  EXPECT_EQ(tok.decode(lone, true), "\xEF\xBF\xBD");
}

TEST(HfTokenizer, LongTextEncodesInLinearTime) {
  // Encoding time must grow linearly with the text (a quadratic pre-tokenizer or merge loop
  // takes 64x for 8x the text). A ratio, not an absolute time: sanitizer builds and loaded
  // machines change the constant, not the exponent.
  const HfTokenizer tok(tiny_byte_level());
  std::mt19937 rng(7);
  const char* words[] = {"hello", "world", "hell", "12345", "\xE4\xB8\xAD", "  ", "\n", "o!"};
  auto make = [&](size_t bytes) {
    std::string text;
    while (text.size() < bytes) text += std::string(words[rng() % 8]) + " ";
    return text;
  };
  auto seconds = [&](const std::string& text, std::vector<int32_t>& ids) {
    const auto t0 = std::chrono::steady_clock::now();
    ids = tok.encode(text, false);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const std::string small = make(1u << 17), big = make(1u << 20);
  std::vector<int32_t> ids_small, ids_big;
  // Best of 3, interleaved, so a burst of load on a busy machine (ctest -j) hits both sizes.
  double ts = 1e30, tb = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    ts = std::min(ts, seconds(small, ids_small));
    tb = std::min(tb, seconds(big, ids_big));
  }
  EXPECT_LT(tb, 20.0 * std::max(ts, 1e-3)) << "8x the text took " << tb / ts << "x the time";
  EXPECT_EQ(tok.decode(ids_small, false), small);
  EXPECT_EQ(tok.decode(ids_big, false), big);
}

TEST(ByteTokenizer, RoundTripsAndSpecials) {
  const ByteTokenizer tok;
  const std::string s = "hello \xff\x01 world";
  const auto ids = tok.encode(s, true);
  EXPECT_EQ(ids.front(), 256);
  EXPECT_EQ(ids.size(), s.size() + 1);
  EXPECT_EQ(tok.decode(ids, true), s);
  EXPECT_EQ(tok.vocab_size(), 258);
  EXPECT_EQ(tok.eos_id(), 257);
  EXPECT_TRUE(tok.is_special(257));
  EXPECT_EQ(tok.encode("ab", false).size(), 2u);
  EXPECT_THROW(ByteTokenizer(-5, 257), Error);
}

TEST(IncrementalDetokenizer, EmitsOnlyCompleteUtf8) {
  const ByteTokenizer tok;
  const std::string text = "a\xF0\x9F\x98\x80" "b\xE4\xB8\xAD";
  IncrementalDetokenizer detok(tok, true);
  std::vector<std::string> pieces;
  for (int32_t id : tok.encode(text, false)) pieces.push_back(detok.push(id));
  const std::vector<std::string> want = {"a", "", "", "", "\xF0\x9F\x98\x80", "b", "", "",
                                         "\xE4\xB8\xAD"};
  EXPECT_EQ(pieces, want);
  EXPECT_EQ(detok.finish(), "");
  IncrementalDetokenizer tail(tok, true);
  EXPECT_EQ(tail.push(0xE4), "");
  EXPECT_EQ(tail.finish(), "\xE4");
}

TEST(IncrementalDetokenizer, MatchesFullDecodeOnBpe) {
  const HfTokenizer tok(tiny_byte_level());
  const std::string text = "hello world \xE4\xB8\xAD\xF0\x9F\x98\x80 hell<|bos|>o";
  const auto ids = tok.encode(text, true);
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 3);
  IncrementalDetokenizer detok(tok, false, prompt);
  std::string streamed;
  for (size_t i = 3; i < ids.size(); ++i) streamed += detok.push(ids[i]);
  streamed += detok.finish();
  EXPECT_EQ(streamed, tok.decode(std::span(ids).subspan(3), false));
}

}  // namespace
}  // namespace pagoda::tokenizer
