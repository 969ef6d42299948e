// Request parser and stop matcher: field validation (every bad field is named), and the stop
// matcher against a direct search of the whole text on random chunkings.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/server/api_request.h"
#include "test_seed.h"

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
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(*r.prompts[0].text, "hi");
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
  EXPECT_EQ(parse_api_request(R"({"prompt":[1,2,3]})", Endpoint::kCompletions).prompts[0].ids,
            (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(*parse_api_request(R"({"prompt":["x"]})", Endpoint::kCompletions).prompts[0].text, "x");
  const ApiRequest c = parse_api_request(
      R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"max_completion_tokens":3})",
      Endpoint::kChat);
  ASSERT_EQ(c.messages.size(), 2u);
  EXPECT_EQ(c.messages[1].content, "ab");
  EXPECT_EQ(*c.max_tokens, 3);
}

TEST(ApiRequest, ParsesPromptListsChoicesAndStopIds) {
  const ApiRequest r = parse_api_request(
      R"({"prompt":["a",[5,6],"b"],"n":3,"best_of":3,"echo":true,"stop_token_ids":[7,8]})",
      Endpoint::kCompletions);
  ASSERT_EQ(r.prompts.size(), 3u);
  EXPECT_EQ(*r.prompts[0].text, "a");
  EXPECT_FALSE(r.prompts[1].text.has_value());
  EXPECT_EQ(r.prompts[1].ids, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(*r.prompts[2].text, "b");
  EXPECT_EQ(r.n, 3);
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.stop_token_ids, (std::vector<int32_t>{7, 8}));
  const TokenizeRequest t = parse_tokenize_request(R"({"prompt":"hi","add_special_tokens":false})");
  EXPECT_EQ(*t.prompt, "hi");
  EXPECT_FALSE(t.add_special_tokens);
  EXPECT_EQ(parse_tokenize_request(R"({"messages":[{"role":"user","content":"x"}]})").messages.size(),
            1u);
  EXPECT_EQ(parse_detokenize_request(R"({"tokens":[1,2]})").tokens, (std::vector<int32_t>{1, 2}));
  for (const auto& [body, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"prompt":"a","messages":[]})", "prompt"},
           {R"({})", "prompt"},
           {R"({"prompt":"a","max_tokens":3})", "max_tokens"}}) {
    try {
      parse_tokenize_request(body);
      ADD_FAILURE() << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param, field) << body;
    }
  }
  try {
    parse_detokenize_request(R"({"tokens":[1,"x"]})");
    ADD_FAILURE();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "tokens");
  }
}

TEST(ApiRequest, ParsesPenaltiesAndLogitBias) {
  const ApiRequest r = parse_api_request(
      R"({"messages":[{"role":"user","content":"x"}],"presence_penalty":-1.5,
          "frequency_penalty":0.25,"repetition_penalty":1.2,"logit_bias":{"42":-100,"7":3.5}})",
      Endpoint::kChat);
  EXPECT_FLOAT_EQ(r.presence_penalty, -1.5f);
  EXPECT_FLOAT_EQ(r.frequency_penalty, 0.25f);
  EXPECT_FLOAT_EQ(r.repetition_penalty, 1.2f);
  EXPECT_EQ(r.logit_bias, (std::vector<std::pair<int32_t, float>>{{42, -100.f}, {7, 3.5f}}));
  const ApiRequest d = parse_api_request(R"({"prompt":"x"})", Endpoint::kCompletions);
  EXPECT_EQ(d.presence_penalty, 0.f);
  EXPECT_EQ(d.frequency_penalty, 0.f);
  EXPECT_EQ(d.repetition_penalty, 1.f);
  EXPECT_TRUE(d.logit_bias.empty());
  EXPECT_EQ(d.logprobs, -1);
}

TEST(ApiRequest, ParsesLogprobs) {
  EXPECT_EQ(parse_api_request(R"({"prompt":"x","logprobs":3})", Endpoint::kCompletions).logprobs, 3);
  EXPECT_EQ(parse_api_request(R"({"prompt":"x","logprobs":0})", Endpoint::kCompletions).logprobs, 0);
  EXPECT_EQ(parse_api_request(R"({"prompt":"x","logprobs":false})", Endpoint::kCompletions).logprobs,
            -1);
  const std::string chat = R"({"messages":[{"role":"user","content":"x"}],)";
  EXPECT_EQ(parse_api_request(chat + R"("logprobs":true})", Endpoint::kChat).logprobs, 0);
  EXPECT_EQ(parse_api_request(chat + R"("logprobs":true,"top_logprobs":20})", Endpoint::kChat)
                .logprobs,
            20);
  EXPECT_EQ(parse_api_request(chat + R"("logprobs":false})", Endpoint::kChat).logprobs, -1);
}

