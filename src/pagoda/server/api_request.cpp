// Parsing and validation of OpenAI request bodies; the stop-string matcher.
#include "pagoda/server/api_request.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <initializer_list>
#include <limits>

#include <nlohmann/json.hpp>

#include "pagoda/core/check.h"

namespace pagoda::server {

using nlohmann::json;

std::string ApiError::to_json() const {
  json e = {{"message", what()},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", status}};
  return json{{"error", e}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

void throw_invalid(const std::string& field, const std::string& message) {
  throw ApiError(400, "invalid_request_error", field + ": " + message, field);
}

namespace {

bool present(const json& body, const char* key) {
  auto it = body.find(key);
  return it != body.end() && !it->is_null();
}

double number_field(const json& body, const char* key, double lo, double hi, bool lo_open) {
  const json& v = body.at(key);
  if (!v.is_number()) throw_invalid(key, "must be a number");
  const double x = v.get<double>();
  if (!std::isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo))
    throw_invalid(key, "must be in " + std::string(lo_open ? "(" : "[") + std::to_string(lo) +
                           ", " + std::to_string(hi) + "]");
  return x;
}

int64_t int_field(const json& body, const char* key, int64_t lo, int64_t hi) {
  const json& v = body.at(key);
  if (!v.is_number_integer()) throw_invalid(key, "must be an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
    throw_invalid(key, "must be at most " + std::to_string(hi));
  const int64_t x = v.is_number_unsigned() ? static_cast<int64_t>(v.get<uint64_t>())
                                           : v.get<int64_t>();
  if (x < lo || x > hi)
    throw_invalid(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

bool bool_field(const json& body, const char* key) {
  const json& v = body.at(key);
  if (!v.is_boolean()) throw_invalid(key, "must be a boolean");
  return v.get<bool>();
}

/// 400 naming `prefix.key` for a non-null member of `obj` outside `allowed`.
void reject_unknown_keys(const json& obj, std::initializer_list<std::string_view> allowed,
                         const std::string& prefix) {
  for (const auto& [key, value] : obj.items())
    if (!value.is_null() && std::find(allowed.begin(), allowed.end(), key) == allowed.end())
      throw_invalid(prefix + "." + key, "is not supported by this server");
}

std::string content_text(const json& content, const std::string& field) {
  if (content.is_null()) return {};
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw_invalid(field, "must be a string or an array of content parts");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string pf = field + "[" + std::to_string(i) + "]";
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      throw_invalid(pf, "must be an object with a string \"type\"");
    if (part["type"] != "text") throw_invalid(pf + ".type", "only \"text\" parts are supported");
    if (!part.contains("text") || !part["text"].is_string())
      throw_invalid(pf + ".text", "must be a string");
    text += part["text"].get<std::string>();
  }
  return text;
}

/// A token-id array (each a non-negative 32-bit integer), or nullopt when `v` is not an array of
/// numbers; `field` names it in errors.
std::optional<std::vector<int32_t>> token_ids(const json& v, const std::string& field) {
  if (!v.is_array() || v.empty() || !v[0].is_number()) return std::nullopt;
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_number_integer() || v[i].get<int64_t>() < 0 ||
        v[i].get<int64_t>() > std::numeric_limits<int32_t>::max())
      throw_invalid(field, "token id at index " + std::to_string(i) +
                               " must be a non-negative 32-bit integer");
    ids.push_back(static_cast<int32_t>(v[i].get<int64_t>()));
  }
  return ids;
}

/// `prompt`: a string, token ids, or a non-empty list of either (one choice set per prompt).
void parse_prompt(const json& body, ApiRequest& r) {
  if (!present(body, "prompt")) throw_invalid("prompt", "is required");
  const json& p = body["prompt"];
  const char* shape = "must be a string, an array of token ids, or an array of strings or of "
                      "token-id arrays";
  if (p.is_string()) {
    r.prompts.push_back({p.get<std::string>(), {}});
    return;
  }
  if (!p.is_array() || p.empty()) throw_invalid("prompt", shape);
  if (auto ids = token_ids(p, "prompt")) {
    r.prompts.push_back({std::nullopt, std::move(*ids)});
    return;
  }
  for (size_t i = 0; i < p.size(); ++i) {
    const std::string f = "prompt[" + std::to_string(i) + "]";
    if (p[i].is_string()) {
      r.prompts.push_back({p[i].get<std::string>(), {}});
    } else if (auto ids = token_ids(p[i], f)) {
      r.prompts.push_back({std::nullopt, std::move(*ids)});
    } else {
      throw_invalid(f, "must be a string or a non-empty array of token ids");
    }
  }
}

/// An assistant message's `tool_calls`: [{id, type: "function", function: {name, arguments
/// (a string)}}], checked and returned as JSON text. `field` names the message.
std::string message_tool_calls(const json& calls, const std::string& field) {
  const std::string f = field + ".tool_calls";
  if (!calls.is_array()) throw_invalid(f, "must be an array");
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string fi = f + "[" + std::to_string(i) + "]";
    const json& c = calls[i];
    if (!c.is_object()) throw_invalid(fi, "must be an object");
    reject_unknown_keys(c, {"id", "type", "function"}, fi);
    if (!present(c, "id") || !c["id"].is_string()) throw_invalid(fi + ".id", "must be a string");
    if (present(c, "type") && c["type"] != "function")
      throw_invalid(fi + ".type", "must be \"function\"");
    if (!present(c, "function") || !c["function"].is_object())
      throw_invalid(fi + ".function", "must be an object");
    const json& fn = c["function"];
    reject_unknown_keys(fn, {"name", "arguments"}, fi + ".function");
    if (!present(fn, "name") || !fn["name"].is_string())
      throw_invalid(fi + ".function.name", "must be a string");
    if (!present(fn, "arguments") || !fn["arguments"].is_string())
      throw_invalid(fi + ".function.arguments", "must be a string (JSON text)");
  }
  return calls.dump();
}

void parse_messages(const json& body, ApiRequest& r) {
  if (!present(body, "messages")) throw_invalid("messages", "is required");
  const json& m = body["messages"];
  if (!m.is_array() || m.empty()) throw_invalid("messages", "must be a non-empty array");
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string f = "messages[" + std::to_string(i) + "]";
    if (!m[i].is_object()) throw_invalid(f, "must be an object");
    const json& msg = m[i];
    if (!msg.contains("role") || !msg["role"].is_string() || msg["role"].get<std::string>().empty())
      throw_invalid(f + ".role", "must be a non-empty string");
    reject_unknown_keys(msg, {"role", "content", "tool_calls", "tool_call_id"}, f);
    ChatMessage out{.role = msg["role"].get<std::string>()};
    if (present(msg, "tool_calls")) out.tool_calls = message_tool_calls(msg["tool_calls"], f);
    if (!msg.contains("content") && out.tool_calls.empty())
      throw_invalid(f + ".content", "is required");
    out.null_content = !present(msg, "content") && !out.tool_calls.empty();
    if (msg.contains("content")) out.content = content_text(msg["content"], f + ".content");
    if (present(msg, "tool_call_id")) {
      if (!msg["tool_call_id"].is_string())
        throw_invalid(f + ".tool_call_id", "must be a string");
      out.tool_call_id = msg["tool_call_id"].get<std::string>();
    }
    r.messages.push_back(std::move(out));
  }
}

void parse_stop(const json& body, ApiRequest& r) {
  if (!present(body, "stop")) return;
  const json& s = body["stop"];
  if (s.is_string()) {
    r.stop.push_back(s.get<std::string>());
  } else if (s.is_array()) {
    if (s.size() > 4) throw_invalid("stop", "at most 4 stop strings");
    for (const json& x : s) {
      if (!x.is_string()) throw_invalid("stop", "must be a string or an array of strings");
      r.stop.push_back(x.get<std::string>());
    }
  } else {
    throw_invalid("stop", "must be a string or an array of strings");
  }
  for (const std::string& x : r.stop)
    if (x.empty()) throw_invalid("stop", "stop strings must not be empty");
}

/// logit_bias: an object from token ids (decimal strings, as JSON keys must be) to biases in
/// [-100, 100].
void parse_logit_bias(const json& body, ApiRequest& r) {
  if (!present(body, "logit_bias")) return;
  const json& m = body["logit_bias"];
  if (!m.is_object()) throw_invalid("logit_bias", "must be an object of token id -> bias");
  for (const auto& [key, value] : m.items()) {
    const bool digits = !key.empty() && key.size() <= 9 &&
                        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits) throw_invalid("logit_bias", "key '" + key + "' is not a token id");
    if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < -100 ||
        value.get<double>() > 100)
      throw_invalid("logit_bias", "the bias of token " + key + " must be a number in [-100, 100]");
    r.logit_bias.emplace_back(static_cast<int32_t>(std::stol(key)),
                              static_cast<float>(value.get<double>()));
  }
}

