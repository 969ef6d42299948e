// Test tool: renders chat templates for check_chat_templates.py. Reads JSON lines
// {"template": "<file>", "context": {...}} on stdin, or {"template", "chat": <a chat request
// body>, "context": {bos_token, eos_token, add_generation_prompt}} (the request parsed as the
// server parses it, its messages and tools added to the context as the server adds them);
// writes one JSON line per input: {"ok": true, "text": "..."} or {"ok": false, "error": "..."}
// (compile or render error).
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "pagoda/server/api_request.h"
#include "pagoda/server/chat_template.h"

int main() {
  std::map<std::string, std::shared_ptr<pagoda::server::ChatTemplate>> cache;
  for (std::string line; std::getline(std::cin, line);) {
    if (line.empty()) continue;
    const nlohmann::ordered_json in = nlohmann::ordered_json::parse(line);
    nlohmann::json out;
    try {
      const std::string path = in.at("template").get<std::string>();
      auto& t = cache[path];
      if (!t) {
        std::ifstream f(path, std::ios::binary);
        std::stringstream ss;
        ss << f.rdbuf();
        t = std::make_shared<pagoda::server::ChatTemplate>(ss.str());
      }
      nlohmann::ordered_json ctx = in.at("context");
      if (in.contains("chat")) {
        const pagoda::server::ApiRequest r =
            pagoda::server::parse_api_request(in["chat"].dump(), pagoda::server::Endpoint::kChat);
        ctx["messages"] = pagoda::server::template_messages(r.messages);
        for (const pagoda::server::ToolSpec& tool : r.tools)
          ctx["tools"].push_back(nlohmann::ordered_json::parse(tool.json));
      }
      out = {{"ok", true}, {"text", t->render(ctx)}};
    } catch (const pagoda::server::TemplateError& e) {
      out = {{"ok", false}, {"error", e.what()}};
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return 0;
}