TEST(ApiRequest, ParsesResponseFormat) {
  using Type = ResponseFormat::Type;
  EXPECT_EQ(parse_api_request(R"({"prompt":"x"})", Endpoint::kCompletions).response_format.type,
            Type::kText);
  EXPECT_EQ(parse_api_request(R"({"prompt":"x","response_format":{"type":"text"}})",
                              Endpoint::kCompletions).response_format.type, Type::kText);
  EXPECT_EQ(parse_api_request(R"({"messages":[{"role":"user","content":"x"}],
                                  "response_format":{"type":"json_object"}})",
                              Endpoint::kChat).response_format.type, Type::kJsonObject);
  const std::string schema =
      R"({"type":"object","properties":{"a":{"type":"integer","minimum":-3}},"required":["a"]})";
  const ApiRequest r = parse_api_request(
      R"({"prompt":"x","response_format":{"type":"json_schema","json_schema":{"name":"n",
          "strict":true,"schema":)" + schema + "}}}",
      Endpoint::kCompletions);
  EXPECT_EQ(r.response_format.type, Type::kJsonSchema);
  EXPECT_EQ(nlohmann::json::parse(r.response_format.schema), nlohmann::json::parse(schema));
}

TEST(ApiRequest, ParsesToolsAndToolChoice) {
  const std::string chat = R"({"messages":[{"role":"user","content":"x"}],"tools":[
      {"type":"function","function":{"name":"get_w","parameters":{"type":"object",
       "properties":{"c":{"type":"string"}}}}},{"type":"function","function":{"name":"f-2"}}],)";
  ApiRequest r = parse_api_request(chat + R"("tool_choice":"required"})", Endpoint::kChat);
  ASSERT_EQ(r.tools.size(), 2u);
  EXPECT_EQ(r.tools[0].name, "get_w");
  EXPECT_EQ(nlohmann::json::parse(r.tools[0].parameters)["properties"]["c"]["type"], "string");
  EXPECT_EQ(nlohmann::json::parse(r.tools[1].parameters), nlohmann::json::parse(R"({"type":"object"})"));
  EXPECT_EQ(nlohmann::json::parse(r.tools[1].json)["function"]["name"], "f-2");
  EXPECT_EQ(r.tool_call, std::optional<std::string>(""));
  r = parse_api_request(chat + R"("tool_choice":{"type":"function","function":{"name":"f-2"}}})",
                        Endpoint::kChat);
  EXPECT_EQ(r.tool_call, std::optional<std::string>("f-2"));
  EXPECT_FALSE(r.tool_auto);
  r = parse_api_request(chat + R"("tool_choice":"none"})", Endpoint::kChat);
  EXPECT_FALSE(r.tool_call.has_value());
  EXPECT_FALSE(r.tool_auto);
  EXPECT_EQ(r.tools.size(), 2u);
  for (const char* tail : {R"("n":1})", R"("tool_choice":"auto"})"}) {  // no tool_choice = auto
    r = parse_api_request(chat + tail, Endpoint::kChat);
    EXPECT_TRUE(r.tool_auto && !r.tool_call.has_value()) << tail;
  }
  EXPECT_TRUE(r.parallel_tool_calls);  // OpenAI's default
  r = parse_api_request(chat + R"("tool_choice":"required","parallel_tool_calls":false})",
                        Endpoint::kChat);
  EXPECT_FALSE(r.parallel_tool_calls);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"("tool_choice":"sometimes"})", "tool_choice"},
      {R"("tool_choice":{"type":"function","function":{"name":"zz"}}})", "tool_choice.function.name"},
      {R"("tool_choice":"required","response_format":{"type":"json_object"}})", "response_format"},
      {R"("tool_choice":"auto","response_format":{"type":"json_object"}})", "response_format"},
      {R"("response_format":{"type":"json_object"}})", "response_format"},  // auto by default
      {R"("parallel_tool_calls":"yes"})", "parallel_tool_calls"},
  };
  for (const auto& [tail, field] : bad) {
    const ApiError e = expect_error(chat + tail, Endpoint::kChat);
    EXPECT_EQ(e.param, field) << tail;
  }
  // Without tools (chat), and on completions (not a field there): named.
  EXPECT_EQ(expect_error(R"({"messages":[{"role":"user","content":"x"}],"parallel_tool_calls":true})",
                         Endpoint::kChat).param, "parallel_tool_calls");
  EXPECT_EQ(expect_error(R"({"prompt":"x","parallel_tool_calls":true})", Endpoint::kCompletions).param,
            "parallel_tool_calls");
  const std::string head = R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required",)";
  const std::vector<std::pair<std::string, std::string>> bad_tools = {
      {R"("tools":[{"type":"function","function":{"name":"a b"}}]})", "tools[0].function.name"},
      {R"("tools":[{"type":"function","function":{"name":"a"}},{"type":"function","function":{"name":"a"}}]})",
       "tools[1].function.name"},
      {R"("tools":[{"type":"function","function":{"name":"a","parameters":[]}}]})",
       "tools[0].function.parameters"},
      {R"("tools":[{"type":"function","function":{"name":"a","x":1}}]})", "tools[0].function.x"},
      {R"("tools":[{"type":"retrieval"}]})", "tools[0]"},
  };
  for (const auto& [tail, field] : bad_tools) {
    const ApiError e = expect_error(head + tail, Endpoint::kChat);
    EXPECT_EQ(e.param, field) << tail;
  }
}