/// Completions: `logprobs` N in [0, kMaxTopLogprobs] (false: none). Chat: `logprobs` a boolean,
/// `top_logprobs` N only with logprobs true.
void parse_logprobs(const json& body, ApiRequest& r) {
  const bool chat = r.endpoint == Endpoint::kChat;
  if (present(body, "logprobs")) {
    const json& v = body["logprobs"];
    if (v.is_boolean()) {
      if (v.get<bool>() && !chat) throw_invalid("logprobs", "must be an integer (top alternatives)");
      if (v.get<bool>()) r.logprobs = 0;
    } else if (chat) {
      throw_invalid("logprobs", "must be a boolean (top_logprobs gives the alternatives)");
    } else {
      r.logprobs = static_cast<int32_t>(int_field(body, "logprobs", 0, kMaxTopLogprobs));
    }
  }
  if (chat && present(body, "top_logprobs")) {
    const auto n = static_cast<int32_t>(int_field(body, "top_logprobs", 0, kMaxTopLogprobs));
    if (r.logprobs < 0) throw_invalid("top_logprobs", "needs logprobs: true");
    r.logprobs = n;
  }
}

/// response_format: {"type": "text" | "json_object" | "json_schema"}; json_schema carries
/// {"name", "schema" (an object or a boolean), "strict", "description"} as OpenAI writes it.
void parse_response_format(const json& body, ApiRequest& r) {
  if (!present(body, "response_format")) return;
  const json& f = body["response_format"];
  if (!f.is_object() || !f.contains("type") || !f["type"].is_string())
    throw_invalid("response_format", "must be an object with a string `type`");
  const auto type = f["type"].get<std::string>();
  if (type == "text" || type == "json_object") {
    reject_unknown_keys(f, {"type"}, "response_format");
    if (type == "json_object") r.response_format.type = ResponseFormat::Type::kJsonObject;
    return;
  }
  if (type != "json_schema")
    throw_invalid("response_format.type", "must be text, json_object or json_schema");
  reject_unknown_keys(f, {"type", "json_schema"}, "response_format");
  if (!present(f, "json_schema") || !f["json_schema"].is_object())
    throw_invalid("response_format.json_schema", "must be an object with a `schema`");
  const json& js = f["json_schema"];
  reject_unknown_keys(js, {"name", "schema", "strict", "description"},
                      "response_format.json_schema");
  if (present(js, "name") && !js["name"].is_string())
    throw_invalid("response_format.json_schema.name", "must be a string");
  if (present(js, "strict") && !js["strict"].is_boolean())
    throw_invalid("response_format.json_schema.strict", "must be a boolean");
  if (!present(js, "schema") || !(js["schema"].is_object() || js["schema"].is_boolean()))
    throw_invalid("response_format.json_schema.schema", "must be a JSON schema (an object)");
  r.response_format.type = ResponseFormat::Type::kJsonSchema;
  r.response_format.schema = js["schema"].dump();
}

