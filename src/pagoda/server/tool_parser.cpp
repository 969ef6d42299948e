// Tool-call parsers of `serve --tool-call-parser`: where a call begins in a reply, and how each
// format's calls are read back into names and arguments.
#include "pagoda/server/tool_parser.h"

#include <algorithm>
#include <utility>

#include <nlohmann/json.hpp>

namespace pagoda::server {

namespace {

using nlohmann::json;

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
  return std::string_view::npos;
}

/// A call object {"name": one of `tools`, "arguments" or "parameters": an object (absent: {})}.
std::optional<ParsedToolCall> to_call(const json& obj, const std::vector<ToolSpec>& tools) {
  if (!obj.is_object() || !obj.contains("name") || !obj["name"].is_string()) return std::nullopt;
  const auto name = obj["name"].get<std::string>();
  if (std::none_of(tools.begin(), tools.end(), [&](const ToolSpec& t) { return t.name == name; }))
    return std::nullopt;
  const char* key = obj.contains("arguments") ? "arguments" : "parameters";
  const json args = obj.contains(key) ? obj[key] : json::object();
  if (!args.is_object()) return std::nullopt;
  return ParsedToolCall{name, args.dump(-1, ' ', false, json::error_handler_t::replace)};
}

/// The calls of the JSON value s[pos, end): one call object, or (`array_ok`) an array of them.
/// Empty unless every element is a call.
std::vector<ParsedToolCall> calls_of(std::string_view s, size_t pos, size_t end,
                                     const std::vector<ToolSpec>& tools, bool array_ok) {
  const json v = json::parse(s.substr(pos, end - pos), nullptr, false);
  if (v.is_discarded()) return {};
  std::vector<ParsedToolCall> calls;
  if (v.is_array() && array_ok && !v.empty()) {
    for (const json& e : v) {
      auto c = to_call(e, tools);
      if (!c) return {};
      calls.push_back(std::move(*c));
    }
  } else if (auto c = to_call(v, tools)) {
    calls.push_back(std::move(*c));
  }
  return calls;
}

/// Where the first call of `f` begins in `s`, or npos. `reply_start`: `s` begins the reply
/// (llama3: a reply that opens with '{' is a call).
size_t call_start(ToolCallFormat f, std::string_view s, bool reply_start) {
  switch (f) {
    case ToolCallFormat::kQwen25: return s.find(kQwenOpen);
    case ToolCallFormat::kMistral: return s.find(kMistralTag);
    case ToolCallFormat::kLlama3:
    case ToolCallFormat::kJsonArray: {
      const bool llama = f == ToolCallFormat::kLlama3;
      const size_t first = skip_space(s, 0);
      if (reply_start && first < s.size() && s[first] == (llama ? '{' : '[')) return first;
      return llama ? s.find(kPythonTag) : std::string_view::npos;
    }
  }
  return std::string_view::npos;
}

/// The calls of a region that begins with a call marker, and the text of it that is not a call.
ParsedReply parse_region(ToolCallFormat f, std::string_view s, const std::vector<ToolSpec>& tools) {
  ParsedReply r;
  size_t pos = 0;
  if (f == ToolCallFormat::kQwen25) {  // <tool_call> object </tool_call>, repeated
    while (pos < s.size()) {
      const size_t open = s.find(kQwenOpen, pos);
      const size_t close = open == std::string_view::npos
                               ? open
                               : s.find(kQwenClose, open + kQwenOpen.size());
      if (close == std::string_view::npos) break;
      r.content.append(s.substr(pos, open - pos));
      const size_t body = skip_space(s, open + kQwenOpen.size());
      const size_t end = body < close && s[body] == '{' ? json_end(s, body) : std::string_view::npos;
      std::vector<ParsedToolCall> calls;
      if (end != std::string_view::npos && skip_space(s, end) == close)
        calls = calls_of(s, body, end, tools, false);
      pos = close + kQwenClose.size();
      if (calls.empty()) r.content.append(s.substr(open, pos - open));
      r.calls.insert(r.calls.end(), calls.begin(), calls.end());
    }
  } else if (f != ToolCallFormat::kLlama3) {  // [TOOL_CALLS] array-or-object, repeated
    const std::string_view tag_text = f == ToolCallFormat::kMistral ? kMistralTag : "";
    while (pos < s.size()) {  // (json_array: the same without a tag)
      const size_t tag = s.find(tag_text, pos);
      if (tag == std::string_view::npos) break;
      const size_t body = skip_space(s, tag + tag_text.size());
      const size_t end = body < s.size() && (s[body] == '[' || s[body] == '{')
                             ? json_end(s, body)
                             : std::string_view::npos;
      if (end == std::string_view::npos) break;
      std::vector<ParsedToolCall> calls = calls_of(s, body, end, tools, true);
      r.content.append(s.substr(pos, (calls.empty() ? end : tag) - pos));
      r.calls.insert(r.calls.end(), calls.begin(), calls.end());
      pos = end;
    }
  } else {  // llama3: [<|python_tag|>] object [;], repeated
    while (pos < s.size()) {
      size_t at = skip_space(s, pos);
      if (s.substr(at).starts_with(kPythonTag)) at = skip_space(s, at + kPythonTag.size());
      const size_t end = at < s.size() && s[at] == '{' ? json_end(s, at) : std::string_view::npos;
      if (end == std::string_view::npos) break;
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

}  // namespace

namespace {
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
  if (at == std::string_view::npos) return {std::string(text), {}};
  return split_at(f, text, at, tools, false);
}

ToolCallSplitter::ToolCallSplitter(ToolCallFormat f, const std::vector<ToolSpec>& tools)
    : format_(f), tools_(tools), markers_(tool_call_markers(f)) {}

std::string ToolCallSplitter::push(std::string_view text) {
  pending_.append(text);
  if (in_call_) return {};
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
  std::string out = pending_.substr(0, cut);
  pending_.erase(0, cut);
  sent_ += cut;
  return out;
}

ParsedReply ToolCallSplitter::finish() {
  ParsedReply r;
  if (!in_call_) {
    r.content.swap(pending_);
    return r;
  }
  r = split_at(format_, pending_, call_start(format_, pending_, sent_ == 0), tools_, sent_ > 0);
  pending_.clear();
  return r;
}

}  // namespace pagoda::server
