// Tool-call parsers (tool_parser.h): hand-written replies of each format (text before a call,
// several calls, malformed, unknown functions, cut short), and random replies assembled from
// known pieces, whose calls and text the assembly knows, parsed whole and streamed in random
// chunks.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/server/tool_parser.h"
#include "test_seed.h"

namespace pagoda::server {
namespace {

const std::vector<ToolSpec>& parser_tools() {
  static const std::vector<ToolSpec> tools = {{.name = "get_w"}, {.name = "f-2"}};
  return tools;
}

ParsedReply parse(ToolCallFormat f, std::string_view text) {
  return parse_tool_calls(f, text, parser_tools());
}

/// The reply streamed through a ToolCallSplitter in `cuts`-sized pieces (cycled): its content
/// and the calls finish() reports, which the call pieces joined by index must equal when
/// `pieces_whole` (a reply a grammar admits; not one cut inside a call or with a malformed call
/// that looks like one while it is written).
ParsedReply split_in(ToolCallFormat f, std::string_view text, const std::vector<size_t>& cuts,
                     bool pieces_whole = true) {
  ToolCallSplitter s(f, parser_tools());
  ParsedReply joined;
  auto take = [&](const SplitPiece& p) {
    joined.content += p.content;
    for (const ToolCallDelta& d : p.calls) {
      EXPECT_LE(d.index, joined.calls.size()) << text;
      EXPECT_EQ(d.name.empty(), d.index < joined.calls.size()) << text;  // the first names it
      if (d.index == joined.calls.size()) joined.calls.push_back({d.name, ""});
      if (d.index < joined.calls.size()) joined.calls[d.index].arguments += d.arguments;
    }
  };
  size_t pos = 0;
  for (size_t i = 0; pos < text.size(); ++i) {
    const size_t n = std::min(text.size() - pos, cuts[i % cuts.size()]);
    take(s.push(text.substr(pos, n)));
    pos += n;
  }
  const ToolCallSplitter::End end = s.finish();
  take(end.rest);
  if (pieces_whole) {
    EXPECT_EQ(joined.calls, end.calls) << text;
  }
  return {joined.content, end.calls};
}

ParsedToolCall call(const std::string& name, const std::string& args) { return {name, args}; }

void expect_reply(ToolCallFormat f, const std::string& text, const std::string& content,
                  const std::vector<ParsedToolCall>& calls, bool pieces_whole = true) {
  for (const ParsedReply& r : {parse(f, text), split_in(f, text, {1}, pieces_whole),
                               split_in(f, text, {3, 7}, pieces_whole)}) {
    EXPECT_EQ(r.content, content) << text;
    EXPECT_EQ(r.calls, calls) << text;
  }
}

TEST(ToolParser, NamesAndMarkers) {
  EXPECT_EQ(tool_call_format("qwen25"), ToolCallFormat::kQwen25);
  EXPECT_EQ(tool_call_format("hermes"), ToolCallFormat::kQwen25);
  EXPECT_EQ(tool_call_format("llama3"), ToolCallFormat::kLlama3);
  EXPECT_EQ(tool_call_format("mistral"), ToolCallFormat::kMistral);
  EXPECT_FALSE(tool_call_format("pythonic").has_value());
  for (const std::string& n : tool_call_format_names()) EXPECT_TRUE(tool_call_format(n)) << n;
  EXPECT_EQ(tool_call_markers(ToolCallFormat::kLlama3), std::vector<std::string>{"<|python_tag|>"});
}

TEST(ToolParser, Qwen25) {
  const auto f = ToolCallFormat::kQwen25;
  expect_reply(f, "plain text, no call", "plain text, no call", {});
  expect_reply(f, "<tool_call>\n{\"name\": \"get_w\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
               "", {call("get_w", R"({"city": "Oslo"})")});
  expect_reply(f,
               "Let me look.\n<tool_call>\n{\"name\": \"get_w\", \"arguments\": {}}\n</tool_call>\n"
               "<tool_call>{\"arguments\": {\"a\": [1, \"}\"]}, \"name\": \"f-2\"}</tool_call>",
               "Let me look.\n\n", {call("get_w", "{}"), call("f-2", R"({"a": [1, "}"]})")});
  // Malformed JSON, an unknown function, arguments that are not an object: text, verbatim.
  for (const std::string bad : {"<tool_call>{\"name\": \"get_w\", \"arguments\": {}</tool_call>",
                                "<tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call>",
                                "<tool_call>{\"name\": \"get_w\", \"arguments\": 3}</tool_call>",
                                "<tool_call>[1]</tool_call>"})
    expect_reply(f, "a " + bad + " b", "a " + bad + " b", {}, false);
  // One bad block among good ones stays text; the good one is a call.
  expect_reply(f, "<tool_call>{\"name\": \"x\"}</tool_call>\n<tool_call>{\"name\": \"f-2\"}</tool_call>",
               "<tool_call>{\"name\": \"x\"}</tool_call>\n", {call("f-2", "{}")});
  // Cut short (max_tokens): no closing tag.
  expect_reply(f, "hi <tool_call>{\"name\": \"get_w\", \"argu", "hi <tool_call>{\"name\": \"get_w\", \"argu", {});
  expect_reply(f, "a <tool_ca", "a <tool_ca", {});
}

TEST(ToolParser, Llama3) {
  const auto f = ToolCallFormat::kLlama3;
  expect_reply(f, "{\"name\": \"get_w\", \"parameters\": {\"city\": \"Oslo\"}}", "",
               {call("get_w", R"({"city": "Oslo"})")});
  expect_reply(f, "<|python_tag|>{\"name\": \"f-2\", \"arguments\": {\"x\": 1}}", "",
               {call("f-2", R"({"x": 1})")});
  expect_reply(f,
               "  \n{\"name\": \"get_w\", \"parameters\": {}}; {\"name\": \"f-2\", \"parameters\": {}}",
               "", {call("get_w", "{}"), call("f-2", "{}")});
  expect_reply(f, "Sure. <|python_tag|>{\"name\": \"get_w\", \"parameters\": {}}", "Sure. ",
               {call("get_w", "{}")});
  // JSON that is not a call, text with braces later on, a call cut short: text.
  expect_reply(f, "{\"answer\": 42}", "{\"answer\": 42}", {});
  expect_reply(f, "x {\"name\": \"get_w\", \"parameters\": {}}", "x {\"name\": \"get_w\", \"parameters\": {}}", {});
  expect_reply(f, "{\"name\": \"get_w\", \"param", "{\"name\": \"get_w\", \"param", {});
  // A good call, then one that is not: the rest is text.
  expect_reply(f, "{\"name\": \"get_w\", \"parameters\": {}}; {\"name\": \"zz\"}\nbye",
               " {\"name\": \"zz\"}\nbye", {call("get_w", "{}")});
  expect_reply(f, "{\"name\": \"get_w\", \"parameters\": {}}\nDone.", "Done.", {call("get_w", "{}")});
}

TEST(ToolParser, Mistral) {
  const auto f = ToolCallFormat::kMistral;
  expect_reply(f, "[TOOL_CALLS] [{\"name\": \"get_w\", \"arguments\": {\"c\": \"]\"}}, {\"name\": \"f-2\", \"arguments\": {}}]",
               "", {call("get_w", R"({"c": "]"})"), call("f-2", "{}")});
  expect_reply(f, "ok [TOOL_CALLS][{\"name\": \"f-2\", \"arguments\": {}}] then",
               "ok  then", {call("f-2", "{}")});
  // One unknown function in the array: the whole block is text.
  const std::string bad = "[TOOL_CALLS] [{\"name\": \"f-2\", \"arguments\": {}}, {\"name\": \"q\"}]";
  expect_reply(f, bad, bad, {}, false);
  expect_reply(f, "[TOOL_CALLS] not json", "[TOOL_CALLS] not json", {});
  expect_reply(f, "[TOOL_CALLS] [{\"name\": \"f-2\"", "[TOOL_CALLS] [{\"name\": \"f-2\"", {});
  expect_reply(f, "[TOOL_CALLS] []", "[TOOL_CALLS] []", {});
  expect_reply(f, "a [TOOL", "a [TOOL", {});
}