/// Chat tools: [{"type": "function", "function": {"name", "description", "parameters",
/// "strict"}}] and tool_choice "none" | "auto" | "required" | {"type": "function", "function":
/// {"name"}}. `body_text`: the body, parsed again keeping key order for the template's tools.
void parse_tools(const json& body, std::string_view body_text, ApiRequest& r) {
  if (present(body, "tools")) {
    const json& list = body["tools"];
    const auto ordered = nlohmann::ordered_json::parse(body_text.begin(), body_text.end());
    if (!list.is_array() || list.empty()) throw_invalid("tools", "must be a non-empty array");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string f = "tools[" + std::to_string(i) + "]";
      const json& t = list[i];
      if (!t.is_object() || !present(t, "type") || t["type"] != "function" ||
          !present(t, "function") || !t["function"].is_object())
        throw_invalid(f, "must be {\"type\": \"function\", \"function\": {...}}");
      reject_unknown_keys(t, {"type", "function"}, f);
      const json& fn = t["function"];
      reject_unknown_keys(fn, {"name", "description", "parameters", "strict"}, f + ".function");
      const bool named = present(fn, "name") && fn["name"].is_string() &&
                         !fn["name"].get<std::string>().empty() &&
                         fn["name"].get<std::string>().size() <= 64;
      const std::string name = named ? fn["name"].get<std::string>() : std::string();
      if (!named || !std::all_of(name.begin(), name.end(), [](char c) {
            return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '-';
          }))
        throw_invalid(f + ".function.name", "must be 1 to 64 of a-z, A-Z, 0-9, _ and -");
      for (const ToolSpec& other : r.tools)
        if (other.name == name) throw_invalid(f + ".function.name", "repeats '" + name + "'");
      if (present(fn, "description") && !fn["description"].is_string())
        throw_invalid(f + ".function.description", "must be a string");
      if (present(fn, "strict") && !fn["strict"].is_boolean())
        throw_invalid(f + ".function.strict", "must be a boolean");
      if (present(fn, "parameters") && !fn["parameters"].is_object())
        throw_invalid(f + ".function.parameters", "must be a JSON schema (an object)");
      r.tools.push_back(ToolSpec{.name = name,
                                 .parameters = present(fn, "parameters")
                                                   ? fn["parameters"].dump()
                                                   : std::string(R"({"type":"object"})"),
                                 .json = ordered["tools"][i].dump()});
    }
  }
  if (present(body, "parallel_tool_calls")) {
    if (!body["parallel_tool_calls"].is_boolean())
      throw_invalid("parallel_tool_calls", "must be a boolean");
    if (r.tools.empty()) throw_invalid("parallel_tool_calls", "needs tools");
    r.parallel_tool_calls = body["parallel_tool_calls"].get<bool>();
  }
  const bool text = r.response_format.type == ResponseFormat::Type::kText;
  if (!present(body, "tool_choice")) {
    r.tool_auto = !r.tools.empty();  // OpenAI's default with tools
    if (r.tool_auto && !text)
      throw_invalid("response_format", "cannot be combined with tools and tool_choice \"auto\" "
                                       "(the default with tools): give tool_choice \"none\"");
    return;
  }
  const json& c = body["tool_choice"];
  if (r.tools.empty()) throw_invalid("tool_choice", "needs tools");
  if (c == "none") return;
  if (c == "required") {
    r.tool_call = "";
  } else if (c == "auto") {
    r.tool_auto = true;
    if (!text) throw_invalid("response_format", "cannot be combined with tool_choice \"auto\"");
    return;
  } else if (c.is_object() && present(c, "type") && c["type"] == "function" &&
             present(c, "function") && c["function"].is_object() &&
             present(c["function"], "name") && c["function"]["name"].is_string()) {
    reject_unknown_keys(c, {"type", "function"}, "tool_choice");
    reject_unknown_keys(c["function"], {"name"}, "tool_choice.function");
    const auto name = c["function"]["name"].get<std::string>();
    if (std::none_of(r.tools.begin(), r.tools.end(),
                     [&](const ToolSpec& t) { return t.name == name; }))
      throw_invalid("tool_choice.function.name", "'" + name + "' is not one of the tools");
    r.tool_call = name;
  } else {
    throw_invalid("tool_choice", "must be \"none\", \"auto\", \"required\" or {\"type\": "
                                 "\"function\", \"function\": {\"name\": ...}}");
  }
  if (!text) throw_invalid("response_format", "cannot be combined with a required tool call");
}

