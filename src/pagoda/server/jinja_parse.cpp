// Parser of the chat-template renderer: split, lexer, expressions, statements (jinja_parse.h).
#include "pagoda/server/jinja_parse.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <functional>
#include <optional>

namespace pagoda::server::jinja {

namespace {

// ---------------------------------------------------------------- lexer

enum class Tok { kName, kString, kInt, kFloat, kOp, kEnd };
struct Token {
  Tok type;
  std::string text;
  size_t pos;
};

std::vector<Token> lex_tag(std::string_view src, size_t begin, size_t end) {
  std::vector<Token> out;
  size_t p = begin;
  while (p < end) {
    const char c = src[p];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') { ++p; continue; }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t q = p;
      while (q < end && (std::isalnum(static_cast<unsigned char>(src[q])) || src[q] == '_')) ++q;
      out.push_back({Tok::kName, std::string(src.substr(p, q - p)), p});
      p = q;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t q = p;
      while (q < end && std::isdigit(static_cast<unsigned char>(src[q]))) ++q;
      bool is_float = false;
      if (q + 1 < end && src[q] == '.' && std::isdigit(static_cast<unsigned char>(src[q + 1]))) {
        is_float = true;
        ++q;
        while (q < end && std::isdigit(static_cast<unsigned char>(src[q]))) ++q;
      }
      out.push_back({is_float ? Tok::kFloat : Tok::kInt, std::string(src.substr(p, q - p)), p});
      p = q;
    } else if (c == '\'' || c == '"') {
      std::string s;
      size_t q = p + 1;
      for (; q < end && src[q] != c; ++q) {
        if (src[q] == '\\' && q + 1 < end) {
          const char e = src[++q];
          switch (e) {
            case 'n': s += '\n'; break;
            case 't': s += '\t'; break;
            case 'r': s += '\r'; break;
            case '\\': s += '\\'; break;
            case '\'': s += '\''; break;
            case '"': s += '"'; break;
            default: s += '\\'; s += e;
          }
        } else {
          s += src[q];
        }
      }
      if (q >= end) fail("unterminated string at offset " + std::to_string(p));
      out.push_back({Tok::kString, std::move(s), p});
      p = q + 1;
    } else {
      static const char* kOps[] = {"==", "!=", "<=", ">=", "//", "**", "<", ">", "+", "-", "*", "/",
                                   "%", "~", "|", ".", "[", "]", "(", ")", ",", ":", "=", "{", "}"};
      bool matched = false;
      for (const char* op : kOps) {
        const std::string_view o(op);
        if (src.substr(p, o.size()) == o && p + o.size() <= end) {
          out.push_back({Tok::kOp, std::string(o), p});
          p += o.size();
          matched = true;
          break;
        }
      }
      if (!matched) fail(std::string("unexpected character '") + c + "' at offset " + std::to_string(p));
    }
  }
  out.push_back({Tok::kEnd, "", end});
  return out;
}


class ExprParser {
 public:
  ExprParser(std::vector<Token> toks) : t_(std::move(toks)) {}
  const Token& peek(size_t k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  bool at_op(std::string_view op) const { return peek().type == Tok::kOp && peek().text == op; }
  bool at_name(std::string_view n) const { return peek().type == Tok::kName && peek().text == n; }
  bool at_end() const { return peek().type == Tok::kEnd; }
  Token next() { Token t = peek(); if (p_ < t_.size() - 1) ++p_; return t; }
  void expect_op(std::string_view op) {
    if (!at_op(op)) fail("expected '" + std::string(op) + "' at offset " + std::to_string(peek().pos));
    next();
  }
  std::string expect_name() {
    if (peek().type != Tok::kName) fail("expected a name at offset " + std::to_string(peek().pos));
    return next().text;
  }
  void expect_end() {
    if (!at_end()) fail("unexpected '" + peek().text + "' at offset " + std::to_string(peek().pos));
  }

  ExprPtr expression() {
    Guard g(depth_);
    ExprPtr e = or_expr();
    if (at_name("if")) {
      next();
      ExprPtr cond = or_expr();
      ExprPtr other;
      if (at_name("else")) { next(); other = expression(); }
      auto c = node(Expr::Type::kCond);
      c->args = {cond, e, other ? other : literal(Value())};
      return c;
    }
    return e;
  }
  // for-loop targets stop before `in`; filters are parsed without conditionals.
  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (at_name("or")) { next(); e = binary(Expr::Type::kOr, "or", e, and_expr()); }
    return e;
  }

