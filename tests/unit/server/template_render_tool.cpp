// Test tool: renders chat templates for check_chat_templates.py. Reads JSON lines
// {"template": "<file>", "context": {...}} on stdin; writes one JSON line per input:
// {"ok": true, "text": "..."} or {"ok": false, "error": "..."} (compile or render error).
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

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
      out = {{"ok", true}, {"text", t->render(in.at("context"))}};
    } catch (const pagoda::server::TemplateError& e) {
      out = {{"ok", false}, {"error", e.what()}};
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return 0;
}
