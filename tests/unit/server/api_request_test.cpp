// Request parser and stop matcher: field validation (every bad field is named), and the stop
// matcher against a direct search of the whole text on random chunkings.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "pagoda/server/api_request.h"

namespace pagoda::server {
namespace {

ApiError expect_error(const std::string& body, Endpoint ep = Endpoint::kCompletions) {
  try {
    parse_api_request(body, ep);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for " << body;
  return ApiError(0, "", "");
}

TEST(ApiRequest, ParsesACompletion) {
  const ApiRequest r = parse_api_request(
      R"({"model":"m","prompt":"hi","max_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":-1,)"
      R"("seed":42,"stop":["a","bc"],"stream":true,"stream_options":{"include_usage":true},)"
      R"("ignore_eos":true,"user":"x","n":1})",
      Endpoint::kCompletions);
  EXPECT_EQ(*r.model, "m");
  EXPECT_EQ(*r.prompt, "hi");
  EXPECT_EQ(*r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.top_p, 0.9f);
  EXPECT_EQ(r.top_k, -1);
  EXPECT_TRUE(r.has_seed);
  EXPECT_EQ(r.seed, 42u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_TRUE(r.stream && r.include_usage && r.ignore_eos);
}

TEST(ApiRequest, ParsesTokenIdsAndChat) {
  EXPECT_EQ(parse_api_request(R"({"prompt":[1,2,3]})", Endpoint::kCompletions).prompt_ids,
            (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(*parse_api_request(R"({"prompt":["x"]})", Endpoint::kCompletions).prompt, "x");
  const ApiRequest c = parse_api_request(
      R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"max_completion_tokens":3})",
      Endpoint::kChat);
  ASSERT_EQ(c.messages.size(), 2u);
  EXPECT_EQ(c.messages[1].content, "ab");
  EXPECT_EQ(*c.max_tokens, 3);
}

TEST(ApiRequest, NamesTheBadField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"(nope)", "body"},
      {R"([1])", "body"},
      {R"({})", "prompt"},
      {R"({"prompt":5})", "prompt"},
      {R"({"prompt":["a","b"]})", "prompt"},
      {R"({"prompt":[1,-2]})", "prompt"},
      {R"({"prompt":"x","max_tokens":0})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":1.5})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":"3"})", "max_tokens"},
      {R"({"prompt":"x","temperature":-1})", "temperature"},
      {R"({"prompt":"x","temperature":2.5})", "temperature"},
      {R"({"prompt":"x","top_p":0})", "top_p"},
      {R"({"prompt":"x","top_k":-2})", "top_k"},
      {R"({"prompt":"x","min_p":1})", "min_p"},
      {R"({"prompt":"x","seed":"s"})", "seed"},
      {R"({"prompt":"x","stop":[""]})", "stop"},
      {R"({"prompt":"x","stop":["a","b","c","d","e"]})", "stop"},
      {R"({"prompt":"x","stop":3})", "stop"},
      {R"({"prompt":"x","stream":"yes"})", "stream"},
      {R"({"prompt":"x","stream_options":{"include_usage":true}})", "stream_options"},
      {R"({"prompt":"x","n":2})", "n"},
      {R"({"prompt":"x","logprobs":5})", "logprobs"},
      {R"({"prompt":"x","presence_penalty":0.5})", "presence_penalty"},
      {R"({"prompt":"x","model":3})", "model"},
  };
  for (const auto& [body, field] : cases) {
    const ApiError e = expect_error(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, field) << body;
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << body;
  }
  EXPECT_EQ(expect_error(R"({"messages":[]})", Endpoint::kChat).param, "messages");
  EXPECT_EQ(expect_error(R"({"messages":[{"content":"x"}]})", Endpoint::kChat).param,
            "messages[0].role");
  EXPECT_EQ(expect_error(R"({"messages":[{"role":"user"}]})", Endpoint::kChat).param,
            "messages[0].content");
  EXPECT_EQ(expect_error(R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
                         Endpoint::kChat)
                .param,
            "messages[0].content[0].type");
  // The error JSON has OpenAI's shape.
  const std::string j = expect_error(R"({"prompt":"x","n":2})").to_json();
  EXPECT_NE(j.find(R"("error":{)"), std::string::npos) << j;
  EXPECT_NE(j.find(R"("param":"n")"), std::string::npos) << j;
}

/// Reference: the emitted text is the whole text cut before the stop string that completes first
/// (a direct search of the whole text).
TEST(StopMatcher, MatchesADirectSearchOnRandomChunks) {
  const char* env = std::getenv("PAGODA_TEST_SEED");
  const unsigned seed = env ? static_cast<unsigned>(std::strtoul(env, nullptr, 10))
                            : std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  const std::string alphabet = "abc";
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text;
    const int len = static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
    std::vector<std::string> stops;
    const int n = static_cast<int>(rng() % 3);
    for (int k = 0; k < n; ++k) {
      std::string s;
      const int sl = 1 + static_cast<int>(rng() % 4);
      for (int i = 0; i < sl; ++i) s += alphabet[rng() % alphabet.size()];
      stops.push_back(s);
    }
    // The stop string that completes first (then the earliest start) cuts the text.
    size_t cut = std::string::npos, cut_end = std::string::npos;
    for (const auto& s : stops) {
      const size_t at = text.find(s);
      if (at == std::string::npos) continue;
      if (at + s.size() < cut_end || (at + s.size() == cut_end && at < cut)) {
        cut = at;
        cut_end = at + s.size();
      }
    }
    const std::string want = cut == std::string::npos ? text : text.substr(0, cut);

    StopMatcher m(stops);
    std::string got;
    size_t p = 0;
    while (p < text.size()) {
      const size_t k = std::min(text.size() - p, static_cast<size_t>(rng() % 5));
      const std::string piece = m.push(text.substr(p, k));
      got += piece;
      for (const auto& s : stops) ASSERT_EQ(got.find(s), std::string::npos) << "seed " << seed;
      p += k;
      if (m.stopped()) break;
    }
    if (!m.stopped()) got += m.finish();
    ASSERT_EQ(m.stopped(), cut != std::string::npos) << "seed " << seed << " text " << text;
    std::string all;
    for (const auto& s : stops) all += "'" + s + "' ";
    ASSERT_EQ(got, want) << "seed " << seed << " text " << text << " stops " << all;
  }
}

}  // namespace
}  // namespace pagoda::server