TEST(ApiRequest, ParsesToolTurnsForTheTemplate) {
  const ApiRequest r = parse_api_request(R"({"messages":[
      {"role":"user","content":"weather?"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
        "function":{"name":"get_w","arguments":"{\"city\": \"Oslo\", \"n\": [1, 2]}"}},
        {"id":"c2","type":"function","function":{"name":"f","arguments":"not json"}}]},
      {"role":"tool","tool_call_id":"c1","content":"sunny"},
      {"role":"assistant","content":"ok"}]})",
                                         Endpoint::kChat);
  const nlohmann::ordered_json m = template_messages(r.messages);
  ASSERT_EQ(m.size(), 4u);
  EXPECT_TRUE(m[1]["content"].is_null());
  EXPECT_EQ(m[1]["tool_calls"][0]["id"], "c1");
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["name"], "get_w");
  // arguments reach the template as an object (as transformers, vLLM and SGLang pass them), in
  // the client's key order; text that is not a JSON object stays a string.
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["arguments"].dump(), R"({"city":"Oslo","n":[1,2]})");
  EXPECT_EQ(m[1]["tool_calls"][1]["function"]["arguments"], "not json");
  EXPECT_EQ(m[2]["role"], "tool");
  EXPECT_EQ(m[2]["tool_call_id"], "c1");
  EXPECT_EQ(m[2]["content"], "sunny");
  EXPECT_FALSE(m[3].contains("tool_calls"));
  EXPECT_FALSE(m[0].contains("tool_call_id"));
  const std::string head = R"({"messages":[{"role":"assistant",)";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"("tool_calls":{}}]})", "messages[0].tool_calls"},
      {R"("tool_calls":[{"id":"a","type":"function","function":{"name":"f"}}]}]})",
       "messages[0].tool_calls[0].function.arguments"},
      {R"("tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":{}}}]}]})",
       "messages[0].tool_calls[0].function.arguments"},
      {R"("tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"}}]}]})",
       "messages[0].tool_calls[0].id"},
      {R"("tool_calls":[{"id":"a","type":"x","function":{"name":"f","arguments":"{}"}}]}]})",
       "messages[0].tool_calls[0].type"},
      {R"("tool_calls":[{"id":"a","extra":1,"function":{"name":"f","arguments":"{}"}}]}]})",
       "messages[0].tool_calls[0].extra"},
      {R"("tool_calls":[{"id":"a","function":{"name":"f","arguments":"{}","x":2}}]}]})",
       "messages[0].tool_calls[0].function.x"},
      {R"("content":"x","tool_call_id":5}]})", "messages[0].tool_call_id"},
      {R"("content":"x","name":"bob"}]})", "messages[0].name"},
      {R"("tool_call_id":"a"}]})", "messages[0].content"},
  };
  for (const auto& [tail, field] : bad) {
    const ApiError e = expect_error(head + tail, Endpoint::kChat);
    EXPECT_EQ(e.param, field) << tail;
  }
}