 private:
  struct Guard {
    int& d;
    explicit Guard(int& depth) : d(depth) { if (++d > kMaxDepth) fail("expression nested too deeply"); }
    ~Guard() { --d; }
  };
  static std::shared_ptr<Expr> node(Expr::Type t) { auto e = std::make_shared<Expr>(); e->type = t; return e; }
  static ExprPtr literal(Value v) { auto e = node(Expr::Type::kLiteral); e->literal = std::move(v); return e; }
  static ExprPtr binary(Expr::Type t, std::string op, ExprPtr a, ExprPtr b) {
    auto e = node(t); e->name = std::move(op); e->args = {std::move(a), std::move(b)}; return e;
  }
  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (at_name("and")) { next(); e = binary(Expr::Type::kAnd, "and", e, not_expr()); }
    return e;
  }
  ExprPtr not_expr() {
    Guard g(depth_);
    if (at_name("not")) { next(); auto e = node(Expr::Type::kNot); e->args = {not_expr()}; return e; }
    return compare();
  }
  ExprPtr compare() {
    ExprPtr e = math1();
    for (;;) {
      if (peek().type == Tok::kOp && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                      peek().text == ">" || peek().text == "<=" || peek().text == ">=")) {
        const std::string op = next().text;
        e = binary(Expr::Type::kBinary, op, e, math1());
      } else if (at_name("in")) {
        next();
        e = binary(Expr::Type::kBinary, "in", e, math1());
      } else if (at_name("not") && peek(1).type == Tok::kName && peek(1).text == "in") {
        next(); next();
        e = binary(Expr::Type::kBinary, "not in", e, math1());
      } else {
        return e;
      }
    }
  }
  ExprPtr math1() {
    ExprPtr e = concat();
    while (at_op("+") || at_op("-")) { const std::string op = next().text; e = binary(Expr::Type::kBinary, op, e, concat()); }
    return e;
  }
  ExprPtr concat() {
    ExprPtr e = math2();
    while (at_op("~")) { next(); e = binary(Expr::Type::kBinary, "~", e, math2()); }
    return e;
  }
  ExprPtr math2() {
    ExprPtr e = unary();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const std::string op = next().text;
      e = binary(Expr::Type::kBinary, op, e, unary());
    }
    return e;
  }
  ExprPtr unary() {
    Guard g(depth_);
    if (at_op("-")) { next(); auto e = node(Expr::Type::kUnary); e->name = "-"; e->args = {unary()}; return filters(e); }
    if (at_op("+")) { next(); return unary(); }
    return filters(postfix(primary()));
  }
  void call_args(Expr& e) {
    expect_op("(");
    while (!at_op(")")) {
      if (peek().type == Tok::kName && peek(1).type == Tok::kOp && peek(1).text == "=") {
        std::string k = next().text;
        next();
        e.kwargs.emplace_back(std::move(k), expression());
      } else {
        e.args.push_back(expression());
      }
      if (!at_op(")")) expect_op(",");
    }
    expect_op(")");
  }
  ExprPtr filters(ExprPtr e) {
    for (;;) {
      if (at_op("|")) {
        next();
        auto f = node(Expr::Type::kFilter);
        f->name = expect_name();
        f->args = {e};
        if (at_op("(")) call_args(*f);
        e = postfix(f);
      } else if (at_name("is")) {
        next();
        auto t = node(Expr::Type::kTest);
        if (at_name("not")) { next(); t->negate = true; }
        t->name = expect_name();
        t->args = {e};
        if (at_op("(")) call_args(*t);
        else if (peek().type == Tok::kString || peek().type == Tok::kInt || peek().type == Tok::kFloat ||
                 (peek().type == Tok::kName && !at_name("and") && !at_name("or") && !at_name("else") &&
                  !at_name("if") && !at_name("is") && !at_name("in") && !at_name("not")))
          t->args.push_back(postfix(primary()));
        e = t;
      } else {
        return e;
      }
    }
  }
  ExprPtr postfix(ExprPtr e) {
    for (;;) {
      if (at_op(".")) {
        next();
        auto a = node(Expr::Type::kAttr);
        a->name = expect_name();
        a->args = {e};
        e = a;
      } else if (at_op("[")) {
        next();
        ExprPtr lo, hi;
        if (!at_op(":")) lo = expression();
        if (at_op(":")) {
          next();
          if (!at_op("]")) hi = expression();
          auto s = node(Expr::Type::kSlice);
          s->args = {e, lo ? lo : literal(Value()), hi ? hi : literal(Value())};
          e = s;
        } else {
          if (!lo) fail("empty subscript at offset " + std::to_string(peek().pos));
          auto ix = node(Expr::Type::kIndex);
          ix->args = {e, lo};
          e = ix;
        }
        expect_op("]");
      } else if (at_op("(")) {
        auto c = node(Expr::Type::kCall);
        c->args = {e};
        call_args(*c);
        e = c;
      } else {
        return e;
      }
    }
  }
  ExprPtr primary() {
    Guard g(depth_);
    const Token t = next();
    switch (t.type) {
      case Tok::kString: {
        std::string s = t.text;
        while (peek().type == Tok::kString) s += next().text;  // adjacent literals concatenate
        return literal(Value::str(std::move(s)));
      }
      case Tok::kInt:
        try { return literal(Value::integer(std::stoll(t.text))); }
        catch (const std::exception&) { fail("integer literal out of range at offset " + std::to_string(t.pos)); }
      case Tok::kFloat: return literal(Value::real(std::strtod(t.text.c_str(), nullptr)));
      case Tok::kName: {
        if (t.text == "true" || t.text == "True") return literal(Value::boolean(true));
        if (t.text == "false" || t.text == "False") return literal(Value::boolean(false));
        if (t.text == "none" || t.text == "None") return literal(Value::none());
        auto n = node(Expr::Type::kName);
        n->name = t.text;
        return n;
      }
      case Tok::kOp:
        if (t.text == "(") {
          ExprPtr e = expression();
          if (at_op(",")) {  // tuple: evaluated as a list
            auto l = node(Expr::Type::kList);
            l->args.push_back(e);
            while (at_op(",")) { next(); if (at_op(")")) break; l->args.push_back(expression()); }
            e = l;
          }
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          auto l = node(Expr::Type::kList);
          while (!at_op("]")) { l->args.push_back(expression()); if (!at_op("]")) expect_op(","); }
          next();
          return l;
        }
        if (t.text == "{") {
          auto d = node(Expr::Type::kDict);
          while (!at_op("}")) {
            d->args.push_back(expression());
            expect_op(":");
            d->args.push_back(expression());
            if (!at_op("}")) expect_op(",");
          }
          next();
          return d;
        }
        break;
      case Tok::kEnd: fail("unexpected end of expression at offset " + std::to_string(t.pos));
    }
    fail("unexpected '" + t.text + "' at offset " + std::to_string(t.pos));
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int depth_ = 0;
};

