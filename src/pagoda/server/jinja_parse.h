#pragma once
/// Parser of the chat-template renderer (a Jinja2 subset; see chat_template.h): the source is
/// split into text and tags (whitespace control `-`, trim_blocks / lstrip_blocks as
/// transformers sets them), tags are lexed, expressions parsed by recursive descent into Expr
/// trees and statements into ChatTemplate::Node trees. Internal to pagoda_server_core.
/// Syntax errors are TemplateErrors with the byte offset; nesting is bounded (kMaxDepth).

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pagoda/server/chat_template.h"
#include "pagoda/server/jinja_value.h"

namespace pagoda::server {
namespace jinja {

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;
struct Expr {
  enum class Type { kLiteral, kName, kList, kDict, kAttr, kIndex, kSlice, kCall, kFilter, kTest,
                    kUnary, kBinary, kCond, kAnd, kOr, kNot } type;
  Value literal;
  std::string name;             // name, attribute, operator, filter or test
  std::vector<ExprPtr> args;    // operands / positional args (args[0] = subject)
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negate = false;          // `is not`
};

}  // namespace jinja

struct ChatTemplate::Node {
  enum class Type { kText, kOutput, kIf, kFor, kSet, kBlock } type = Type::kBlock;
  std::string text;
  jinja::ExprPtr expr;                                       // output / set value / for iterable
  std::vector<std::pair<jinja::ExprPtr, std::vector<std::shared_ptr<const Node>>>> branches;  // if
  std::vector<std::shared_ptr<const Node>> body, else_body;  // for / block
  std::vector<std::string> targets;                   // for targets; set: name [, attr]
  jinja::ExprPtr filter;                                     // for ... if filter
};

namespace jinja {

using Node = ChatTemplate::Node;
using NodePtr = std::shared_ptr<const Node>;

/// The top-level statements of `source`. Throws TemplateError.
std::vector<NodePtr> parse_template(std::string_view source);

}  // namespace jinja
}  // namespace pagoda::server
