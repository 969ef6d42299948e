// libFuzzer target for the server's untrusted inputs: the first byte picks the OpenAI request
// parser (completions or chat body), the chat-template renderer (the rest is a template,
// rendered over a fixed conversation) or a tool-call parser (the rest is a model's reply).
// Each must return or throw its documented error (ApiError / TemplateError) — never crash, hang
// or leak; parsed requests must satisfy the validated ranges; a reply streamed in two pieces
// splits as the whole does.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/server/api_request.h"
#include "pagoda/server/chat_template.h"
#include "pagoda/server/tool_parser.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

void fuzz_request(std::string_view body, pagoda::server::Endpoint ep) {
  using namespace pagoda::server;
  try {
    const ApiRequest r = parse_api_request(body, ep);
    check(!r.max_tokens || *r.max_tokens >= 1);
    check(r.temperature >= 0.f && r.temperature <= 2.f);
    check(r.top_p > 0.f && r.top_p <= 1.f);
    check(r.top_k >= -1);
    check(r.min_p >= 0.f && r.min_p < 1.f);
    check(r.presence_penalty >= -2.f && r.presence_penalty <= 2.f);
    check(r.frequency_penalty >= -2.f && r.frequency_penalty <= 2.f);
    check(r.repetition_penalty > 0.f && r.repetition_penalty <= 2.f);
    for (const auto& [id, bias] : r.logit_bias) check(id >= 0 && bias >= -100.f && bias <= 100.f);
    check(r.logprobs >= -1 && r.logprobs <= kMaxTopLogprobs);
    check(r.logprobs < 0 || !r.echo);
    check(r.stop.size() <= 4);
    for (const auto& s : r.stop) check(!s.empty());
    if (ep == Endpoint::kChat) check(!r.messages.empty());
    else check(!r.prompts.empty());
    for (const PromptInput& p : r.prompts) check(p.text.has_value() || !p.ids.empty());
    check(r.n >= 1 && static_cast<int64_t>(std::max<size_t>(r.prompts.size(), 1)) * r.n <=
                          kMaxChoices);
    // The stop matcher on the parsed stops never emits a stop string.
    StopMatcher m(r.stop);
    std::string out = m.push(body.substr(0, body.size() / 2));
    out += m.push(body.substr(body.size() / 2));
    if (!m.stopped()) out += m.finish();
    for (const auto& s : r.stop) check(out.find(s) == std::string::npos);
  } catch (const ApiError& e) {
    check(e.status == 400 && !e.param.empty());
  }
}

void fuzz_template(std::string_view source) {
  using namespace pagoda::server;
  static const nlohmann::ordered_json ctx = {
      {"messages", nlohmann::ordered_json::array(
                       {{{"role", "system"}, {"content", " sys "}},
                        {{"role", "user"}, {"content", "hi é"}},
                        {{"role", "assistant"}, {"content", "yo"}}})},
      {"bos_token", "<s>"},
      {"eos_token", "</s>"},
      {"add_generation_prompt", true}};
  try {
    const ChatTemplate t(source);
    const std::string out = t.render(ctx);
    check(out.size() <= (2u << 20));
  } catch (const TemplateError&) {
  }
}

void fuzz_tool_reply(std::string_view reply, uint8_t pick) {
  using namespace pagoda::server;
  static const std::vector<ToolSpec> tools = {{.name = "get_w"}, {.name = "f"}};
  const auto f = static_cast<ToolCallFormat>(pick % 4);
  const ParsedReply whole = parse_tool_calls(f, reply, tools);
  ToolCallSplitter s(f, tools);
  std::string content;
  size_t streamed = 0;  // calls named by the deltas so far: each first delta names the next
  auto take = [&](const SplitPiece& p) {
    content += p.content;
    for (const ToolCallDelta& d : p.calls) {
      check(d.index <= streamed && d.name.empty() == (d.index < streamed));
      if (d.index == streamed) ++streamed;
    }
  };
  take(s.push(reply.substr(0, pick % (reply.size() + 1))));
  take(s.push(reply.substr(pick % (reply.size() + 1))));
  const ToolCallSplitter::End end = s.finish();
  take(end.rest);
  check(content == whole.content && end.calls == whole.calls);
  for (const ParsedToolCall& c : whole.calls)
    check(nlohmann::json::parse(c.arguments, nullptr, false).is_object());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0: fuzz_request(rest, pagoda::server::Endpoint::kCompletions); break;
    case 1: fuzz_request(rest, pagoda::server::Endpoint::kChat); break;
    case 2: fuzz_template(rest); break;
    default: fuzz_tool_reply(rest, static_cast<uint8_t>(data[0] / 4)); break;
  }
  return 0;
}
