// POST /v1/completions and /v1/chat/completions: request → prompt ids → one engine request per
// choice (prompts × n) → EngineLoop → JSON or server-sent events.
#include <httplib.h>

#include <algorithm>
#include <ctime>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/server/http_server.h"
#include "pagoda/server/pd.h"
#include "pagoda/server/server_state.h"
#include "pagoda/server/tool_calls.h"
#include "pagoda/tokenizer/incremental_detokenizer.h"

namespace pagoda::server {

using nlohmann::json;

namespace {

/// How often a non-streamed request checks that its client is still connected.
constexpr int kDisconnectPollMs = 100;
/// The status recorded (in /metrics) for a request whose client left before its answer (as
/// nginx's 499); nothing reaches the client.
constexpr int kClientClosedRequest = 499;
/// How long a streamed request waits for its first unfinished choice before looking at the others.
constexpr int kStreamWaitMs = 200;
constexpr int kMultiChoiceWaitMs = 20;
/// A reply without tool-call markers to restore.
const std::vector<std::pair<int32_t, std::string>> kNoMarkers;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

/// Detokenizes and stop-matches one choice's tokens (the HTTP thread's side). Stop strings are
/// matched on the text the client receives (client_text: invalid UTF-8 already U+FFFD); the
/// detokenizer emits pieces that end on a complete sequence, so converting piece by piece gives
/// the same text as converting the whole. A token of `stop_ids` ends the choice; its text is
/// not sent, it is counted. A special token of `markers` (a tool-call parser's marker, which
/// detokenizing skips) is written as its text.
struct TextState {
  using Markers = std::vector<std::pair<int32_t, std::string>>;
  tokenizer::IncrementalDetokenizer detok;
  StopMatcher stop;
  const std::vector<int32_t>& stop_ids;
  const Markers& markers;
  bool stopped_by_token = false;
  int64_t completion_tokens = 0;
  TextState(const tokenizer::Tokenizer& tok, const std::vector<int32_t>& prompt,
            std::vector<std::string> stops, const std::vector<int32_t>& stop_token_ids,
            const Markers& marker_tokens)
      : detok(tok, true, prompt),
        stop(std::move(stops)),
        stop_ids(stop_token_ids),
        markers(marker_tokens) {}
  bool stopped() const { return stop.stopped() || stopped_by_token; }
  /// Text of new tokens (stop strings cut). Tokens after a stop are not counted.
  std::string push(const std::vector<int32_t>& tokens) {
    std::string out;
    for (int32_t t : tokens) {
      if (stopped()) break;
      ++completion_tokens;
      if (std::find(stop_ids.begin(), stop_ids.end(), t) != stop_ids.end()) {
        out += flush();  // the text before the stop token, held-back bytes included
        stopped_by_token = !stop.stopped();
        break;
      }
      std::string piece = detok.push(t);
      for (const auto& [id, text] : markers)
        if (id == t) piece += detok.finish() + text;  // the text before it, then the marker
      out += stop.push(client_text(piece));
    }
    return out;
  }
  std::string finish() { return stopped() ? std::string() : flush(); }

 private:
  /// Everything the detokenizer and the stop matcher still hold (stop strings cut).
  std::string flush() {
    std::string out = stop.push(client_text(detok.finish()));
    if (!stop.stopped()) out += stop.finish();
    return out;
  }
};

const char* finish_name(engine::FinishReason r, bool stopped) {
  if (stopped) return "stop";
  switch (r) {
    case engine::FinishReason::kStop: return "stop";
    case engine::FinishReason::kLength:
    case engine::FinishReason::kContext: return "length";
    case engine::FinishReason::kAbort: return "abort";
    default: return "error";
  }
}

json usage_json(int64_t prompt, int64_t completion) {
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion}};
}

/// One token as chat's logprobs list it: {token (the text the client receives), logprob, bytes}.
json token_entry(const tokenizer::Tokenizer& tok, int32_t id, float logprob) {
  const std::string raw = tok.decode(std::span<const int32_t>(&id, 1), false);
  json bytes = json::array();
  for (unsigned char b : raw) bytes.push_back(b);
  return {{"token", client_text(raw)}, {"logprob", logprob}, {"bytes", std::move(bytes)}};
}