bool known_field(std::string_view key, Endpoint endpoint) {
  static constexpr std::string_view kCommon[] = {
      "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stream",
      "stream_options", "ignore_eos", "n", "presence_penalty", "frequency_penalty", "logprobs",
      "user", "stop_token_ids", "repetition_penalty", "logit_bias", "response_format"};
  static constexpr std::string_view kCompletions[] = {"prompt", "echo", "best_of"};
  static constexpr std::string_view kChat[] = {"messages", "add_generation_prompt",
                                               "max_completion_tokens", "top_logprobs", "tools",
                                               "tool_choice", "parallel_tool_calls"};
  static constexpr std::string_view kTokenize[] = {"model", "prompt", "messages",
                                                   "add_generation_prompt", "add_special_tokens"};
  static constexpr std::string_view kDetokenize[] = {"model", "tokens"};
  auto in = [key](const auto& list) {
    return std::find(std::begin(list), std::end(list), key) != std::end(list);
  };
  switch (endpoint) {
    case Endpoint::kCompletions: return in(kCommon) || in(kCompletions);
    case Endpoint::kChat: return in(kCommon) || in(kChat);
    case Endpoint::kTokenize: return in(kTokenize);
    case Endpoint::kDetokenize: return in(kDetokenize);
  }
  return false;
}

