#pragma once
/// ChatTemplate: renders Hugging Face chat templates (the `chat_template` of
/// tokenizer_config.json) with a Jinja2 subset, the way transformers' apply_chat_template does
/// (trim_blocks and lstrip_blocks on, `raise_exception`, `tojson` without key sorting).
///
/// Supported: text, {{ }}, {% %}, {# #}, whitespace control (-), if/elif/else, for (with `if`
/// filter, tuple targets, else, loop.index/index0/first/last/length/revindex), set (also
/// `ns.attr`), namespace(), range(), literals (str, int, float, bool, none, list, dict),
/// operators (or and not, == != < <= > >=, in / not in, is [not] test, + - * / // % ~, unary -,
/// conditional expressions, . [] slices and calls), filters (trim length count upper lower
/// capitalize title default/d tojson string int float list first last join replace items
/// selectattr/rejectattr with equalto), str/dict methods (strip lstrip rstrip split startswith
/// endswith upper lower replace title items keys values get), tests (defined undefined none
/// string number integer float boolean mapping sequence iterable true false even odd eq).
/// Anything else is a TemplateError naming it: at compile time for unknown syntax, at render
/// time for unknown names called, filters or tests. Rendering is bounded (output size, loop
/// iterations, nesting depth) so hostile templates end in a TemplateError, never a hang.
/// A compiled template is immutable; render() is const and thread safe.

#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace pagoda::server {

struct TemplateError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class ChatTemplate {
 public:
  /// Parses `source`. Throws TemplateError on a syntax error (with the byte offset).
  explicit ChatTemplate(std::string_view source);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  /// Renders with the variables of `context` (a JSON object, keys in insertion order as tojson
  /// writes them: messages, bos_token, eos_token,
  /// add_generation_prompt, ...). Throws TemplateError (raise_exception's message, a type error,
  /// an unsupported feature, or a limit).
  std::string render(const nlohmann::ordered_json& context) const;

  struct Node;

 private:
  std::shared_ptr<const Node> root_;
};

/// The chat template of the built-in model: "<|role|>\ncontent\n" per message, then
/// "<|assistant|>\n" when add_generation_prompt.
std::string_view builtin_chat_template();

}  // namespace pagoda::server
