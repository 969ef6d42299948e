// POST /v1/tokenize and /v1/detokenize: the served model's tokenizer (and chat template) over
// HTTP, encoding exactly as the completion endpoints do.
#include <httplib.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/server/server_state.h"

namespace pagoda::server {

using nlohmann::json;

void handle_tokenize(ServerState& s, const httplib::Request& req, httplib::Response& res) {
  try {
    check_api_request(s, req);
    const TokenizeRequest r = parse_tokenize_request(req.body);
    check_model(s, r.model);
    const std::vector<int32_t> ids =
        r.prompt ? encode_prompt(s, PromptInput{r.prompt, {}}, "prompt", r.add_special_tokens)
                 : encode_chat(s, r.messages, r.add_generation_prompt);
    const json out = {{"tokens", ids},
                      {"count", ids.size()},
                      {"max_model_len", s.max_context_len}};
    res.set_content(out.dump(), "application/json");
  } catch (const ApiError& e) {
    set_error(res, e);
  }
  release_request_memory(req);
}

void handle_detokenize(ServerState& s, const httplib::Request& req, httplib::Response& res) {
  try {
    check_api_request(s, req);
    const DetokenizeRequest r = parse_detokenize_request(req.body);
    check_model(s, r.model);
    encode_prompt(s, PromptInput{std::nullopt, r.tokens}, "tokens", false);  // vocabulary check
    const std::string text = client_text(s.tokenizer->decode(r.tokens, false));
    res.set_content(json{{"prompt", text}}.dump(), "application/json");
  } catch (const ApiError& e) {
    set_error(res, e);
  }
  release_request_memory(req);
}

}  // namespace pagoda::server