/// A SAX pass over the body before any DOM is built: it stops at the first top-level field this
/// server does not implement (unless its value is null, i.e. not given) and bounds nesting and the
/// number of values, so a large body cannot make the parser allocate a large tree.
class ShapeCheck final : public nlohmann::json_sax<json> {
 public:
  explicit ShapeCheck(Endpoint endpoint) : endpoint_(endpoint) {}
  std::string field, message;  ///< the error, when the pass stopped early

  bool null() override { return scalar(true); }
  bool boolean(bool) override { return scalar(false); }
  bool number_integer(number_integer_t) override { return scalar(false); }
  bool number_unsigned(number_unsigned_t) override { return scalar(false); }
  bool number_float(number_float_t, const string_t&) override { return scalar(false); }
  bool string(string_t&) override { return scalar(false); }
  bool binary(binary_t&) override { return scalar(false); }
  bool start_object(std::size_t) override { return open(); }
  bool start_array(std::size_t) override { return open(); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    if (depth_ == 1 && !known_field(k, endpoint_)) pending_ = k;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return fail("body", "is not valid JSON");
  }

 private:
  bool fail(std::string f, std::string m) {
    field = std::move(f);
    message = std::move(m);
    return false;
  }
  bool unsupported() { return fail(pending_, "is not supported by this server"); }
  bool scalar(bool is_null) {
    if (++values_ > kMaxJsonValues)
      return fail("body", "has more than " + std::to_string(kMaxJsonValues) + " JSON values");
    if (depth_ == 1 && !pending_.empty()) {
      if (!is_null) return unsupported();
      pending_.clear();
    }
    return true;
  }
  bool open() {  // a container is one value, then a level deeper
    if (!scalar(false)) return false;
    if (++containers_ > kMaxJsonContainers)
      return fail("body", "has more than " + std::to_string(kMaxJsonContainers) +
                              " JSON objects and arrays");
    if (++depth_ > kMaxJsonDepth)
      return fail("body", "nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    return true;
  }
  bool close() {
    --depth_;
    return true;
  }

  Endpoint endpoint_;
  int depth_ = 0;
  int64_t values_ = 0;
  int64_t containers_ = 0;
  std::string pending_;  ///< an unknown top-level key whose value comes next
};

/// The body as a JSON object, after the SAX pass (ShapeCheck) for `endpoint`.
json parse_body(std::string_view body_text, Endpoint endpoint) {
  ShapeCheck shape(endpoint);
  if (!json::sax_parse(body_text.begin(), body_text.end(), &shape)) {
    if (shape.field.empty()) throw_invalid("body", "is not valid JSON");
    throw_invalid(shape.field, shape.message);
  }
  json body = json::parse(body_text.begin(), body_text.end(), nullptr, false);
  if (body.is_discarded()) throw_invalid("body", "is not valid JSON");
  if (!body.is_object()) throw_invalid("body", "must be a JSON object");
  return body;
}

std::optional<std::string> model_field(const json& body) {
  if (!present(body, "model")) return std::nullopt;
  if (!body["model"].is_string()) throw_invalid("model", "must be a string");
  return body["model"].get<std::string>();
}

}  // namespace

