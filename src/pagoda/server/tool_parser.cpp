// Tool-call parsers of `serve --tool-call-parser`: where a call begins in a reply, and how each
// format's calls are read back into names and arguments, whole or while they are written.
#include "pagoda/server/tool_parser.h"

#include <algorithm>
#include <utility>

#include <nlohmann/json.hpp>

namespace pagoda::server {

namespace {

using nlohmann::json;

constexpr size_t kNpos = std::string_view::npos;
constexpr std::string_view kQwenOpen = "<tool_call>";
constexpr std::string_view kQwenClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralTag = "[TOOL_CALLS]";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

bool all_space(std::string_view s) { return std::all_of(s.begin(), s.end(), is_space); }

size_t skip_space(std::string_view s, size_t pos) {
  while (pos < s.size() && is_space(s[pos])) ++pos;
  return pos;
}

/// The end (one past) of the JSON object or array that opens at s[pos] ('{' or '['), found by
/// bracket matching outside strings; npos when it does not close within `s`.
size_t json_end(std::string_view s, size_t pos) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = pos; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return i + 1;
    }
  }
  return kNpos;
}

/// A call object read from s[pos] ('{') as far as `s` goes: its "name" once that string is
/// complete, and where the objects under "arguments" and "parameters" begin and end (npos: not
/// begun / still open). A key given twice counts by its last value, as json::parse keeps it.
struct CallScan {
  std::optional<std::string> name;
  size_t begin[2] = {kNpos, kNpos};  ///< "arguments", "parameters"
  size_t end[2] = {kNpos, kNpos};
  size_t object_end = kNpos;  ///< one past the object's '}'; npos while it is open
  /// The arguments' text so far ("arguments", else "parameters"), as written; nullopt before
  /// either object has begun.
  std::optional<std::string_view> arguments(std::string_view s) const {
    const int k = begin[0] != kNpos ? 0 : 1;
    if (begin[k] == kNpos) return std::nullopt;
    return s.substr(begin[k], end[k] == kNpos ? kNpos : end[k] - begin[k]);
  }
};

CallScan scan_call(std::string_view s, size_t pos) {
  CallScan c;
  int depth = 0, slot = -1;  // slot: the arguments key whose value is being read
  bool in_string = false, want_key = true, name_value = false;
  size_t token = kNpos;  // where the current top-level string began
  std::string key;
  for (size_t i = pos; i < s.size(); ++i) {
    const char ch = s[i];
    if (in_string) {
      if (ch == '\\') {
        ++i;
      } else if (ch == '"') {
        in_string = false;
        if (token != kNpos) {
          const json t = json::parse(s.substr(token, i + 1 - token), nullptr, false);
          const std::string v = t.is_string() ? t.get<std::string>() : std::string();
          if (want_key) key = v;
          else if (name_value) c.name = v;
          token = kNpos;
        }
      }
      continue;
    }
    switch (ch) {
      case '"':
        in_string = true;
        if (depth == 1) token = i;
        break;
      case ':':
        if (depth == 1) {
          want_key = false;
          slot = key == "arguments" ? 0 : key == "parameters" ? 1 : -1;
          name_value = key == "name";
        }
        break;
      case ',':
        if (depth == 1) want_key = true, slot = -1, name_value = false;
        break;
      case '{':
      case '[':
        if (depth == 1 && slot >= 0) c.begin[slot] = ch == '{' ? i : kNpos, c.end[slot] = kNpos;
        ++depth;
        break;
      case '}':
      case ']':
        if (--depth == 1 && slot >= 0 && c.begin[slot] != kNpos) c.end[slot] = i + 1;
        if (depth == 0) {
          c.object_end = i + 1;
          return c;
        }
        break;
      default: break;
    }
  }
  return c;
}

bool is_tool(const std::string& name, const std::vector<ToolSpec>& tools) {
  return std::any_of(tools.begin(), tools.end(), [&](const ToolSpec& t) { return t.name == name; });
}