TEST(ApiRequest, NamesTheBadField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"(nope)", "body"},
      {R"([1])", "body"},
      {R"({})", "prompt"},
      {R"({"prompt":5})", "prompt"},
      {R"({"prompt":["a",[]]})", "prompt[1]"},
      {R"({"prompt":["a",[1,-1]]})", "prompt[1]"},
      {R"({"prompt":[[1],"b",{}]})", "prompt[2]"},
      {R"({"prompt":"x","n":0})", "n"},
      {R"({"prompt":"x","n":129})", "n"},
      {R"({"prompt":["a","b","c"],"n":43})", "n"},
      {R"({"prompt":"x","n":2,"best_of":3})", "best_of"},
      {R"({"prompt":"x","stop_token_ids":[1,-2]})", "stop_token_ids"},
      {R"({"prompt":"x","stop_token_ids":3})", "stop_token_ids"},
      {R"({"prompt":"x","echo":1})", "echo"},
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
      {R"({"prompt":"x","logprobs":21})", "logprobs"},
      {R"({"prompt":"x","logprobs":true})", "logprobs"},
      {R"({"prompt":"x","logprobs":2,"echo":true})", "logprobs"},
      {R"({"prompt":"x","top_logprobs":2})", "top_logprobs"},
      {R"({"prompt":"x","presence_penalty":2.5})", "presence_penalty"},
      {R"({"prompt":"x","frequency_penalty":-3})", "frequency_penalty"},
      {R"({"prompt":"x","repetition_penalty":0})", "repetition_penalty"},
      {R"({"prompt":"x","repetition_penalty":2.5})", "repetition_penalty"},
      {R"({"prompt":"x","repetition_penalty":1e-300})", "repetition_penalty"},
      {R"({"prompt":"x","logit_bias":[1]})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"a":1}})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"-1":1}})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"1":101}})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"1":"2"}})", "logit_bias"},
      {R"({"prompt":"x","model":3})", "model"},
  };
  for (const auto& [body, field] : cases) {
    const ApiError e = expect_error(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, field) << body;
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << body;
  }
  EXPECT_EQ(expect_error(R"({"messages":[]})", Endpoint::kChat).param, "messages");
  const std::string chat = R"({"messages":[{"role":"user","content":"x"}],)";
  EXPECT_EQ(expect_error(chat + R"("logprobs":3})", Endpoint::kChat).param, "logprobs");
  EXPECT_EQ(expect_error(chat + R"("top_logprobs":3})", Endpoint::kChat).param, "top_logprobs");
  EXPECT_EQ(expect_error(chat + R"("logprobs":true,"top_logprobs":21})", Endpoint::kChat).param,
            "top_logprobs");
  EXPECT_EQ(expect_error(R"({"messages":[{"content":"x"}]})", Endpoint::kChat).param,
            "messages[0].role");
  EXPECT_EQ(expect_error(R"({"messages":[{"role":"user"}]})", Endpoint::kChat).param,
            "messages[0].content");
  EXPECT_EQ(expect_error(R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
                         Endpoint::kChat)
                .param,
            "messages[0].content[0].type");
  // The error JSON has OpenAI's shape.
  const std::string j = expect_error(R"({"prompt":"x","n":0})").to_json();
  EXPECT_NE(j.find(R"("error":{)"), std::string::npos) << j;
  EXPECT_NE(j.find(R"("param":"n")"), std::string::npos) << j;
}

/// Reference: the emitted text is the whole text cut before the stop string that completes first
/// (a direct search of the whole text).
TEST(StopMatcher, MatchesADirectSearchOnRandomChunks) {
  const pagoda::testing::TestSeed seed;
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
      for (const auto& s : stops) ASSERT_EQ(got.find(s), std::string::npos);
      p += k;
      if (m.stopped()) break;
    }
    if (!m.stopped()) got += m.finish();
    ASSERT_EQ(m.stopped(), cut != std::string::npos) << "text " << text;
    std::string all;
    for (const auto& s : stops) all += "'" + s + "' ";
    ASSERT_EQ(got, want) << "text " << text << " stops " << all;
  }
}

