#include "pagoda/server/tool_calls.h"

#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"

namespace pagoda::server {

namespace {

using Schema = nlohmann::ordered_json;  // schemas keep their key order

/// One call object per function (`only`: just that one when non-empty), {"name", `args_key`} in
/// that order (llguidance writes properties in the schema's order; the parameters keep the
/// request's), its arguments under `args_key`: a schema, or anyOf them.
Schema call_object_schema(const std::vector<ToolSpec>& tools, const std::string& only,
                          const char* args_key) {
  Schema any = Schema::array();
  for (const ToolSpec& t : tools) {
    if (!only.empty() && only != t.name) continue;
    const Schema fn = Schema::parse(t.json)["function"];
    Schema props = Schema::object();
    props["name"] = {{"const", t.name}};
    props[args_key] = fn.contains("parameters") && !fn["parameters"].is_null()
                          ? fn["parameters"]
                          : Schema::parse(t.parameters);
    any.push_back({{"type", "object"},
                   {"properties", std::move(props)},
                   {"required", {"name", args_key}},
                   {"additionalProperties", false}});
  }
  return any.size() == 1 ? any[0] : Schema{{"anyOf", any}};
}

/// An array of one or more call objects ("arguments"); at most one unless `many`.
Schema call_array_schema(const std::vector<ToolSpec>& tools, const std::string& only, bool many) {
  Schema array = {
      {"type", "array"}, {"items", call_object_schema(tools, only, "arguments")}, {"minItems", 1}};
  if (!many) array["maxItems"] = 1;
  return array;
}

/// Lark rules for `name`: `text` (a terminal) up to the first `marker`, which may also come as
/// its special token.
std::string trigger_rules(const std::string& name, const char* text, const std::string& marker,
                          const std::vector<std::pair<int32_t, std::string>>& special) {
  const std::string lazy = "[lazy]: " + std::string(text) + " " + Schema(marker).dump() + "\n";
  for (const auto& [id, t] : special)
    if (t == marker)
      return name + ": " + name + "_text | " + text + " <[" + std::to_string(id) + "]>\n" + name +
             "_text" + lazy;
  return name + lazy;
}

/// A literal marker, or its special token.
std::string marker_literal(const std::string& marker,
                           const std::vector<std::pair<int32_t, std::string>>& special) {
  for (const auto& [id, t] : special)
    if (t == marker) return "(" + Schema(marker).dump() + " | <[" + std::to_string(id) + "]>)";
  return Schema(marker).dump();
}

}  // namespace

std::string tool_call_schema(const ApiRequest& r) {
  return call_array_schema(r.tools, r.tool_call.value_or(""), r.parallel_tool_calls).dump();
}

std::string auto_tool_grammar(ToolCallFormat f, const ApiRequest& r,
                              const std::vector<std::pair<int32_t, std::string>>& special) {
  const bool many = r.parallel_tool_calls;
  const std::vector<std::string> markers = tool_call_markers(f);
  std::string g = "%llguidance {}\n";
  // Text, then blocks (each opened by the marker) and text, or one block and white space.
  const char* blocks = many ? "start: blk* TEXT\n" : "start: TEXT | blk WS?\n";
  switch (f) {
    case ToolCallFormat::kQwen25:
      g += blocks;
      g += "blk: hd WS? call WS? " + marker_literal(markers.at(1), special) + "\n";
      g += trigger_rules("hd", "TEXT", markers.at(0), special);
      g += "call: %json " + call_object_schema(r.tools, "", "arguments").dump() + "\n";
      break;
    case ToolCallFormat::kMistral:
      g += blocks;
      g += "blk: hd WS? calls\n";
      g += trigger_rules("hd", "TEXT", markers.at(0), special);
      g += "calls: %json " + call_array_schema(r.tools, "", many).dump() + "\n";
      break;
    case ToolCallFormat::kLlama3:
      // A reply that opens with '{' (after white space) is calls; other text may reach the tag.
      g += "start: calls | TEXT_NB | hd calls\n";
      g += many ? "calls: WS? call (WS? \";\" WS? call)* WS?\n" : "calls: WS? call WS?\n";
      g += trigger_rules("hd", "TEXT_NB", markers.at(0), special);
      g += "call: %json " + call_object_schema(r.tools, "", "parameters").dump() + "\n";
      g += "TEXT_NB: /[ \\t\\r\\n]*([^{ \\t\\r\\n](.|\\n)*)?/\n";
      break;
    case ToolCallFormat::kJsonArray:
      throw Error(ErrorCode::kInternal, "auto_tool_grammar: json_array is not a parser format");
  }
  return g + "TEXT: /(.|\\n)*/\nWS: /[ \\t\\r\\n]+/\n";
}

}  // namespace pagoda::server
