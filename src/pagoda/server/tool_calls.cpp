#include "pagoda/server/tool_calls.h"

namespace pagoda::server {

using json = nlohmann::json;

std::string tool_call_schema(const ApiRequest& r) {
  json any = json::array();
  for (const ToolSpec& t : r.tools) {
    if (r.tool_call.has_value() && !r.tool_call->empty() && *r.tool_call != t.name) continue;
    any.push_back({{"type", "object"},
                   {"properties",
                    {{"name", {{"const", t.name}}}, {"arguments", json::parse(t.parameters)}}},
                   {"required", {"name", "arguments"}},
                   {"additionalProperties", false}});
  }
  return (any.size() == 1 ? any[0] : json{{"anyOf", any}}).dump();
}

std::optional<json> tool_call_entry(const std::string& text, const std::string& id) {
  const json call = json::parse(text, nullptr, false);
  if (call.is_discarded() || !call.is_object() || !call.contains("name") ||
      !call["name"].is_string() || !call.contains("arguments"))
    return std::nullopt;
  return json{{"id", id},
              {"type", "function"},
              {"function", {{"name", call["name"]}, {"arguments", call["arguments"].dump()}}}};
}

}  // namespace pagoda::server
