// POST /v1/completions and /v1/chat/completions: request → prompt ids → EngineLoop → JSON or
// server-sent events.
#include <httplib.h>
#include <malloc.h>

#include <algorithm>
#include <cctype>
#include <ctime>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/server/http_server.h"
#include "pagoda/server/server_state.h"
#include "pagoda/tokenizer/incremental_detokenizer.h"

namespace pagoda::server {

using nlohmann::json;

void set_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(e.to_json(), "application/json");
}

bool authorized(const ServerState& s, const httplib::Request& req) {
  if (s.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return true;
  return req.get_header_value("Authorization") == "Bearer " + s.api_key;
}

ApiError unauthorized() {
  return ApiError(401, "authentication_error",
                  "missing or wrong API key (send 'Authorization: Bearer <key>')");
}

int64_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * 4096;
}

namespace {

/// Requests with a body at least this large return freed heap pages to the system afterwards.
constexpr size_t kTrimAfterBodyBytes = size_t{1} << 20;
/// How often a non-streamed request checks that its client is still connected.
constexpr int kDisconnectPollMs = 100;
/// The status recorded (in /metrics) for a request whose client left before its answer (as
/// nginx's 499); nothing reaches the client.
constexpr int kClientClosedRequest = 499;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

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

/// The prompt ids of a validated request (400 / 413 on a bad or too long prompt).
std::vector<int32_t> prompt_ids(const ServerState& s, const ApiRequest& r) {
  std::vector<int32_t> ids;
  try {
    if (r.endpoint == Endpoint::kChat) {
      if (!s.chat_template)
        throw ApiError(400, "invalid_request_error",
                       "this model has no chat template (start the server with --chat-template)",
                       "messages");
      using ojson = nlohmann::ordered_json;
      ojson messages = ojson::array();
      for (const ChatMessage& m : r.messages)
        messages.push_back({{"role", m.role}, {"content", m.content}});
      const ojson ctx = {{"messages", messages},
                        {"bos_token", s.bos_token},
                        {"eos_token", s.eos_token},
                        {"add_generation_prompt", r.add_generation_prompt}};
      std::string text;
      try {
        text = s.chat_template->render(ctx);
      } catch (const TemplateError& e) {
        throw_invalid("messages", std::string("chat template: ") + e.what());
      }
      ids = s.tokenizer->encode(text, s.chat_add_special);
    } else if (r.prompt) {
      ids = s.tokenizer->encode(*r.prompt, true);
    } else {
      ids = r.prompt_ids;
      for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i] >= s.vocab_size)
          throw_invalid("prompt", "token id " + std::to_string(ids[i]) + " at index " +
                                      std::to_string(i) + " is outside the vocabulary (" +
                                      std::to_string(s.vocab_size) + ")");
    }
  } catch (const Error& e) {  // the tokenizer refused the text (e.g. invalid UTF-8)
    throw_invalid(r.endpoint == Endpoint::kChat ? "messages" : "prompt", e.what());
  }
  if (ids.empty()) throw_invalid("prompt", "the prompt has no tokens");
  const auto n = static_cast<int64_t>(ids.size());
  if (n >= s.max_context_len || n > s.pool_tokens)
    throw ApiError(413, "context_length_exceeded",
                   "the prompt has " + std::to_string(n) + " tokens; this model's context is " +
                       std::to_string(s.max_context_len) +
                       " tokens and one must be left for the output",
                   r.endpoint == Endpoint::kChat ? "messages" : "prompt");
  return ids;
}