/// OpenAI's `logprobs` of a choice from chat-shaped entries ({token, logprob, bytes,
/// top_logprobs: [{token, logprob, bytes}]}): chat {"content": entries}; completions {tokens,
/// token_logprobs, top_logprobs (token → logprob), text_offset} with offsets in code points
/// from `chars` (advanced past these tokens).
json logprobs_json(bool chat, const json& entries, int64_t& chars) {
  if (chat) return {{"content", entries}};
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const json& e : entries) {
    const std::string& t = e["token"].get_ref<const std::string&>();
    tokens.push_back(t);
    lps.push_back(e["logprob"]);
    json top = json::object();
    for (const json& a : e["top_logprobs"]) top[a["token"].get<std::string>()] = a["logprob"];
    tops.push_back(std::move(top));
    offsets.push_back(chars);
    chars += std::count_if(t.begin(), t.end(), [](char ch) { return (ch & 0xC0) != 0x80; });
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(lps)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

/// One choice: an engine request and the text sent for it so far.
struct Choice {
  int index = 0;
  std::shared_ptr<RequestStream> stream;
  std::unique_ptr<TextState> text;
  int64_t prompt_len = 0;
  std::string echo;  ///< the prompt's text when `echo` (sent before the completion)
  bool finished = false;
  const char* finish = nullptr;
  std::string out;   ///< non-streamed: the whole text
  bool logprobs = false;
  json lp = json::array();  ///< logprobs entries not yet sent (streamed) / all (non-streamed)
  int64_t lp_chars = 0;     ///< completions: code points of the tokens already sent
  std::unique_ptr<ToolCallSplitter> splitter;  ///< streamed tool_choice auto: text vs calls
};

/// Whatever a request's choices share.
struct Job {
  ServerState* server = nullptr;
  ApiRequest request;
  std::vector<Choice> choices;
  std::string id;
  int64_t created = 0;
  bool started = false;
  bool done = false;
  uint64_t room = 0;        ///< disaggregation, decode role: the router's room id
  std::string prefill_url;  ///< and the prefill server it picked

  bool chat() const { return request.endpoint == Endpoint::kChat; }
  void cancel_all() {
    for (Choice& c : choices)
      if (!c.finished) server->loop->cancel(c.stream);
  }
  /// Usage over every choice; the prompt once per prompt (as OpenAI counts it).
  json usage() const {
    int64_t prompt = 0, completion = 0;
    for (const Choice& c : choices) {
      if (c.index % request.n == 0) prompt += c.prompt_len;
      completion += c.text->completion_tokens;
    }
    return usage_json(prompt, completion);
  }
  /// `lp`: the choice's unsent logprobs entries to send with this chunk (taken), or nullptr.
  json chunk(int index, const std::string& content, const char* finish, Choice* lp = nullptr) const {
    json choice = {{"index", index}, {"finish_reason", finish ? json(finish) : json(nullptr)}};
    if (chat()) {
      choice["delta"] = finish && content.empty() ? json::object() : json{{"content", content}};
    } else {
      choice["text"] = content;
    }
    if (lp != nullptr) {
      choice["logprobs"] = logprobs_json(chat(), lp->lp, lp->lp_chars);
      lp->lp = json::array();
    } else if (!chat()) {
      choice["logprobs"] = nullptr;
    }
    return {{"id", id},
            {"object", chat() ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", server->model_name},
            {"choices", json::array({choice})}};
  }
  /// Reads `c`'s new tokens (waiting at most `wait_ms`); returns their text and sets c.finished /
  /// c.finish when it ended. Throws ApiError when the engine failed the request.
  std::string advance(Choice& c, int wait_ms) {
    RequestStream::Update u = c.stream->wait(wait_ms);
    const int64_t counted = c.text->completion_tokens;
    std::string text = c.text->push(u.tokens);
    if (c.logprobs) {  // the counted tokens (up to a stop) get entries
      const tokenizer::Tokenizer& tok = *server->tokenizer;
      const auto n = std::min<size_t>(static_cast<size_t>(c.text->completion_tokens - counted),
                                      u.logprobs.size());
      for (size_t i = 0; i < n; ++i) {
        json e = token_entry(tok, u.tokens[i], u.logprobs[i].logprob);
        e["top_logprobs"] = json::array();
        for (const auto& [id, lp] : u.logprobs[i].top)
          e["top_logprobs"].push_back(token_entry(tok, id, lp));
        c.lp.push_back(std::move(e));
      }
    }
    if (c.text->stopped()) server->loop->cancel(c.stream);
    if (!c.text->stopped() && u.finished && u.reason == engine::FinishReason::kError)
      throw ApiError(u.error_status ? u.error_status : 500,
                     u.error_status && u.error_status < 500 ? "invalid_request_error"
                                                            : "server_error",
                     u.error);
    if (c.text->stopped() || u.finished) {
      text += c.text->finish();
      c.finished = true;
      c.finish = finish_name(u.reason, c.text->stopped());
    }
    return text;
  }
  /// The id of a choice's k-th tool call.
  std::string call_id(const Choice& c, size_t k) const {
    return "call_" + id + "_" + std::to_string(c.index) + "_" + std::to_string(k);
  }
  /// How a chat reply is read for tool calls: json_array for a required call, the server's
  /// --tool-call-parser format for "auto", none for plain text.
  std::optional<ToolCallFormat> tool_format() const {
    if (request.tool_call.has_value()) return ToolCallFormat::kJsonArray;
    return request.tool_auto ? server->tool_format : std::nullopt;
  }
  /// Calls parsed from a reply as OpenAI's tool_calls; a reply that ended normally then
  /// finishes with "tool_calls".
  json tool_calls_json(Choice& c, const std::vector<ParsedToolCall>& calls) const {
    json out = json::array();
    for (size_t k = 0; k < calls.size(); ++k)
      out.push_back({{"id", call_id(c, k)},
                     {"type", "function"},
                     {"function", {{"name", calls[k].name}, {"arguments", calls[k].arguments}}}});
    if (!calls.empty() && std::string_view(c.finish) == "stop") c.finish = "tool_calls";
    return out;
  }
  /// Streamed call pieces as OpenAI's delta.tool_calls: a call's first piece has its index, id,
  /// type and name, later ones its index and more argument text.
  json call_deltas_json(const Choice& c, const std::vector<ToolCallDelta>& pieces) const {
    json out = json::array();
    for (const ToolCallDelta& d : pieces) {
      json e = {{"index", d.index}, {"function", {{"arguments", d.arguments}}}};
      if (!d.name.empty()) {
        e["id"] = call_id(c, d.index);
        e["type"] = "function";
        e["function"]["name"] = d.name;
      }
      out.push_back(std::move(e));
    }
    return out;
  }
  bool all_finished() const {
    return std::all_of(choices.begin(), choices.end(), [](const Choice& c) { return c.finished; });
  }
};

bool send_event(httplib::DataSink& sink, const std::string& data) {
  const std::string ev = "data: " + data + "\n\n";
  return sink.write(ev.data(), ev.size());
}

/// The content provider of a streamed request: one call waits for tokens and writes them.
bool stream_step(Job& job, httplib::DataSink& sink) {
  if (job.done) return false;
  if (!job.started) {
    job.started = true;
    for (const Choice& c : job.choices) {
      if (job.chat()) {
        json first = job.chunk(c.index, "", nullptr);
        first["choices"][0]["delta"] = {{"role", "assistant"}, {"content", ""}};
        if (!send_event(sink, dump(first))) return false;
      } else if (!c.echo.empty() && !send_event(sink, dump(job.chunk(c.index, c.echo, nullptr)))) {
        return false;
      }
    }
  }
  bool waited = false;
  for (Choice& c : job.choices) {
    if (c.finished) continue;
    std::string text;
    try {
      text = job.advance(c, waited ? 0 : job.choices.size() == 1 ? kStreamWaitMs
                                                                  : kMultiChoiceWaitMs);
    } catch (const ApiError& e) {
      job.cancel_all();
      send_event(sink, e.to_json());
      send_event(sink, "[DONE]");
      job.done = true;
      sink.done();
      return true;
    }
    waited = true;
    json calls = json::array();  // pieces of tool calls, as they are written
    if (c.splitter) {  // text until a call's marker, then the calls
      SplitPiece piece = c.splitter->push(text);
      text = std::move(piece.content);
      if (c.finished) {
        ToolCallSplitter::End end = c.splitter->finish();
        text += end.rest.content;
        piece.calls.insert(piece.calls.end(), end.rest.calls.begin(), end.rest.calls.end());
        if (!end.calls.empty() && std::string_view(c.finish) == "stop") c.finish = "tool_calls";
      }
      calls = job.call_deltas_json(c, piece.calls);
    }
    Choice* lp = c.logprobs && !c.lp.empty() ? &c : nullptr;
    if ((!text.empty() || lp) && !send_event(sink, dump(job.chunk(c.index, text, nullptr, lp))))
      return false;
    if (!calls.empty()) {
      json ev = job.chunk(c.index, "", nullptr);
      ev["choices"][0]["delta"] = {{"tool_calls", std::move(calls)}};
      if (!send_event(sink, dump(ev))) return false;
    }
    if (c.finished && !send_event(sink, dump(job.chunk(c.index, "", c.finish)))) return false;
  }
  if (!job.all_finished()) return true;
  if (job.request.include_usage) {
    json last = job.chunk(0, "", nullptr);
    last["choices"] = json::array();
    last["usage"] = job.usage();
    if (!send_event(sink, dump(last))) return false;
  }
  if (!send_event(sink, "[DONE]")) return false;
  job.done = true;
  sink.done();
  return true;
}

/// Waits for every choice of a non-streamed request; false when its client left (all cancelled).
bool collect(Job& job) {
  try {
    for (Choice& c : job.choices) {
      while (!c.finished) {
        c.out += job.advance(c, kDisconnectPollMs);
        if (!c.finished && HttpServer::client_gone()) {  // nobody will read the answer
          job.cancel_all();
          return false;
        }
      }
    }
  } catch (const ApiError&) {
    job.cancel_all();
    throw;
  }
  return true;
}

json response_json(Job& job) {
  json choices = json::array();
  for (Choice& c : job.choices) {
    json choice = {{"index", c.index}, {"finish_reason", c.finish}};
    if (const std::optional<ToolCallFormat> f = job.tool_format()) {
      const ParsedReply reply = parse_tool_calls(*f, c.out, job.request.tools);
      choice["message"] = {{"role", "assistant"}, {"content", reply.content}};
      if (!reply.calls.empty()) {
        if (reply.content.empty()) choice["message"]["content"] = nullptr;
        choice["message"]["tool_calls"] = job.tool_calls_json(c, reply.calls);
        choice["finish_reason"] = c.finish;
      }
    } else if (job.chat()) {
      choice["message"] = {{"role", "assistant"}, {"content", c.out}};
    } else {
      choice["text"] = c.echo + c.out;
    }
    int64_t chars = 0;
    choice["logprobs"] = c.logprobs ? logprobs_json(job.chat(), c.lp, chars) : json(nullptr);
    choices.push_back(std::move(choice));
  }
  return {{"id", job.id},
          {"object", job.chat() ? "chat.completion" : "text_completion"},
          {"created", job.created},
          {"model", job.server->model_name},
          {"choices", std::move(choices)},
          {"usage", job.usage()}};
}

/// A decode server of a disaggregated pair takes one choice without logprobs or logit
/// processing (the prefill server samples the first token with the sampling parameters only).
void check_disaggregated(const ApiRequest& r, int64_t choices) {
  if (choices != 1) throw_invalid(r.n != 1 ? "n" : "prompt", "a disaggregated server runs one "
                                                            "choice per request (n 1, one prompt)");
  if (r.logprobs >= 0) throw_invalid("logprobs", "not supported by a disaggregated server yet");
  if (r.presence_penalty != 0.f || r.frequency_penalty != 0.f || r.repetition_penalty != 1.f)
    throw_invalid("presence_penalty", "penalties are not supported by a disaggregated server yet");
  if (!r.logit_bias.empty())
    throw_invalid("logit_bias", "not supported by a disaggregated server yet");
  if (r.response_format.type != ResponseFormat::Type::kText)
    throw_invalid("response_format", "not supported by a disaggregated server yet");
  if (r.tool_call.has_value() || r.tool_auto)
    throw_invalid("tool_choice", "grammar-constrained tool calls are not supported by a "
                                 "disaggregated server yet (give \"none\")");
}

/// Structured output and tool calls: a fresh constraint for one choice (null for plain text).
/// 400 naming the field when llguidance is not loaded or cannot compile the schema.
std::shared_ptr<engine::TokenConstraint> response_constraint(const ServerState& s,
                                                             const ApiRequest& r) {
  if (r.tool_call.has_value() || r.tool_auto) {  // required / named: JSON; auto: a lazy grammar
    if (s.grammar == nullptr)
      throw_invalid("tool_choice", "tool calls (required, a function, or \"auto\", the default "
                                   "with tools) need llguidance (grammar-constrained decoding), "
                                   "which this server could not load: " + s.grammar_missing);
    try {
      return r.tool_auto ? s.grammar->matcher(grammar::GrammarKind::kLark,
                                              auto_tool_grammar(*s.tool_format, r,
                                                                s.tool_marker_ids))
                         : s.grammar->matcher(grammar::GrammarKind::kJsonSchema,
                                              tool_call_schema(r));
    } catch (const Error& e) {
      throw_invalid("tools", "a function's parameters are not a JSON schema llguidance can "
                             "compile: " + e.message());
    }
  }
  if (r.response_format.type == ResponseFormat::Type::kText) return nullptr;
  if (s.grammar == nullptr)
    throw_invalid("response_format", "needs llguidance (grammar-constrained decoding), which "
                                     "this server could not load: " + s.grammar_missing);
  const bool object = r.response_format.type == ResponseFormat::Type::kJsonObject;
  try {
    return s.grammar->matcher(
        object ? grammar::GrammarKind::kJsonObject : grammar::GrammarKind::kJsonSchema,
        r.response_format.schema);
  } catch (const Error& e) {
    throw_invalid("response_format.json_schema.schema",
                  "is not a JSON schema llguidance can compile: " + e.message());
  }
}

/// The router's stamp on a request for a decode server (pd.h); 400 when it is missing.
void read_room(const httplib::Request& req, Job& job) {
  const std::string room = req.get_header_value(kRoomHeader);
  job.prefill_url = req.get_header_value(kPrefillHeader);
  if (room.empty() || job.prefill_url.empty())
    throw ApiError(400, "invalid_request_error",
                   std::string("this server runs --disaggregation-mode decode: send requests "
                               "through `pagoda router` (headers ") +
                       kRoomHeader + ", " + kPrefillHeader + ")");
  size_t used = 0;
  try {
    job.room = std::stoull(room, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != room.size() || room[0] == '-')
    throw ApiError(400, "invalid_request_error", std::string(kRoomHeader) + " must be an integer");
}

/// Builds and submits one engine request per choice (prompts × n, choice index = prompt × n +
/// copy). Each copy reuses what of its prompt the prefix cache holds at admission.
void submit_choices(ServerState& s, Job& job) {
  const ApiRequest& r = job.request;
  if (r.tool_auto && !s.tool_format)
    throw_invalid("tool_choice",
                  fmt::format("\"auto\" (the default with tools) needs the server started with "
                              "--tool-call-parser NAME (the model's tool-call syntax: {}); or "
                              "give \"required\", a function, or \"none\"",
                              fmt::join(tool_call_format_names(), ", ")));
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> echoes;
  if (r.endpoint == Endpoint::kChat) {
    prompts.push_back(encode_chat(s, r.messages, r.add_generation_prompt, r.tools));
    check_prompt_length(s, prompts.back(), "messages");
    echoes.emplace_back();
  } else {
    for (size_t i = 0; i < r.prompts.size(); ++i) {
      const std::string field =
          r.prompts.size() == 1 ? std::string("prompt") : "prompt[" + std::to_string(i) + "]";
      prompts.push_back(encode_prompt(s, r.prompts[i], field, true));
      check_prompt_length(s, prompts.back(), field);
      echoes.push_back(!r.echo                ? std::string()
                       : r.prompts[i].text    ? client_text(*r.prompts[i].text)
                                              : client_text(s.tokenizer->decode(prompts.back(), true)));
    }
  }
  auto check_vocab = [&s](const char* field, int32_t id) {
    if (id >= s.vocab_size)
      throw_invalid(field, "token id " + std::to_string(id) + " is outside the vocabulary (" +
                               std::to_string(s.vocab_size) + ")");
  };
  for (int32_t id : r.stop_token_ids) check_vocab("stop_token_ids", id);
  for (const auto& [id, bias] : r.logit_bias) check_vocab("logit_bias", id);
  const auto total = static_cast<int64_t>(prompts.size()) * r.n;
  if (s.pd_decode != nullptr) check_disaggregated(r, total);
  if (total > s.max_inflight)
    throw_invalid("n", "prompts × n = " + std::to_string(total) +
                           " is more than this server runs and queues (" +
                           std::to_string(s.max_inflight) + ")");
  std::shared_ptr<engine::TokenConstraint> first_constraint = response_constraint(s, r);
  // A whole answer that no stop string or stop token can end early needs its tokens only at the
  // end: its HTTP thread is not woken per step (engine_loop.h StreamWake).
  const StreamWake wake = !r.stream && r.stop.empty() && r.stop_token_ids.empty()
                              ? StreamWake::kFinish
                              : StreamWake::kEachToken;
  const uint64_t serial = s.next_id.fetch_add(1);
  job.id = (job.chat() ? "chatcmpl-" : "cmpl-") + std::to_string(serial);
  job.created = static_cast<int64_t>(std::time(nullptr));
  job.choices.resize(static_cast<size_t>(total));
  for (size_t p = 0; p < prompts.size(); ++p) {
    const auto prompt_len = static_cast<int32_t>(prompts[p].size());
    const int32_t room = s.max_context_len - prompt_len;
    const int32_t max_tokens = std::min(r.max_tokens.value_or(job.chat() ? room : 16), room);
    for (int32_t k = 0; k < r.n; ++k) {
      Choice& c = job.choices[p * static_cast<size_t>(r.n) + static_cast<size_t>(k)];
      c.index = static_cast<int>(p) * r.n + k;
      c.prompt_len = prompt_len;
      c.echo = echoes[p];
      c.logprobs = r.logprobs >= 0;
      c.text = std::make_unique<TextState>(*s.tokenizer, prompts[p], r.stop,
                                           job.request.stop_token_ids,
                                           r.tool_auto ? s.tool_marker_ids : kNoMarkers);
      if (r.stream && job.tool_format())
        c.splitter = std::make_unique<ToolCallSplitter>(*job.tool_format(), job.request.tools);
      engine::GenerateRequest g;
      g.prompt = prompts[p];
      g.max_new_tokens = max_tokens;
      g.sampling.temperature = r.temperature;
      g.sampling.top_k = r.top_k < 0 ? 0 : r.top_k;
      g.sampling.top_p = r.top_p;
      g.sampling.min_p = r.min_p;
      const uint64_t base = r.has_seed ? r.seed : s.seed_base + serial * 0x9E3779B97F4A7C15ull;
      g.sampling.seed = base + static_cast<uint64_t>(c.index);  // distinct samples per choice
      g.ignore_eos = r.ignore_eos;
      g.logprobs = r.logprobs;
      g.logit_processing = {.presence_penalty = r.presence_penalty,
                            .frequency_penalty = r.frequency_penalty,
                            .repetition_penalty = r.repetition_penalty,
                            .logit_bias = r.logit_bias};
      g.constraint = c.index == 0 ? std::move(first_constraint) : response_constraint(s, r);
      try {
        c.stream = s.pd_decode != nullptr
                       ? pd_decode_room(*s.pd_decode, std::move(g), job.room, job.prefill_url)
                       : s.loop->submit(std::move(g), wake);
      } catch (const ApiError&) {  // the queue filled up part-way: nothing of this request runs
        job.choices.resize(static_cast<size_t>(c.index));
        job.cancel_all();
        throw;
      }
    }
  }
}

}  // namespace

void handle_generate(ServerState& s, Endpoint endpoint, const httplib::Request& req,
                     httplib::Response& res) {
  try {
    check_api_request(s, req);
    auto job = std::make_shared<Job>();
    job->server = &s;
    job->request = parse_api_request(req.body, endpoint);
    check_model(s, job->request.model);
    if (s.pd_decode != nullptr) read_room(req, *job);
    submit_choices(s, *job);
    if (job->request.stream) {
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [job](size_t, httplib::DataSink& sink) { return stream_step(*job, sink); },
          [job](bool) {
            if (!job->done) job->cancel_all();  // the client went away
          });
    } else if (collect(*job)) {
      res.set_content(dump(response_json(*job)), "application/json");
    } else {
      res.status = kClientClosedRequest;
    }
  } catch (const ApiError& e) {
    set_error(res, e);
  }
  release_request_memory(req);
}

}  // namespace pagoda::server