struct Tag {  // one piece of the source: text, or a tag's tokens
  enum class Kind { kText, kOutput, kStmt } kind;
  std::string text;
  std::vector<Token> tokens;
  size_t pos;
};

std::vector<Tag> split(std::string_view src) {
  std::vector<Tag> out;
  size_t p = 0;
  bool strip_next = false;  // `-%}` / `-}}` or trim_blocks after a block
  bool trim_newline = false;
  while (p <= src.size()) {
    size_t open = src.find('{', p);
    while (open != std::string_view::npos && open + 1 < src.size() && src[open + 1] != '{' &&
           src[open + 1] != '%' && src[open + 1] != '#')
      open = src.find('{', open + 1);
    if (open != std::string_view::npos && open + 1 >= src.size()) open = std::string_view::npos;
    std::string text(src.substr(p, open == std::string_view::npos ? std::string_view::npos : open - p));
    bool piece_starts_line = p == 0 || src[p - 1] == '\n';
    if (strip_next) {
      size_t k = 0;
      while (k < text.size() && std::isspace(static_cast<unsigned char>(text[k]))) ++k;
      text.erase(0, k);
    } else if (trim_newline && !text.empty() && text[0] == '\n') {
      text.erase(0, 1);
      piece_starts_line = true;
    } else if (trim_newline && text.size() >= 2 && text[0] == '\r' && text[1] == '\n') {
      text.erase(0, 2);
      piece_starts_line = true;
    }
    if (open == std::string_view::npos) {
      if (!text.empty()) out.push_back({Tag::Kind::kText, std::move(text), {}, p});
      break;
    }
    const char kind = src[open + 1];
    const bool minus_left = open + 2 < src.size() && src[open + 2] == '-';
    const bool plus_left = open + 2 < src.size() && src[open + 2] == '+';
    if (minus_left) {
      while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    } else if (kind != '{' && !plus_left) {  // lstrip_blocks: blanks from the line start
      size_t k = text.size();
      while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t')) --k;
      // The blanks begin a line when a newline precedes them in this piece, or the piece itself
      // starts a line (the source start, right after a newline, or after a trimmed newline).
      const bool starts_line = k > 0 ? text[k - 1] == '\n' : piece_starts_line;
      if (starts_line) text.erase(k);
    }
    if (!text.empty()) out.push_back({Tag::Kind::kText, std::move(text), {}, p});
    const std::string close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    const size_t inner = open + 2 + ((minus_left || plus_left) ? 1 : 0);
    size_t end = src.find(close, inner);
    if (kind == '#') {
      if (end == std::string_view::npos) fail("unterminated comment at offset " + std::to_string(open));
    } else {
      // The closing delimiter is the first one outside string literals.
      size_t q = inner;
      char quote = 0;
      end = std::string_view::npos;
      for (; q + 1 < src.size(); ++q) {
        if (quote) {
          if (src[q] == '\\') ++q;
          else if (src[q] == quote) quote = 0;
        } else if (src[q] == '\'' || src[q] == '"') {
          quote = src[q];
        } else if (src.compare(q, 2, close) == 0) {
          end = q;
          break;
        }
      }
      if (end == std::string_view::npos) fail("unterminated tag at offset " + std::to_string(open));
    }
    const bool minus_right = end > inner && src[end - 1] == '-';
    const size_t inner_end = minus_right ? end - 1 : end;
    if (kind != '#')
      out.push_back({kind == '{' ? Tag::Kind::kOutput : Tag::Kind::kStmt, {},
                     lex_tag(src, inner, inner_end), open});
    strip_next = minus_right;
    trim_newline = kind != '{';
    p = end + 2;
    if (p > src.size()) break;
  }
  return out;
}

