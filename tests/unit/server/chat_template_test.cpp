// Chat template renderer: the built-in template, errors at compile and render time, and the
// limits that bound hostile templates. (Equality with jinja2 is check_chat_templates.py.)
#include <gtest/gtest.h>

#include <string>

#include "pagoda/server/chat_template.h"

namespace pagoda::server {
namespace {

using json = nlohmann::ordered_json;

json chat(bool gen) {
  return {{"messages", json::array({json{{"role", "user"}, {"content", "hi"}},
                                    json{{"role", "assistant"}, {"content", "yo"}}})},
          {"add_generation_prompt", gen}};
}

TEST(ChatTemplate, BuiltinTemplate) {
  const ChatTemplate t(builtin_chat_template());
  EXPECT_EQ(t.render(chat(true)), "<|user|>\nhi\n<|assistant|>\nyo\n<|assistant|>\n");
  EXPECT_EQ(t.render(chat(false)), "<|user|>\nhi\n<|assistant|>\nyo\n");
}

TEST(ChatTemplate, WhitespaceControlAndScopes) {
  // trim_blocks + lstrip_blocks, `-` control, and `set` inside a loop not leaking out.
  const ChatTemplate t("{% set x = 'outer' %}\n  {% for m in messages %}\n{% set x = m.role %}"
                       "[{{ x }}]  {{- ' ' -}}  |\n{% endfor %}\n{{ x }}");
  EXPECT_EQ(t.render(chat(false)), "[user] |\n[assistant] |\nouter");
}

TEST(ChatTemplate, ErrorsAreTemplateErrors) {
  EXPECT_THROW(ChatTemplate("{% if x %}"), TemplateError);
  EXPECT_THROW(ChatTemplate("{{ x "), TemplateError);
  EXPECT_THROW(ChatTemplate("{% macro m() %}{% endmacro %}"), TemplateError);
  EXPECT_THROW(ChatTemplate("{{ 'a' }"), TemplateError);
  try {
    ChatTemplate("{{ raise_exception('roles must alternate') }}").render(json::object());
    FAIL();
  } catch (const TemplateError& e) {
    EXPECT_STREQ(e.what(), "roles must alternate");
  }
  EXPECT_THROW(ChatTemplate("{{ x | no_such_filter }}").render(json::object()), TemplateError);
  EXPECT_THROW(ChatTemplate("{{ 'a' + 1 }}").render(json::object()), TemplateError);
  EXPECT_THROW(ChatTemplate("{{ 1 // 0 }}").render(json::object()), TemplateError);
}

TEST(ChatTemplate, HostileTemplatesHitALimit) {
  EXPECT_THROW(ChatTemplate("{% for i in range(100000) %}{% for j in range(100000) %}"
                            "{% endfor %}{% endfor %}")
                   .render(json::object()),
               TemplateError);
  EXPECT_THROW(ChatTemplate("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"),
               TemplateError);
  EXPECT_THROW(ChatTemplate("{% set ns = namespace(s='abcdefgh') %}{% for i in range(40) %}"
                            "{% set ns.s = ns.s ~ ns.s %}{% endfor %}")
                   .render(json::object()),
               TemplateError);
  std::string nested;
  for (int i = 0; i < 1000; ++i) nested += "{% if true %}";
  EXPECT_THROW(ChatTemplate{nested}, TemplateError);
}

}  // namespace
}  // namespace pagoda::server