TEST(ApiRequest, RefusesFieldsItDoesNotImplement) {
  const std::vector<std::tuple<std::string, Endpoint, std::string>> cases = {
      {R"({"prompt":"x","tools":[{"type":"function"}]})", Endpoint::kCompletions, "tools"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[]})", Endpoint::kChat, "tools"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"none"})", Endpoint::kChat,
       "tool_choice"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"xml"}})",
       Endpoint::kChat, "response_format.type"},
      {R"({"prompt":"x","response_format":{"type":"json_schema","json_schema":{"name":"a"}}})",
       Endpoint::kCompletions, "response_format.json_schema.schema"},
      {R"({"prompt":"x","response_format":{"type":"json_schema","json_schema":{"schema":{},"strict":1}}})",
       Endpoint::kCompletions, "response_format.json_schema.strict"},
      {R"({"prompt":"x","response_format":{"type":"json_object","schema":{}}})",
       Endpoint::kCompletions, "response_format.schema"},
      {R"({"prompt":"x","response_format":"json"})", Endpoint::kCompletions, "response_format"},
      {R"({"prompt":"x","suffix":"y"})", Endpoint::kCompletions, "suffix"},
      {R"({"prompt":"x","temprature":0})", Endpoint::kCompletions, "temprature"},
      {R"({"messages":[{"role":"user","content":"x"}],"echo":true})", Endpoint::kChat, "echo"},
      {R"({"prompt":"x","messages":[]})", Endpoint::kCompletions, "messages"},
      {R"({"messages":[{"role":"user","content":"x","name":"b"}]})", Endpoint::kChat,
       "messages[0].name"},
      {R"({"prompt":"x","stream":true,"stream_options":{"x":1}})", Endpoint::kCompletions,
       "stream_options.x"},
  };
  for (const auto& [body, ep, field] : cases) {
    const ApiError e = expect_error(body, ep);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, field) << body;
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
  // null means "not given": accepted.
  EXPECT_EQ(*parse_api_request(R"({"prompt":"x","tools":null,"suffix":null})",
                               Endpoint::kCompletions).prompts[0].text, "x");
}

TEST(ApiRequest, BoundsNestingAndValueCount) {
  auto nested = [](int depth) {
    return R"({"prompt":)" + std::string(depth, '[') + "1" + std::string(depth, ']') + "}";
  };
  // Depth counts the top-level object: a prompt nested kMaxJsonDepth - 1 deep fits the bound
  // (and is then refused as a prompt), one more level is refused as a body.
  EXPECT_EQ(expect_error(nested(kMaxJsonDepth - 1)).param, "prompt[0]");
  EXPECT_EQ(expect_error(nested(kMaxJsonDepth)).param, "body");
  // An unimplemented field is refused before its (large, deep) value is looked at.
  EXPECT_EQ(expect_error(R"({"prompt":"x","extra":)" + std::string(100000, '[')).param, "extra");
  auto arrays = [](int64_t n) {  // the object, the outer array and n - 2 inner arrays
    std::string b = R"({"prompt":[)";
    for (int64_t i = 0; i < n - 2; ++i) b += "[1],";
    b.back() = ']';
    return b + "}";
  };
  EXPECT_EQ(expect_error(arrays(kMaxJsonContainers)).param, "n");  // fits; then too many choices
  EXPECT_EQ(expect_error(arrays(kMaxJsonContainers + 1)).param, "body");
  std::string ids = R"({"prompt":[)";
  for (int64_t i = 0; i < kMaxJsonValues; ++i) ids += "1,";
  ids.back() = ']';
  EXPECT_EQ(expect_error(ids + "}").param, "body");  // the object, the array and 2^21 ids
  ids.resize(ids.size() - 5);  // two ids fewer: drop ",1,1]"
  ids += "]}";
  EXPECT_EQ(parse_api_request(ids, Endpoint::kCompletions).prompts[0].ids.size(),
            static_cast<size_t>(kMaxJsonValues - 2));
}

TEST(ClientText, ValidUtf8IsUnchangedOnRandomText) {
  const pagoda::testing::TestSeed seed;
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s;
    const int n = std::uniform_int_distribution<int>(0, 40)(rng);
    for (int i = 0; i < n; ++i) {  // random code points of every length, no surrogates
      static constexpr uint32_t kMax[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
      const int len = std::uniform_int_distribution<int>(0, 3)(rng);
      uint32_t cp = std::uniform_int_distribution<uint32_t>(len ? kMax[len - 1] + 1 : 0, kMax[len])(rng);
      if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0x20;
      if (cp < 0x80) {
        s += static_cast<char>(cp);
      } else if (cp < 0x800) {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      } else if (cp < 0x10000) {
        s += static_cast<char>(0xE0 | (cp >> 12));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      } else {
        s += static_cast<char>(0xF0 | (cp >> 18));
        s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      }
    }
    EXPECT_EQ(client_text(s), s);
  }
}

TEST(ClientText, InvalidUtf8BecomesReplacementCharacters) {
  // The Unicode Standard's example of U+FFFD substitution (chapter 3, "maximal subparts"):
  // 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 -> a FFFD FFFD FFFD b FFFD c FFFD FFFD d.
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(client_text("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
            "a" + r + r + r + "b" + r + "c" + r + r + "d");
  EXPECT_EQ(client_text("\xC3"), r);  // an incomplete sequence at the end
  EXPECT_EQ(client_text("x\xC3\xA9y"), "x\xC3\xA9y");
}

}  // namespace
}  // namespace pagoda::server