/// Detokenizes and stop-matches one request's tokens (the HTTP thread's side). Stop strings are
/// matched on the text the client receives (client_text: invalid UTF-8 already U+FFFD); the
/// detokenizer emits pieces that end on a complete sequence, so converting piece by piece gives
/// the same text as converting the whole.
struct TextState {
  tokenizer::IncrementalDetokenizer detok;
  StopMatcher stop;
  int64_t completion_tokens = 0;
  TextState(const tokenizer::Tokenizer& tok, const std::vector<int32_t>& prompt,
            std::vector<std::string> stops)
      : detok(tok, true, prompt), stop(std::move(stops)) {}
  /// Text of new tokens (stop strings cut). Tokens after a stop string are not counted.
  std::string push(const std::vector<int32_t>& tokens) {
    std::string out;
    for (int32_t t : tokens) {
      if (stop.stopped()) break;
      ++completion_tokens;
      out += stop.push(client_text(detok.push(t)));
    }
    return out;
  }
  std::string finish() {
    if (stop.stopped()) return {};
    std::string out = stop.push(client_text(detok.finish()));
    if (!stop.stopped()) out += stop.finish();
    return out;
  }
};

/// 415 unless the body is declared `application/json` (parameters such as charset allowed).
void check_json_content_type(const httplib::Request& req) {
  std::string type = req.get_header_value("Content-Type");
  type = type.substr(0, type.find(';'));
  while (!type.empty() && type.back() == ' ') type.pop_back();
  std::transform(type.begin(), type.end(), type.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (type != "application/json")
    throw ApiError(415, "invalid_request_error",
                   "Content-Type must be application/json (got '" +
                       req.get_header_value("Content-Type") + "')",
                   "Content-Type");
}

json usage_json(int64_t prompt, int64_t completion) {
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion}};
}

/// One streamed request: the state the chunked content provider keeps between calls.
struct StreamJob {
  ServerState* server = nullptr;
  ApiRequest request;
  std::shared_ptr<RequestStream> stream;
  std::unique_ptr<TextState> text;
  std::string id;
  int64_t created = 0;
  int64_t prompt_len = 0;
  bool started = false;
  bool done = false;

  json chunk(const std::string& content, const char* finish) const {
    json choice = {{"index", 0}, {"finish_reason", finish ? json(finish) : json(nullptr)}};
    const bool chat = request.endpoint == Endpoint::kChat;
    if (chat) {
      choice["delta"] = finish && content.empty() ? json::object() : json{{"content", content}};
    } else {
      choice["text"] = content;
      choice["logprobs"] = nullptr;
    }
    return {{"id", id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", server->model_name},
            {"choices", json::array({choice})}};
  }
};

bool send_event(httplib::DataSink& sink, const std::string& data) {
  const std::string ev = "data: " + data + "\n\n";
  return sink.write(ev.data(), ev.size());
}

/// The content provider of a streamed request: one call waits for tokens and writes them.
bool stream_step(StreamJob& job, httplib::DataSink& sink) {
  if (job.done) return false;
  if (!job.started) {
    job.started = true;
    if (job.request.endpoint == Endpoint::kChat) {
      json first = job.chunk("", nullptr);
      first["choices"][0]["delta"] = {{"role", "assistant"}, {"content", ""}};
      if (!send_event(sink, dump(first))) return false;
    }
  }
  RequestStream::Update u = job.stream->wait(200);
  std::string text = job.text->push(u.tokens);
  const bool stopped = job.text->stop.stopped();
  if (stopped) job.server->loop->cancel(job.stream);
  const bool finished = stopped || u.finished;
  if (finished && u.reason == engine::FinishReason::kError && !stopped) {
    const ApiError e(u.error_status ? u.error_status : 500,
                     u.error_status && u.error_status < 500 ? "invalid_request_error" : "server_error",
                     u.error);
    send_event(sink, e.to_json());
    send_event(sink, "[DONE]");
    job.done = true;
    sink.done();
    return true;
  }
  if (finished) text += job.text->finish();
  if (!text.empty() && !send_event(sink, dump(job.chunk(text, nullptr)))) return false;
  if (!finished) return true;
  if (!send_event(sink, dump(job.chunk("", finish_name(u.reason, stopped))))) return false;
  if (job.request.include_usage) {
    json last = job.chunk("", nullptr);
    last["choices"] = json::array();
    last["usage"] = usage_json(job.prompt_len, job.text->completion_tokens);
    if (!send_event(sink, dump(last))) return false;
  }
  if (!send_event(sink, "[DONE]")) return false;
  job.done = true;
  sink.done();
  return true;
}

}  // namespace