/// A call object {"name": one of `tools`, "arguments" or "parameters": an object (absent: {})};
/// `raw` is its text, whose arguments object is kept as written.
std::optional<ParsedToolCall> to_call(const json& obj, std::string_view raw,
                                      const std::vector<ToolSpec>& tools) {
  if (!obj.is_object() || !obj.contains("name") || !obj["name"].is_string()) return std::nullopt;
  const auto name = obj["name"].get<std::string>();
  if (!is_tool(name, tools)) return std::nullopt;
  const char* key = obj.contains("arguments") ? "arguments" : "parameters";
  if (!obj.contains(key)) return ParsedToolCall{name, "{}"};
  const std::optional<std::string_view> args = scan_call(raw, 0).arguments(raw);
  if (!obj[key].is_object() || !args) return std::nullopt;
  return ParsedToolCall{name, std::string(*args)};
}

/// The offsets of the objects of the JSON array that opens at s[pos] ('['), in order, up to the
/// first element that is not an object or does not close within `s` (that one included).
std::vector<size_t> array_objects(std::string_view s, size_t pos) {
  std::vector<size_t> at;
  for (size_t i = skip_space(s, pos + 1); i < s.size() && s[i] == '{';) {
    at.push_back(i);
    const size_t end = json_end(s, i);
    if (end == kNpos) break;
    i = skip_space(s, end);
    if (i >= s.size() || s[i] != ',') break;
    i = skip_space(s, i + 1);
  }
  return at;
}

/// The calls of the JSON value s[pos, end): one call object, or (`array_ok`) an array of them.
/// Empty unless every element is a call.
std::vector<ParsedToolCall> calls_of(std::string_view s, size_t pos, size_t end,
                                     const std::vector<ToolSpec>& tools, bool array_ok) {
  const json v = json::parse(s.substr(pos, end - pos), nullptr, false);
  if (v.is_discarded()) return {};
  std::vector<ParsedToolCall> calls;
  if (v.is_array() && array_ok && !v.empty()) {
    const std::vector<size_t> at = array_objects(s, pos);
    if (at.size() != v.size()) return {};  // an element that is not an object
    for (size_t k = 0; k < at.size(); ++k) {
      auto c = to_call(v[k], s.substr(at[k], json_end(s, at[k]) - at[k]), tools);
      if (!c) return {};
      calls.push_back(std::move(*c));
    }
  } else if (auto c = to_call(v, s.substr(pos, end - pos), tools)) {
    calls.push_back(std::move(*c));
  }
  return calls;
}

/// Where the first call of `f` begins in `s`, or npos. `reply_start`: `s` begins the reply
/// (llama3: a reply that opens with '{' is a call; json_array: one that opens with '[').
size_t call_start(ToolCallFormat f, std::string_view s, bool reply_start) {
  switch (f) {
    case ToolCallFormat::kQwen25: return s.find(kQwenOpen);
    case ToolCallFormat::kMistral: return s.find(kMistralTag);
    case ToolCallFormat::kLlama3:
    case ToolCallFormat::kJsonArray: {
      const bool llama = f == ToolCallFormat::kLlama3;
      const size_t first = skip_space(s, 0);
      if (reply_start && first < s.size() && s[first] == (llama ? '{' : '[')) return first;
      return llama ? s.find(kPythonTag) : kNpos;
    }
  }
  return kNpos;
}