ApiRequest parse_api_request(std::string_view body_text, Endpoint endpoint) {
  PAGODA_CHECK(endpoint == Endpoint::kCompletions || endpoint == Endpoint::kChat);
  const json body = parse_body(body_text, endpoint);
  ApiRequest r;
  r.endpoint = endpoint;
  r.model = model_field(body);
  if (endpoint == Endpoint::kCompletions) {
    parse_prompt(body, r);
  } else {
    parse_messages(body, r);
    if (present(body, "add_generation_prompt"))
      r.add_generation_prompt = bool_field(body, "add_generation_prompt");
  }
  const char* max_key = endpoint == Endpoint::kChat && present(body, "max_completion_tokens")
                            ? "max_completion_tokens"
                            : "max_tokens";
  if (present(body, max_key)) r.max_tokens = static_cast<int32_t>(int_field(body, max_key, 1, 1 << 30));
  if (present(body, "temperature"))
    r.temperature = static_cast<float>(number_field(body, "temperature", 0, 2, false));
  if (present(body, "top_p")) r.top_p = static_cast<float>(number_field(body, "top_p", 0, 1, true));
  if (present(body, "top_k")) r.top_k = static_cast<int32_t>(int_field(body, "top_k", -1, 1 << 30));
  if (present(body, "min_p")) {
    r.min_p = static_cast<float>(number_field(body, "min_p", 0, 1, false));
    if (r.min_p >= 1.f) throw_invalid("min_p", "must be in [0, 1)");
  }
  if (present(body, "seed")) {
    const json& v = body["seed"];
    if (!v.is_number_integer()) throw_invalid("seed", "must be an integer");
    r.seed = v.is_number_unsigned() ? v.get<uint64_t>() : static_cast<uint64_t>(v.get<int64_t>());
    r.has_seed = true;
  }
  parse_stop(body, r);
  if (present(body, "stream")) r.stream = bool_field(body, "stream");
  if (present(body, "stream_options")) {
    const json& so = body["stream_options"];
    if (!so.is_object()) throw_invalid("stream_options", "must be an object");
    if (!r.stream) throw_invalid("stream_options", "is only allowed with stream: true");
    reject_unknown_keys(so, {"include_usage"}, "stream_options");
    if (present(so, "include_usage")) {
      if (!so["include_usage"].is_boolean())
        throw_invalid("stream_options.include_usage", "must be a boolean");
      r.include_usage = so["include_usage"].get<bool>();
    }
  }
  if (present(body, "ignore_eos")) r.ignore_eos = bool_field(body, "ignore_eos");
  if (present(body, "n")) r.n = static_cast<int32_t>(int_field(body, "n", 1, kMaxChoices));
  if (present(body, "stop_token_ids")) {
    const json& v = body["stop_token_ids"];
    if (!v.is_array()) throw_invalid("stop_token_ids", "must be an array of token ids");
    if (!v.empty()) r.stop_token_ids = *token_ids(v, "stop_token_ids");
  }
  if (present(body, "presence_penalty"))
    r.presence_penalty = static_cast<float>(number_field(body, "presence_penalty", -2, 2, false));
  if (present(body, "frequency_penalty"))
    r.frequency_penalty = static_cast<float>(number_field(body, "frequency_penalty", -2, 2, false));
  if (present(body, "repetition_penalty")) {
    r.repetition_penalty = static_cast<float>(number_field(body, "repetition_penalty", 0, 2, true));
    if (!(r.repetition_penalty > 0.f)) throw_invalid("repetition_penalty", "must be in (0, 2]");
  }
  parse_logit_bias(body, r);
  parse_logprobs(body, r);
  parse_response_format(body, r);
  if (endpoint == Endpoint::kChat) parse_tools(body, body_text, r);
  if (present(body, "echo")) r.echo = bool_field(body, "echo");
  if (r.echo && r.logprobs >= 0)
    throw_invalid("logprobs", "is not supported with echo (no prompt log-probabilities)");
  if (present(body, "best_of") && int_field(body, "best_of", 1, kMaxChoices) != r.n)
    throw_invalid("best_of", "only best_of = n is supported");
  if (static_cast<int64_t>(r.prompts.size()) * r.n > kMaxChoices)
    throw_invalid("n", "prompts × n must be at most " + std::to_string(kMaxChoices));
  return r;
}

