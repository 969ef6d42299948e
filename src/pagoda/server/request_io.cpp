// What every API handler of `pagoda serve` shares: authentication, Content-Type, errors, the
// served-model check, prompt encoding (text, token ids, chat template) and post-request memory
// release.
#include <httplib.h>
#include <malloc.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/server/server_state.h"

namespace pagoda::server {

namespace {
/// Requests with a body at least this large return freed heap pages to the system afterwards.
constexpr size_t kTrimAfterBodyBytes = size_t{1} << 20;
}  // namespace

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

void check_api_request(const ServerState& s, const httplib::Request& req) {
  if (!authorized(s, req)) throw unauthorized();
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

void check_model(const ServerState& s, const std::optional<std::string>& model) {
  if (model && *model != s.model_name)
    throw ApiError(404, "NotFoundError",
                   "the model '" + *model + "' does not exist (serving '" + s.model_name + "')",
                   "model");
}

void release_request_memory(const httplib::Request& req) {
  // A large body's parse freed many small blocks, which glibc keeps in this thread's arena:
  // hand the free pages back to the system so resident memory returns to its idle size.
  if (req.body.size() >= kTrimAfterBodyBytes) ::malloc_trim(0);
}

int64_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * 4096;
}

std::vector<int32_t> encode_chat(const ServerState& s, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt, const std::vector<ToolSpec>& tools) {
  if (!s.chat_template)
    throw ApiError(400, "invalid_request_error",
                   "this model has no chat template (start the server with --chat-template)",
                   "messages");
  using ojson = nlohmann::ordered_json;
  ojson ctx = {{"messages", template_messages(messages)},
               {"bos_token", s.bos_token},
               {"eos_token", s.eos_token},
               {"add_generation_prompt", add_generation_prompt}};
  if (!tools.empty()) {
    ctx["tools"] = ojson::array();
    for (const ToolSpec& t : tools) ctx["tools"].push_back(ojson::parse(t.json));
  }
  std::string text;
  try {
    text = s.chat_template->render(ctx);
  } catch (const TemplateError& e) {
    throw_invalid("messages", std::string("chat template: ") + e.what());
  }
  try {
    return s.tokenizer->encode(text, s.chat_add_special);
  } catch (const Error& e) {  // the tokenizer refused the text (e.g. invalid UTF-8)
    throw_invalid("messages", e.what());
  }
}

std::vector<int32_t> encode_prompt(const ServerState& s, const PromptInput& p,
                                   const std::string& field, bool add_special) {
  if (!p.text) {
    for (size_t i = 0; i < p.ids.size(); ++i)
      if (p.ids[i] >= s.vocab_size)
        throw_invalid(field, "token id " + std::to_string(p.ids[i]) + " at index " +
                                 std::to_string(i) + " is outside the vocabulary (" +
                                 std::to_string(s.vocab_size) + ")");
    return p.ids;
  }
  try {
    return s.tokenizer->encode(*p.text, add_special);
  } catch (const Error& e) {
    throw_invalid(field, e.what());
  }
}

void check_prompt_length(const ServerState& s, const std::vector<int32_t>& ids,
                         const std::string& field) {
  if (ids.empty()) throw_invalid(field, "the prompt has no tokens");
  const auto n = static_cast<int64_t>(ids.size());
  if (n >= s.max_context_len || n > s.pool_tokens)
    throw ApiError(413, "context_length_exceeded",
                   "the prompt has " + std::to_string(n) + " tokens; this model's context is " +
                       std::to_string(s.max_context_len) +
                       " tokens and one must be left for the output",
                   field);
}

}  // namespace pagoda::server