/// The calls of a region that begins with a call marker, and the text of it that is not a call.
/// `objects` (when given) gets the offsets of the objects at a call's place in it, in order, up
/// to the first that does not close (for streaming a region still being written).
ParsedReply parse_region(ToolCallFormat f, std::string_view s, const std::vector<ToolSpec>& tools,
                         std::vector<size_t>* objects = nullptr) {
  ParsedReply r;
  size_t pos = 0;
  auto object_at = [&](size_t at) {  // s[at] opens a call's object: its end, or npos
    if (at >= s.size() || s[at] != '{') return kNpos;
    if (objects != nullptr) objects->push_back(at);
    return json_end(s, at);
  };
  if (f == ToolCallFormat::kQwen25) {  // <tool_call> object </tool_call>, repeated
    while (pos < s.size()) {
      const size_t open = s.find(kQwenOpen, pos);
      if (open == kNpos) break;
      const size_t body = skip_space(s, open + kQwenOpen.size());
      const size_t end = object_at(body);
      const size_t after = end == kNpos ? kNpos : skip_space(s, end);
      std::vector<ParsedToolCall> calls;
      if (after != kNpos && s.substr(after).starts_with(kQwenClose))
        calls = calls_of(s, body, end, tools, false);
      if (!calls.empty()) {
        r.content.append(s.substr(pos, open - pos));
        r.calls.push_back(std::move(calls[0]));
        pos = after + kQwenClose.size();
        continue;
      }
      if (end == kNpos && objects != nullptr && body < s.size() && s[body] == '{') break;
      // Not a call: text up to the first closing tag after the marker (the rest when none).
      const size_t close = s.find(kQwenClose, open + kQwenOpen.size());
      if (close == kNpos) break;
      r.content.append(s.substr(pos, close + kQwenClose.size() - pos));
      pos = close + kQwenClose.size();
    }
  } else if (f != ToolCallFormat::kLlama3) {  // [TOOL_CALLS] array-or-object, repeated
    const std::string_view tag_text = f == ToolCallFormat::kMistral ? kMistralTag : "";
    while (pos < s.size()) {  // (json_array: the same without a tag)
      const size_t tag = s.find(tag_text, pos);
      if (tag == kNpos) break;
      const size_t body = skip_space(s, tag + tag_text.size());
      if (body < s.size() && s[body] == '[' && objects != nullptr) {
        const std::vector<size_t> at = array_objects(s, body);
        objects->insert(objects->end(), at.begin(), at.end());
      }
      const size_t end = body < s.size() && s[body] == '[' ? json_end(s, body) : object_at(body);
      if (end == kNpos) break;
      std::vector<ParsedToolCall> calls = calls_of(s, body, end, tools, true);
      r.content.append(s.substr(pos, (calls.empty() ? end : tag) - pos));
      r.calls.insert(r.calls.end(), calls.begin(), calls.end());
      pos = end;
    }
  } else {  // llama3: [<|python_tag|>] object [;], repeated
    while (pos < s.size()) {
      size_t at = skip_space(s, pos);
      if (s.substr(at).starts_with(kPythonTag)) at = skip_space(s, at + kPythonTag.size());
      const size_t end = object_at(at);
      if (end == kNpos) break;
      std::vector<ParsedToolCall> calls = calls_of(s, at, end, tools, false);
      if (calls.empty()) break;
      r.calls.push_back(std::move(calls[0]));
      pos = skip_space(s, end);
      if (pos < s.size() && s[pos] == ';') ++pos;
    }
  }
  r.content.append(s.substr(std::min(pos, s.size())));
  return r;
}

/// `s` split at `at` (a call's start): the text before, the region's leftovers and its calls;
/// `sent_before`: text of the reply already released before `s` (then never white space only).
ParsedReply split_at(ToolCallFormat f, std::string_view s, size_t at,
                     const std::vector<ToolSpec>& tools, bool sent_before) {
  ParsedReply r = parse_region(f, s.substr(at), tools);
  r.content.insert(0, s.substr(0, at));
  if (!r.calls.empty() && !sent_before && all_space(r.content)) r.content.clear();
  return r;
}

/// Every name of `serve --tool-call-parser` and its format (SGLang's names).
constexpr std::pair<std::string_view, ToolCallFormat> kFormatNames[] = {
    {"qwen25", ToolCallFormat::kQwen25}, {"qwen", ToolCallFormat::kQwen25},
    {"hermes", ToolCallFormat::kQwen25}, {"llama3", ToolCallFormat::kLlama3},
    {"mistral", ToolCallFormat::kMistral}};

}  // namespace