class StmtParser {
 public:
  explicit StmtParser(std::vector<Tag> tags) : tags_(std::move(tags)) {}

  std::vector<NodePtr> parse_body(std::initializer_list<std::string_view> enders, std::string* ended_by) {
    if (++depth_ > kMaxDepth) fail("blocks nested too deeply");
    std::vector<NodePtr> body;
    while (i_ < tags_.size()) {
      Tag& tag = tags_[i_];
      if (tag.kind == Tag::Kind::kText) {
        auto n = std::make_shared<Node>();
        n->type = Node::Type::kText;
        n->text = std::move(tag.text);
        body.push_back(n);
        ++i_;
        continue;
      }
      ExprParser p(tag.tokens);
      if (tag.kind == Tag::Kind::kOutput) {
        auto n = std::make_shared<Node>();
        n->type = Node::Type::kOutput;
        n->expr = p.expression();
        p.expect_end();
        body.push_back(n);
        ++i_;
        continue;
      }
      if (p.peek().type != Tok::kName) fail("expected a statement at offset " + std::to_string(tag.pos));
      const std::string kw = p.peek().text;
      for (std::string_view e : enders)
        if (kw == e) {
          *ended_by = kw;
          --depth_;
          return body;
        }
      ++i_;
      p.next();
      if (kw == "if") {
        body.push_back(parse_if(p));
      } else if (kw == "for") {
        body.push_back(parse_for(p));
      } else if (kw == "set") {
        auto n = std::make_shared<Node>();
        n->type = Node::Type::kSet;
        n->targets.push_back(p.expect_name());
        if (p.at_op(".")) { p.next(); n->targets.push_back(p.expect_name()); }
        if (!p.at_op("=")) fail("block `set` is not supported (offset " + std::to_string(tag.pos) + ")");
        p.next();
        n->expr = p.expression();
        p.expect_end();
        body.push_back(n);
      } else {
        fail("unsupported statement '" + kw + "' at offset " + std::to_string(tag.pos));
      }
    }
    if (enders.size() != 0) fail("missing end tag: expected " + std::string(*enders.begin()));
    --depth_;
    return body;
  }