TokenizeRequest parse_tokenize_request(std::string_view body_text) {
  const json body = parse_body(body_text, Endpoint::kTokenize);
  TokenizeRequest r;
  r.model = model_field(body);
  if (present(body, "prompt") == present(body, "messages"))
    throw_invalid("prompt", "give exactly one of prompt (a string) and messages");
  if (present(body, "prompt")) {
    if (!body["prompt"].is_string()) throw_invalid("prompt", "must be a string");
    r.prompt = body["prompt"].get<std::string>();
  } else {
    ApiRequest chat;
    parse_messages(body, chat);
    r.messages = std::move(chat.messages);
  }
  if (present(body, "add_generation_prompt"))
    r.add_generation_prompt = bool_field(body, "add_generation_prompt");
  if (present(body, "add_special_tokens"))
    r.add_special_tokens = bool_field(body, "add_special_tokens");
  return r;
}

DetokenizeRequest parse_detokenize_request(std::string_view body_text) {
  const json body = parse_body(body_text, Endpoint::kDetokenize);
  DetokenizeRequest r;
  r.model = model_field(body);
  if (!present(body, "tokens") || !body["tokens"].is_array())
    throw_invalid("tokens", "must be an array of token ids");
  if (!body["tokens"].empty()) r.tokens = *token_ids(body["tokens"], "tokens");
  return r;
}

nlohmann::ordered_json template_messages(const std::vector<ChatMessage>& messages) {
  using ojson = nlohmann::ordered_json;
  ojson list = ojson::array();
  for (const ChatMessage& m : messages) {
    ojson msg = {{"role", m.role}, {"content", m.null_content ? ojson(nullptr) : ojson(m.content)}};
    if (!m.tool_calls.empty()) {
      msg["tool_calls"] = ojson::parse(m.tool_calls);
      for (ojson& call : msg["tool_calls"]) {
        ojson& args = call["function"]["arguments"];
        ojson parsed = ojson::parse(args.get<std::string>(), nullptr, false);
        if (parsed.is_object()) args = std::move(parsed);
      }
    }
    if (!m.tool_call_id.empty()) msg["tool_call_id"] = m.tool_call_id;
    list.push_back(std::move(msg));
  }
  return list;
}

std::string client_text(std::string_view text) {
  const std::string s(text);
  const std::string dumped = json(s).dump(-1, ' ', false, json::error_handler_t::replace);
  return json::parse(dumped).get<std::string>();
}

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const auto& s : stops_) max_len_ = std::max(max_len_, s.size());
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  if (stops_.empty()) return std::string(text);
  const size_t old = pending_.size();
  pending_.append(text);
  // The stop string that completes first (smallest end; on a tie the earliest start), as if the
  // text arrived one byte at a time. Any match ends in the new text (it may start in the
  // held-back part).
  size_t first = std::string::npos, first_end = std::string::npos;
  const size_t from = old >= max_len_ ? old - max_len_ + 1 : 0;
  for (const auto& s : stops_) {
    const size_t at = pending_.find(s, from);
    if (at == std::string::npos) continue;
    const size_t end = at + s.size();
    if (end < first_end || (end == first_end && at < first)) {
      first = at;
      first_end = end;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_)
    for (size_t n = std::min(s.size() - 1, pending_.size()); n > hold; --n)
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::finish() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace pagoda::server