std::optional<ToolCallFormat> tool_call_format(std::string_view name) {
  for (const auto& [n, f] : kFormatNames)
    if (n == name) return f;
  return std::nullopt;
}

const std::vector<std::string>& tool_call_format_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& [n, f] : kFormatNames) v.emplace_back(n);
    return v;
  }();
  return names;
}

std::vector<std::string> tool_call_markers(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::kQwen25: return {std::string(kQwenOpen), std::string(kQwenClose)};
    case ToolCallFormat::kLlama3: return {std::string(kPythonTag)};
    case ToolCallFormat::kMistral: return {std::string(kMistralTag)};
    case ToolCallFormat::kJsonArray: return {};
  }
  return {};
}

ParsedReply parse_tool_calls(ToolCallFormat f, std::string_view text,
                             const std::vector<ToolSpec>& tools) {
  const size_t at = call_start(f, text, true);
  if (at == kNpos) return {std::string(text), {}};
  return split_at(f, text, at, tools, false);
}

ToolCallSplitter::ToolCallSplitter(ToolCallFormat f, const std::vector<ToolSpec>& tools)
    : format_(f), tools_(tools), markers_(tool_call_markers(f)) {}

SplitPiece ToolCallSplitter::push(std::string_view text) {
  pending_.append(text);
  if (in_call_) return {{}, stream_calls()};
  size_t cut = call_start(format_, pending_, sent_ == 0);
  if (cut != std::string::npos) {
    in_call_ = true;
  } else {  // hold back a tail that could still become a marker
    cut = pending_.size();
    for (const std::string& m : markers_)
      for (size_t n = std::min(m.size() - 1, pending_.size()); n > 0; --n)
        if (pending_.compare(pending_.size() - n, n, m, 0, n) == 0) {
          cut = std::min(cut, pending_.size() - n);
          break;
        }
  }
  while (cut > 0 && is_space(pending_[cut - 1])) --cut;  // released text ends in non-space
  SplitPiece out{pending_.substr(0, cut), {}};
  pending_.erase(0, cut);
  sent_ += cut;
  if (in_call_) out.calls = stream_calls();
  return out;
}

std::vector<ToolCallDelta> ToolCallSplitter::stream_calls() {
  const std::string_view region =
      std::string_view(pending_).substr(call_start(format_, pending_, sent_ == 0));
  std::vector<size_t> objects;
  parse_region(format_, region, tools_, &objects);
  std::vector<ToolCallDelta> out;
  size_t k = 0;
  for (size_t at : objects) {
    const CallScan c = scan_call(region, at);
    const std::optional<std::string_view> args = c.arguments(region);
    if (c.name && is_tool(*c.name, tools_) && args) {
      if (k == streamed_.size()) {
        out.push_back({k, *c.name, std::string(*args)});
        streamed_.push_back(args->size());
      } else if (args->size() > streamed_[k]) {
        out.push_back({k, {}, std::string(args->substr(streamed_[k]))});
        streamed_[k] = args->size();
      }
      ++k;
    }
    if (c.object_end == kNpos) break;
  }
  return out;
}

ToolCallSplitter::End ToolCallSplitter::finish() {
  End e;
  if (!in_call_) {
    e.rest.content.swap(pending_);
    return e;
  }
  ParsedReply r =
      split_at(format_, pending_, call_start(format_, pending_, sent_ == 0), tools_, sent_ > 0);
  for (size_t k = 0; k < r.calls.size(); ++k) {  // what the streamed pieces lack
    const std::string& args = r.calls[k].arguments;
    if (k >= streamed_.size())
      e.rest.calls.push_back({k, r.calls[k].name, args});
    else if (streamed_[k] < args.size())
      e.rest.calls.push_back({k, {}, args.substr(streamed_[k])});
  }
  e.rest.content = std::move(r.content);
  e.calls = std::move(r.calls);
  pending_.clear();
  return e;
}

}  // namespace pagoda::server