TEST(ToolParser, JsonArray) {  // tool_choice required / a named function
  const auto f = ToolCallFormat::kJsonArray;
  expect_reply(f, R"( [{"name": "get_w", "arguments": {"city":"Oslo"}}, {"arguments": {}, "name": "f-2"}] )",
               "", {call("get_w", R"({"city":"Oslo"})"), call("f-2", "{}")});
  // Cut short inside a call: text, though its first piece was streamed.
  expect_reply(f, R"([{"name": "get_w", "arguments": {"city")", R"([{"name": "get_w", "arguments": {"city")", {},
               false);
  ToolCallSplitter cut(f, parser_tools());
  const SplitPiece piece = cut.push(R"([{"name": "get_w", "arguments": {"ci)");
  EXPECT_EQ(piece.calls, (std::vector<ToolCallDelta>{{0, "get_w", R"({"ci)"}}));
  EXPECT_EQ(cut.push(R"(ty": "Os)").calls, (std::vector<ToolCallDelta>{{0, "", R"(ty": "Os)"}}));
  expect_reply(f, R"([{"name": "zz", "arguments": {}}])", R"([{"name": "zz", "arguments": {}}])", {});
  EXPECT_TRUE(tool_call_markers(f).empty());
}

/// A random reply of format `f` from pieces whose meaning is known: text (words, white space,
/// marker prefixes, braces), calls in the format's syntax, malformed calls; returns the reply and
/// sets the content and calls a parser must find.
std::string random_reply(ToolCallFormat f, std::mt19937& rng, std::string& content,
                         std::vector<ParsedToolCall>& calls) {
  auto pick = [&rng](const std::vector<std::string>& v) { return v[rng() % v.size()]; };
  const std::vector<std::string> words = {"hello", " ", "\n", "é", "日本", "<tool", "<|python",
                                          "[TOOL", "}", "]", "a b", ":", "\"q\"", "<tool_cal"};
  auto text = [&] {
    std::string t;
    for (int n = static_cast<int>(rng() % 4); n > 0; --n) t += pick(words);
    return t;
  };
  auto good = [&](const char* args_key) {  // name and arguments in either order
    const std::string name = pick({"get_w", "f-2"});
    nlohmann::json args = nlohmann::json::object();
    for (int n = static_cast<int>(rng() % 3); n > 0; --n)
      args["k" + std::to_string(rng() % 9)] = pick({"v", "}{", "x]\"y", "日"});
    const std::string text = args.dump(rng() % 2 ? 1 : -1);
    calls.push_back({name, text});
    const std::string n = "\"name\": " + nlohmann::json(name).dump();
    const std::string a = "\"" + std::string(args_key) + "\": " + text;
    return "{" + (rng() % 2 ? n + ", " + a : a + ", " + n) + "}";
  };
  const std::string bad_call = pick({R"({"name": "nope", "arguments": {}})",
                                     R"({"name": "get_w", "arguments": [1]})", R"({"name": 5})"});
  std::string reply;
  content.clear();
  calls.clear();
  if (f == ToolCallFormat::kLlama3) {  // [text <|python_tag|>] calls [; bad] [\n text]
    std::string prefix = rng() % 2 ? "" : "Sure" + text() + " ";
    const std::string tag = !prefix.empty() || rng() % 2 ? "<|python_tag|>" : "";
    if (tag.empty()) prefix = pick({"", " ", "\n "});
    reply = prefix + tag;
    content = prefix;
    for (int n = 1 + static_cast<int>(rng() % 3), i = 0; i < n; ++i)
      reply += (i ? "; " : "") + good(rng() % 2 ? "parameters" : "arguments");
    const bool bad = rng() % 3 == 0;  // then the rest is text, verbatim
    if (bad) {
      reply += "; " + bad_call;
      content += " " + bad_call;
    }
    if (rng() % 2) {  // text after the calls (the white space between is dropped)
      const std::string tail = "ok" + text();
      reply += "\n" + tail;
      content += (bad ? "\n" : "") + tail;
    }
  } else {
    const bool qwen = f == ToolCallFormat::kQwen25;
    for (int n = static_cast<int>(rng() % 5); n > 0; --n) {
      std::string piece;
      switch (rng() % 3) {
        case 0: piece = text(); content += piece; break;
        case 1:
          if (qwen) {
            piece = "<tool_call>\n" + good("arguments") + "\n</tool_call>";
          } else {
            piece = "[TOOL_CALLS] [" + good("arguments");
            for (int k = static_cast<int>(rng() % 2); k > 0; --k) piece += ", " + good("arguments");
            piece += "]";
          }
          break;
        default:
          piece = qwen ? "<tool_call>" + bad_call + "</tool_call>" : "[TOOL_CALLS] [" + bad_call + "]";
          content += piece;
      }
      reply += piece;
    }
    if (rng() % 4 == 0) {  // cut short
      const std::string cut = qwen ? "<tool_call>{\"name\": \"get_w\"" : "[TOOL_CALLS] [{\"na";
      reply += cut;
      content += cut;
    }
  }
  if (!calls.empty() &&
      content.find_first_not_of(" \n") == std::string::npos)  // white space only: no content
    content.clear();
  return reply;
}

TEST(ToolParser, RandomRepliesWholeAndStreamed) {
  const pagoda::testing::TestSeed seed;
  std::mt19937 rng(seed);
  for (auto f : {ToolCallFormat::kQwen25, ToolCallFormat::kLlama3, ToolCallFormat::kMistral}) {
    for (int i = 0; i < 300; ++i) {
      std::string content;
      std::vector<ParsedToolCall> calls;
      const std::string reply = random_reply(f, rng, content, calls);
      std::vector<size_t> cuts;
      for (int k = 0; k < 4; ++k) cuts.push_back(1 + rng() % 9);
      for (const ParsedReply& r : {parse(f, reply), split_in(f, reply, cuts)}) {
        ASSERT_EQ(r.content, content) << "format " << static_cast<int>(f)
                                      << " reply " << reply;
        ASSERT_EQ(r.calls, calls) << "reply " << reply;
      }
    }
  }
}

}  // namespace
}  // namespace pagoda::server