void handle_generate(ServerState& s, Endpoint endpoint, const httplib::Request& req,
                     httplib::Response& res) {
  try {
    if (!authorized(s, req)) throw unauthorized();
    check_json_content_type(req);
    ApiRequest r = parse_api_request(req.body, endpoint);
    if (r.model && *r.model != s.model_name)
      throw ApiError(404, "NotFoundError", "the model '" + *r.model + "' does not exist (serving '" +
                                               s.model_name + "')", "model");
    std::vector<int32_t> ids = prompt_ids(s, r);
    const auto prompt_len = static_cast<int32_t>(ids.size());
    const int32_t room = s.max_context_len - prompt_len;
    const int32_t max_tokens =
        std::min(r.max_tokens.value_or(endpoint == Endpoint::kChat ? room : 16), room);
    engine::GenerateRequest g;
    g.prompt = ids;
    g.max_new_tokens = max_tokens;
    g.sampling.temperature = r.temperature;
    g.sampling.top_k = r.top_k < 0 ? 0 : r.top_k;
    g.sampling.top_p = r.top_p;
    g.sampling.min_p = r.min_p;
    const uint64_t serial = s.next_id.fetch_add(1);
    g.sampling.seed = r.has_seed ? r.seed : s.seed_base + serial * 0x9E3779B97F4A7C15ull;
    g.ignore_eos = r.ignore_eos;
    std::shared_ptr<RequestStream> stream = s.loop->submit(std::move(g));
    const bool chat = endpoint == Endpoint::kChat;
    const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(serial);
    const auto created = static_cast<int64_t>(std::time(nullptr));

    if (r.stream) {
      auto job = std::make_shared<StreamJob>();
      job->server = &s;
      job->text = std::make_unique<TextState>(*s.tokenizer, ids, r.stop);
      job->request = std::move(r);
      job->stream = stream;
      job->id = id;
      job->created = created;
      job->prompt_len = prompt_len;
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [job](size_t, httplib::DataSink& sink) { return stream_step(*job, sink); },
          [job](bool) {
            if (!job->done) job->server->loop->cancel(job->stream);  // the client went away
          });
      return;
    }

    TextState text(*s.tokenizer, ids, r.stop);
    std::string out;
    RequestStream::Update u;
    for (;;) {
      u = stream->wait(kDisconnectPollMs);
      out += text.push(u.tokens);
      if (text.stop.stopped()) {
        s.loop->cancel(stream);
        break;
      }
      if (u.finished) break;
      if (HttpServer::client_gone()) {  // nobody will read the answer: free the engine's work
        s.loop->cancel(stream);
        res.status = kClientClosedRequest;
        return;
      }
    }
    if (u.finished && u.reason == engine::FinishReason::kError && !text.stop.stopped())
      throw ApiError(u.error_status ? u.error_status : 500,
                     u.error_status && u.error_status < 500 ? "invalid_request_error" : "server_error",
                     u.error);
    out += text.finish();
    json choice = {{"index", 0}, {"finish_reason", finish_name(u.reason, text.stop.stopped())}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", out}};
    } else {
      choice["text"] = out;
      choice["logprobs"] = nullptr;
    }
    const json body = {{"id", id},
                       {"object", chat ? "chat.completion" : "text_completion"},
                       {"created", created},
                       {"model", s.model_name},
                       {"choices", json::array({choice})},
                       {"usage", usage_json(prompt_len, text.completion_tokens)}};
    res.set_content(dump(body), "application/json");
  } catch (const ApiError& e) {
    set_error(res, e);
  }
  // A large body's parse freed many small blocks, which glibc keeps in this thread's arena:
  // hand the free pages back to the system so resident memory returns to its idle size.
  if (req.body.size() >= kTrimAfterBodyBytes) ::malloc_trim(0);
}

}  // namespace pagoda::server