 private:
  // The tokens of the tag that ended a body (after its keyword).
  ExprParser end_tag() {
    ExprParser p(tags_[i_].tokens);
    ++i_;
    p.next();
    return p;
  }
  NodePtr parse_if(ExprParser& p) {
    auto n = std::make_shared<Node>();
    n->type = Node::Type::kIf;
    ExprPtr cond = p.expression();
    p.expect_end();
    for (;;) {
      std::string ended;
      auto body = parse_body({"elif", "else", "endif"}, &ended);
      n->branches.emplace_back(cond, std::move(body));
      ExprParser q = end_tag();
      if (ended == "endif") { q.expect_end(); return n; }
      if (ended == "else") {
        q.expect_end();
        std::string e2;
        auto else_body = parse_body({"endif"}, &e2);
        end_tag().expect_end();
        n->branches.emplace_back(nullptr, std::move(else_body));
        return n;
      }
      cond = q.expression();
      q.expect_end();
    }
  }
  NodePtr parse_for(ExprParser& p) {
    auto n = std::make_shared<Node>();
    n->type = Node::Type::kFor;
    n->targets.push_back(p.expect_name());
    while (p.at_op(",")) { p.next(); n->targets.push_back(p.expect_name()); }
    if (!p.at_name("in")) fail("expected 'in' in for loop");
    p.next();
    n->expr = p.or_expr();
    if (p.at_name("if")) { p.next(); n->filter = p.or_expr(); }
    if (p.at_name("recursive")) fail("recursive loops are not supported");
    p.expect_end();
    std::string ended;
    n->body = parse_body({"else", "endfor"}, &ended);
    end_tag().expect_end();
    if (ended == "else") {
      std::string e2;
      n->else_body = parse_body({"endfor"}, &e2);
      end_tag().expect_end();
    }
    return n;
  }

  std::vector<Tag> tags_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

std::vector<NodePtr> parse_template(std::string_view source) {
  StmtParser parser(split(source));
  std::string ended;
  return parser.parse_body({}, &ended);
}

}  // namespace pagoda::server::jinja
