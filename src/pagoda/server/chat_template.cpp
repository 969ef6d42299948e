// A Jinja2 subset for chat templates: lexer, recursive-descent parser, tree-walking renderer.
#include "pagoda/server/chat_template.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <variant>
#include <vector>

namespace pagoda::server {

namespace {

constexpr size_t kMaxOutput = 1 << 20;       // bytes of rendered text or of any string value
constexpr int64_t kMaxIterations = 1 << 20;  // loop iterations per render
constexpr int kMaxDepth = 200;               // nesting of expressions and blocks

[[noreturn]] void fail(const std::string& msg) { throw TemplateError(msg); }

// Strings are UTF-8; like Python's str, lengths, indices, slices and iteration count code
// points (a byte that starts no valid sequence counts as one).
std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + n > s.size()) n = 1;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) n = 1;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

uint32_t decode_cp(const std::string& cp) {
  const auto c0 = static_cast<unsigned char>(cp[0]);
  if (cp.size() == 1) return c0;
  uint32_t v = c0 & (0x7F >> cp.size());
  for (size_t k = 1; k < cp.size(); ++k) v = (v << 6) | (static_cast<unsigned char>(cp[k]) & 0x3F);
  return v;
}

/// Python's str.isspace() for one code point.
bool py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

// ---------------------------------------------------------------- values

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, like Python

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace };
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;  // dicts and namespaces (mutable through `set ns.x`)

  static Value none() { Value v; v.kind = Kind::kNone; return v; }
  static Value boolean(bool x) { Value v; v.kind = Kind::kBool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.kind = Kind::kInt; v.i = x; return v; }
  static Value real(double x) { Value v; v.kind = Kind::kFloat; v.f = x; return v; }
  static Value str(std::string x) {
    if (x.size() > kMaxOutput) fail("string longer than the renderer's limit");
    Value v; v.kind = Kind::kString; v.s = std::move(x); return v;
  }
  static Value make_list(List x) {
    Value v; v.kind = Kind::kList; v.list = std::make_shared<List>(std::move(x)); return v;
  }
  static Value make_dict(Dict x, Kind k = Kind::kDict) {
    Value v; v.kind = k; v.dict = std::make_shared<Dict>(std::move(x)); return v;
  }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat; }
  double num() const { return kind == Kind::kInt ? static_cast<double>(i) : f; }
  const Value* get(std::string_view key) const {
    if (!dict) return nullptr;
    for (const auto& [k, v] : *dict)
      if (k == key) return &v;
    return nullptr;
  }
};
using K = Value::Kind;

const char* kind_name(K k) {
  switch (k) {
    case K::kUndefined: return "undefined";
    case K::kNone: return "none";
    case K::kBool: return "bool";
    case K::kInt: return "int";
    case K::kFloat: return "float";
    case K::kString: return "string";
    case K::kList: return "list";
    case K::kDict: return "dict";
    case K::kNamespace: return "namespace";
  }
  return "?";
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value::integer(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value::real(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      for (const auto& x : j) l.push_back(from_json(x));
      return Value::make_list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.emplace_back(it.key(), from_json(it.value()));
      return Value::make_dict(std::move(d));
    }
    default: return Value::none();
  }
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case K::kUndefined: case K::kNone: return false;
    case K::kBool: return v.b;
    case K::kInt: return v.i != 0;
    case K::kFloat: return v.f != 0;
    case K::kString: return !v.s.empty();
    case K::kList: return !v.list->empty();
    case K::kDict: return !v.dict->empty();
    case K::kNamespace: return true;
  }
  return false;
}

std::string py_float(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {  // shortest repr that round-trips, like Python
    std::snprintf(buf, sizeof buf, "%.*g", prec, f);
    if (std::strtod(buf, nullptr) == f) break;
  }
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string py_repr_str(const std::string& s) {
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == q || c == '\\') out += '\\';
    if (c == '\n') { out += "\\n"; continue; }
    if (c == '\t') { out += "\\t"; continue; }
    out += c;
  }
  return out + q;
}

std::string to_string(const Value& v, bool repr = false) {
  switch (v.kind) {
    case K::kUndefined: return "";
    case K::kNone: return "None";
    case K::kBool: return v.b ? "True" : "False";
    case K::kInt: return std::to_string(v.i);
    case K::kFloat: return py_float(v.f);
    case K::kString: return repr ? py_repr_str(v.s) : v.s;
    case K::kList: {
      std::string out = "[";
      for (size_t n = 0; n < v.list->size(); ++n) out += (n ? ", " : "") + to_string((*v.list)[n], true);
      return out + "]";
    }
    case K::kDict: {
      std::string out = "{";
      size_t n = 0;
      for (const auto& [k, x] : *v.dict) out += (n++ ? ", " : "") + py_repr_str(k) + ": " + to_string(x, true);
      return out + "}";
    }
    case K::kNamespace: return "<Namespace>";
  }
  return "";
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

// json.dumps(v, ensure_ascii=False) with Python's default separators, or `indent`.
void to_json(std::string& out, const Value& v, int indent, int level) {
  auto newline = [&](int l) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * l), ' ');
  };
  const char* item_sep = indent < 0 ? ", " : ",";
  if (out.size() > kMaxOutput) fail("tojson output longer than the renderer's limit");
  switch (v.kind) {
    case K::kUndefined: case K::kNone: out += "null"; return;
    case K::kBool: out += v.b ? "true" : "false"; return;
    case K::kInt: out += std::to_string(v.i); return;
    case K::kFloat: out += std::isfinite(v.f) ? py_float(v.f) : (std::isnan(v.f) ? "NaN" : (v.f > 0 ? "Infinity" : "-Infinity")); return;
    case K::kString: json_string(out, v.s); return;
    case K::kList:
      if (v.list->empty()) { out += "[]"; return; }
      out += '[';
      for (size_t n = 0; n < v.list->size(); ++n) {
        if (n) out += item_sep;
        newline(level + 1);
        to_json(out, (*v.list)[n], indent, level + 1);
      }
      newline(level);
      out += ']';
      return;
    case K::kDict: case K::kNamespace:
      if (v.dict->empty()) { out += "{}"; return; }
      out += '{';
      for (size_t n = 0; n < v.dict->size(); ++n) {
        if (n) out += item_sep;
        newline(level + 1);
        json_string(out, (*v.dict)[n].first);
        out += ": ";
        to_json(out, (*v.dict)[n].second, indent, level + 1);
      }
      newline(level);
      out += '}';
      return;
  }
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.num() == b.num();
  if (a.is_number() && b.kind == K::kBool) return a.num() == (b.b ? 1 : 0);
  if (b.is_number() && a.kind == K::kBool) return b.num() == (a.b ? 1 : 0);
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::kUndefined: case K::kNone: return true;
    case K::kBool: return a.b == b.b;
    case K::kString: return a.s == b.s;
    case K::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t n = 0; n < a.list->size(); ++n)
        if (!equal((*a.list)[n], (*b.list)[n])) return false;
      return true;
    case K::kDict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, x] : *a.dict) {
        const Value* y = b.get(k);
        if (!y || !equal(x, *y)) return false;
      }
      return true;
    default: return a.dict == b.dict;
  }
}

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

// ---------------------------------------------------------------- expressions

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

}  // namespace

// ---------------------------------------------------------------- statements

struct ChatTemplate::Node {
  enum class Type { kText, kOutput, kIf, kFor, kSet, kBlock } type = Type::kBlock;
  std::string text;
  ExprPtr expr;                                       // output / set value / for iterable
  std::vector<std::pair<ExprPtr, std::vector<std::shared_ptr<const Node>>>> branches;  // if
  std::vector<std::shared_ptr<const Node>> body, else_body;  // for / block
  std::vector<std::string> targets;                   // for targets; set: name [, attr]
  ExprPtr filter;                                     // for ... if filter
};

namespace {

using Node = ChatTemplate::Node;
using NodePtr = std::shared_ptr<const Node>;

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

// ---------------------------------------------------------------- rendering

class Renderer {
 public:
  explicit Renderer(const nlohmann::ordered_json& context) {
    scopes_.emplace_back();
    if (context.is_object())
      for (auto it = context.begin(); it != context.end(); ++it) scopes_[0][it.key()] = from_json(it.value());
  }
  std::string out;

  void run(const std::vector<NodePtr>& body) {
    for (const NodePtr& n : body) exec(*n);
  }

 private:
  void emit(const std::string& s) {
    out += s;
    if (out.size() > kMaxOutput) fail("rendered text longer than the renderer's limit");
  }
  void exec(const Node& n) {
    switch (n.type) {
      case Node::Type::kText: emit(n.text); return;
      case Node::Type::kOutput: emit(to_string(eval(*n.expr))); return;
      case Node::Type::kBlock: run(n.body); return;
      case Node::Type::kSet: {
        Value v = eval(*n.expr);
        if (n.targets.size() == 1) { scopes_.back()[n.targets[0]] = std::move(v); return; }
        Value ns = lookup(n.targets[0]);
        if (ns.kind != K::kNamespace) fail("cannot set attribute of " + std::string(kind_name(ns.kind)) + " '" + n.targets[0] + "'");
        for (auto& [k, x] : *ns.dict)
          if (k == n.targets[1]) { x = std::move(v); return; }
        ns.dict->emplace_back(n.targets[1], std::move(v));
        return;
      }
      case Node::Type::kIf:
        for (const auto& [cond, body] : n.branches)
          if (!cond || truthy(eval(*cond))) { run(body); return; }
        return;
      case Node::Type::kFor: exec_for(n); return;
    }
  }
  void exec_for(const Node& n) {
    const Value seq = eval(*n.expr);
    List items;
    if (seq.kind == K::kList) items = *seq.list;
    else if (seq.kind == K::kDict) for (const auto& [k, v] : *seq.dict) items.push_back(Value::str(k));
    else if (seq.kind == K::kString) for (auto& cp : code_points(seq.s)) items.push_back(Value::str(cp));
    else if (seq.kind != K::kUndefined && seq.kind != K::kNone) fail(std::string("cannot iterate over ") + kind_name(seq.kind));
    else if (seq.kind == K::kNone) fail("cannot iterate over none");
    auto bind = [&](std::map<std::string, Value>& scope, const Value& item) {
      if (n.targets.size() == 1) { scope[n.targets[0]] = item; return; }
      if (item.kind != K::kList || item.list->size() != n.targets.size())
        fail("cannot unpack loop item into " + std::to_string(n.targets.size()) + " names");
      for (size_t k = 0; k < n.targets.size(); ++k) scope[n.targets[k]] = (*item.list)[k];
    };
    if (n.filter) {
      List kept;
      for (const Value& item : items) {
        scopes_.emplace_back();
        bind(scopes_.back(), item);
        const bool keep = truthy(eval(*n.filter));
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      items.swap(kept);
    }
    if (items.empty()) { run(n.else_body); return; }
    const auto len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      if (++iterations_ > kMaxIterations) fail("too many loop iterations");
      scopes_.emplace_back();
      bind(scopes_.back(), items[static_cast<size_t>(k)]);
      Dict loop = {{"index", Value::integer(k + 1)}, {"index0", Value::integer(k)},
                   {"first", Value::boolean(k == 0)}, {"last", Value::boolean(k == len - 1)},
                   {"length", Value::integer(len)}, {"revindex", Value::integer(len - k)},
                   {"revindex0", Value::integer(len - k - 1)}};
      scopes_.back()["loop"] = Value::make_dict(std::move(loop));
      run(n.body);
      scopes_.pop_back();
    }
  }
  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value();
  }

  struct Depth {
    int& d;
    explicit Depth(int& depth) : d(depth) { if (++d > kMaxDepth) fail("evaluation nested too deeply"); }
    ~Depth() { --d; }
  };

  Value eval(const Expr& e) {
    Depth guard(depth_);
    using T = Expr::Type;
    switch (e.type) {
      case T::kLiteral: return e.literal;
      case T::kName: return lookup(e.name);
      case T::kList: {
        List l;
        for (const auto& a : e.args) l.push_back(eval(*a));
        return Value::make_list(std::move(l));
      }
      case T::kDict: {
        Dict d;
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          Value key = eval(*e.args[k]);
          if (key.kind != K::kString) fail("dict keys must be strings");
          d.emplace_back(key.s, eval(*e.args[k + 1]));
        }
        return Value::make_dict(std::move(d));
      }
      case T::kAttr: return attribute(eval(*e.args[0]), e.name);
      case T::kIndex: return index(eval(*e.args[0]), eval(*e.args[1]));
      case T::kSlice: return slice(eval(*e.args[0]), eval(*e.args[1]), eval(*e.args[2]));
      case T::kCall: return call(e);
      case T::kFilter: return filter(e);
      case T::kTest: {
        const bool r = test(e);
        return Value::boolean(e.negate ? !r : r);
      }
      case T::kUnary: {
        Value v = eval(*e.args[0]);
        if (v.kind == K::kInt) return Value::integer(-v.i);
        if (v.kind == K::kFloat) return Value::real(-v.f);
        fail(std::string("bad operand for unary -: ") + kind_name(v.kind));
      }
      case T::kNot: return Value::boolean(!truthy(eval(*e.args[0])));
      case T::kAnd: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? eval(*e.args[1]) : a;
      }
      case T::kOr: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? a : eval(*e.args[1]);
      }
      case T::kCond: return truthy(eval(*e.args[0])) ? eval(*e.args[1]) : eval(*e.args[2]);
      case T::kBinary: return binary(e.name, eval(*e.args[0]), eval(*e.args[1]));
    }
    fail("bad expression");
  }

  static Value attribute(const Value& v, const std::string& name) {
    if (v.kind == K::kUndefined) fail("'" + name + "' of an undefined value");
    if (v.kind == K::kDict || v.kind == K::kNamespace) {
      const Value* x = v.get(name);
      if (x) return *x;
    }
    return Value();  // methods are resolved by call(); anything else is undefined
  }
  static Value index(const Value& v, const Value& key) {
    if (v.kind == K::kUndefined) fail("subscript of an undefined value");
    if (v.kind == K::kDict || v.kind == K::kNamespace) {
      if (key.kind != K::kString) return Value();
      const Value* x = v.get(key.s);
      return x ? *x : Value();
    }
    if ((v.kind == K::kList || v.kind == K::kString) && key.kind == K::kInt) {
      std::vector<std::string> cps;
      if (v.kind == K::kString) cps = code_points(v.s);
      const auto n = static_cast<int64_t>(v.kind == K::kList ? v.list->size() : cps.size());
      int64_t k = key.i < 0 ? key.i + n : key.i;
      if (k < 0 || k >= n) return Value();
      return v.kind == K::kList ? (*v.list)[static_cast<size_t>(k)] : Value::str(cps[static_cast<size_t>(k)]);
    }
    return Value();
  }
  static Value slice(const Value& v, const Value& lo, const Value& hi) {
    if (v.kind != K::kList && v.kind != K::kString) fail(std::string("cannot slice ") + kind_name(v.kind));
    std::vector<std::string> cps;
    if (v.kind == K::kString) cps = code_points(v.s);
    const auto n = static_cast<int64_t>(v.kind == K::kList ? v.list->size() : cps.size());
    auto clamp = [&](const Value& x, int64_t dflt) {
      if (x.kind == K::kUndefined || x.kind == K::kNone) return dflt;
      if (x.kind != K::kInt) fail("slice indices must be integers");
      int64_t k = x.i < 0 ? x.i + n : x.i;
      return std::clamp<int64_t>(k, 0, n);
    };
    const int64_t a = clamp(lo, 0), b = std::max(a, clamp(hi, n));
    if (v.kind == K::kString) {
      std::string out;
      for (int64_t k = a; k < b; ++k) out += cps[static_cast<size_t>(k)];
      return Value::str(std::move(out));
    }
    return Value::make_list(List(v.list->begin() + a, v.list->begin() + b));
  }

  Value binary(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return Value::boolean(equal(a, b));
    if (op == "!=") return Value::boolean(!equal(a, b));
    if (op == "~") return Value::str(to_string(a) + to_string(b));
    if (op == "in" || op == "not in") {
      bool r = false;
      if (b.kind == K::kString) {
        if (a.kind != K::kString) fail("'in <string>' needs a string on the left");
        r = b.s.find(a.s) != std::string::npos;
      } else if (b.kind == K::kList) {
        for (const Value& x : *b.list) if (equal(a, x)) { r = true; break; }
      } else if (b.kind == K::kDict || b.kind == K::kNamespace) {
        r = a.kind == K::kString && b.get(a.s) != nullptr;
      } else {
        fail(std::string("argument of type ") + kind_name(b.kind) + " is not iterable");
      }
      return Value::boolean(op == "in" ? r : !r);
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c;
      if (a.is_number() && b.is_number()) c = a.num() < b.num() ? -1 : a.num() > b.num() ? 1 : 0;
      else if (a.kind == K::kString && b.kind == K::kString) c = a.s.compare(b.s) < 0 ? -1 : a.s == b.s ? 0 : 1;
      else fail(std::string("cannot compare ") + kind_name(a.kind) + " and " + kind_name(b.kind));
      return Value::boolean(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    if (op == "+") {
      if (a.kind == K::kString && b.kind == K::kString) return Value::str(a.s + b.s);
      if (a.kind == K::kList && b.kind == K::kList) {
        List l = *a.list;
        l.insert(l.end(), b.list->begin(), b.list->end());
        if (l.size() > kMaxOutput) fail("list longer than the renderer's limit");
        return Value::make_list(std::move(l));
      }
    }
    if (op == "*" && a.kind == K::kString && b.kind == K::kInt) {
      if (b.i > 0 && a.s.size() * static_cast<size_t>(std::min<int64_t>(b.i, kMaxOutput + 1)) > kMaxOutput)
        fail("string longer than the renderer's limit");
      std::string s;
      for (int64_t k = 0; k < b.i; ++k) s += a.s;
      return Value::str(std::move(s));
    }
    const bool na = a.is_number() || a.kind == K::kBool, nb = b.is_number() || b.kind == K::kBool;
    if (!na || !nb) fail("unsupported operand types for " + op + ": " + kind_name(a.kind) + " and " + kind_name(b.kind));
    const bool ints = a.kind != K::kFloat && b.kind != K::kFloat;
    const int64_t ia = a.kind == K::kBool ? a.b : a.i, ib = b.kind == K::kBool ? b.b : b.i;
    const double fa = a.kind == K::kBool ? a.b : a.num(), fb = b.kind == K::kBool ? b.b : b.num();
    if (op == "/") {
      if (fb == 0) fail("division by zero");
      return Value::real(fa / fb);
    }
    if (ints) {
      if (op == "+") return Value::integer(static_cast<int64_t>(static_cast<uint64_t>(ia) + static_cast<uint64_t>(ib)));
      if (op == "-") return Value::integer(static_cast<int64_t>(static_cast<uint64_t>(ia) - static_cast<uint64_t>(ib)));
      if (op == "*") return Value::integer(static_cast<int64_t>(static_cast<uint64_t>(ia) * static_cast<uint64_t>(ib)));
      if (ib == 0) fail("integer division or modulo by zero");
      if (ib == -1) return Value::integer(op == "%" ? 0 : static_cast<int64_t>(0 - static_cast<uint64_t>(ia)));
      int64_t q = ia / ib, r = ia % ib;
      if (r != 0 && ((r < 0) != (ib < 0))) { --q; r += ib; }  // Python floors
      return Value::integer(op == "%" ? r : q);
    }
    if (op == "+") return Value::real(fa + fb);
    if (op == "-") return Value::real(fa - fb);
    if (op == "*") return Value::real(fa * fb);
    if (fb == 0) fail("float division or modulo by zero");
    const double q = std::floor(fa / fb);
    return Value::real(op == "%" ? fa - q * fb : q);
  }

  std::vector<Value> args_of(const Expr& e, size_t skip) {
    std::vector<Value> v;
    for (size_t k = skip; k < e.args.size(); ++k) v.push_back(eval(*e.args[k]));
    return v;
  }
  Value kwarg(const Expr& e, const std::string& name, const std::vector<Value>& pos, size_t at) {
    for (const auto& [k, x] : e.kwargs) if (k == name) return eval(*x);
    return at < pos.size() ? pos[at] : Value();
  }

  static std::string strip_chars(const std::string& s, const Value& chars, bool left, bool right) {
    const std::vector<std::string> cps = code_points(s);
    std::vector<std::string> set;
    if (chars.kind == K::kString) set = code_points(chars.s);
    auto strip = [&](const std::string& cp) {
      return chars.kind == K::kString ? std::find(set.begin(), set.end(), cp) != set.end()
                                      : py_space(decode_cp(cp));
    };
    size_t a = 0, b = cps.size();
    if (left) while (a < b && strip(cps[a])) ++a;
    if (right) while (b > a && strip(cps[b - 1])) --b;
    std::string out;
    for (size_t k = a; k < b; ++k) out += cps[k];
    return out;
  }
  static std::string replace_all(std::string s, const std::string& from, const std::string& to) {
    if (from.empty()) fail("replace of an empty string is not supported");
    for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
      s.replace(at, from.size(), to);
      if (s.size() > kMaxOutput) fail("string longer than the renderer's limit");
    }
    return s;
  }
  static std::string title(std::string s) {
    bool start = true;
    for (char& c : s) {
      if (std::isalpha(static_cast<unsigned char>(c))) {
        c = static_cast<char>(start ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
        start = false;
      } else {
        start = true;
      }
    }
    return s;
  }
  static std::string lower(std::string s) { for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c))); return s; }
  static std::string upper(std::string s) { for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c))); return s; }
  static Value items_of(const Value& v) {
    if (v.kind != K::kDict) fail(std::string("items() of ") + kind_name(v.kind));
    List l;
    for (const auto& [k, x] : *v.dict) l.push_back(Value::make_list({Value::str(k), x}));
    return Value::make_list(std::move(l));
  }

  Value call(const Expr& e) {
    const Expr& callee = *e.args[0];
    const std::vector<Value> a = args_of(e, 1);
    if (callee.type == Expr::Type::kName) {
      if (callee.name == "raise_exception") fail(a.empty() ? "raise_exception" : to_string(a[0]));
      if (callee.name == "namespace") {
        Dict d;
        for (const auto& [k, x] : e.kwargs) d.emplace_back(k, eval(*x));
        return Value::make_dict(std::move(d), K::kNamespace);
      }
      if (callee.name == "range") {
        int64_t lo = 0, hi = 0;
        if (a.size() == 1 && a[0].kind == K::kInt) hi = a[0].i;
        else if (a.size() == 2 && a[0].kind == K::kInt && a[1].kind == K::kInt) { lo = a[0].i; hi = a[1].i; }
        else fail("range() takes one or two integers");
        if (hi - lo > kMaxIterations) fail("range() too long");
        List l;
        for (int64_t k = lo; k < hi; ++k) l.push_back(Value::integer(k));
        return Value::make_list(std::move(l));
      }
      fail("unknown function '" + callee.name + "'");
    }
    if (callee.type != Expr::Type::kAttr) fail("only functions and methods can be called");
    const Value self = eval(*callee.args[0]);
    const std::string& m = callee.name;
    if (self.kind == K::kString) {
      if (m == "strip") return Value::str(strip_chars(self.s, a.empty() ? Value() : a[0], true, true));
      if (m == "lstrip") return Value::str(strip_chars(self.s, a.empty() ? Value() : a[0], true, false));
      if (m == "rstrip") return Value::str(strip_chars(self.s, a.empty() ? Value() : a[0], false, true));
      if (m == "upper") return Value::str(upper(self.s));
      if (m == "lower") return Value::str(lower(self.s));
      if (m == "title") return Value::str(title(self.s));
      if ((m == "startswith" || m == "endswith") && a.size() == 1 && a[0].kind == K::kString) {
        const std::string& x = a[0].s;
        const bool r = x.size() <= self.s.size() &&
                       (m == "startswith" ? self.s.compare(0, x.size(), x) == 0
                                          : self.s.compare(self.s.size() - x.size(), x.size(), x) == 0);
        return Value::boolean(r);
      }
      if (m == "replace" && a.size() == 2 && a[0].kind == K::kString && a[1].kind == K::kString)
        return Value::str(replace_all(self.s, a[0].s, a[1].s));
      if (m == "split") {
        List l;
        if (a.empty() || a[0].kind == K::kNone) {
          std::string word;
          bool in_word = false;
          for (const std::string& cp : code_points(self.s)) {
            if (py_space(decode_cp(cp))) {
              if (in_word) l.push_back(Value::str(std::move(word)));
              word.clear();
              in_word = false;
            } else {
              word += cp;
              in_word = true;
            }
          }
          if (in_word) l.push_back(Value::str(std::move(word)));
        } else {
          if (a[0].kind != K::kString || a[0].s.empty()) fail("split() separator must be a non-empty string");
          size_t p = 0;
          for (size_t q; (q = self.s.find(a[0].s, p)) != std::string::npos; p = q + a[0].s.size())
            l.push_back(Value::str(self.s.substr(p, q - p)));
          l.push_back(Value::str(self.s.substr(p)));
        }
        return Value::make_list(std::move(l));
      }
    }
    if (self.kind == K::kDict) {
      if (m == "items") return items_of(self);
      if (m == "keys") { List l; for (const auto& [k, x] : *self.dict) l.push_back(Value::str(k)); return Value::make_list(std::move(l)); }
      if (m == "values") { List l; for (const auto& [k, x] : *self.dict) l.push_back(x); return Value::make_list(std::move(l)); }
      if (m == "get" && !a.empty() && a[0].kind == K::kString) {
        const Value* x = self.get(a[0].s);
        return x ? *x : (a.size() > 1 ? a[1] : Value::none());
      }
    }
    fail("unsupported method '" + m + "' of " + kind_name(self.kind));
  }

  Value filter(const Expr& e) {
    const Value v = eval(*e.args[0]);
    const std::vector<Value> a = args_of(e, 1);
    const std::string& f = e.name;
    if (f == "trim") return Value::str(strip_chars(to_string(v), a.empty() ? Value() : a[0], true, true));
    if (f == "length" || f == "count") {
      if (v.kind == K::kString) return Value::integer(static_cast<int64_t>(code_points(v.s).size()));
      if (v.kind == K::kList) return Value::integer(static_cast<int64_t>(v.list->size()));
      if (v.kind == K::kDict) return Value::integer(static_cast<int64_t>(v.dict->size()));
      fail(std::string("length of ") + kind_name(v.kind));
    }
    if (f == "upper") return Value::str(upper(to_string(v)));
    if (f == "lower") return Value::str(lower(to_string(v)));
    if (f == "title") return Value::str(title(to_string(v)));
    if (f == "capitalize") {
      std::string s = lower(to_string(v));
      if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
      return Value::str(std::move(s));
    }
    if (f == "string") return Value::str(to_string(v));
    if (f == "default" || f == "d") {
      const bool boolean = a.size() > 1 && truthy(a[1]);
      if (v.kind == K::kUndefined || (boolean && !truthy(v))) return a.empty() ? Value::str("") : a[0];
      return v;
    }
    if (f == "tojson") {
      const Value ind = kwarg(e, "indent", a, 0);
      std::string out;
      to_json(out, v, ind.kind == K::kInt ? static_cast<int>(std::clamp<int64_t>(ind.i, 0, 16)) : -1, 0);
      return Value::str(std::move(out));
    }
    if (f == "int") {
      if (v.kind == K::kInt) return v;
      if (v.kind == K::kFloat) return Value::integer(static_cast<int64_t>(std::clamp(v.f, -9e18, 9e18)));
      if (v.kind == K::kBool) return Value::integer(v.b);
      if (v.kind == K::kString) { try { return Value::integer(std::stoll(v.s)); } catch (const std::exception&) { return Value::integer(0); } }
      return Value::integer(0);
    }
    if (f == "float") {
      if (v.is_number()) return Value::real(v.num());
      return Value::real(0);
    }
    if (f == "list") {
      if (v.kind == K::kList) return v;
      if (v.kind == K::kString) { List l; for (auto& cp : code_points(v.s)) l.push_back(Value::str(cp)); return Value::make_list(std::move(l)); }
      if (v.kind == K::kDict) { List l; for (const auto& [k, x] : *v.dict) l.push_back(Value::str(k)); return Value::make_list(std::move(l)); }
      fail(std::string("list of ") + kind_name(v.kind));
    }
    if (f == "first" || f == "last") {
      if (v.kind == K::kList) return v.list->empty() ? Value() : (f == "first" ? v.list->front() : v.list->back());
      if (v.kind == K::kString) {
        const std::vector<std::string> cps = code_points(v.s);
        return cps.empty() ? Value() : Value::str(f == "first" ? cps.front() : cps.back());
      }
      fail(f + " of " + kind_name(v.kind));
    }
    if (f == "join") {
      if (v.kind != K::kList) fail(std::string("join of ") + kind_name(v.kind));
      const std::string sep = a.empty() ? "" : to_string(a[0]);
      std::string out;
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += sep;
        out += to_string((*v.list)[k]);
        if (out.size() > kMaxOutput) fail("string longer than the renderer's limit");
      }
      return Value::str(std::move(out));
    }
    if (f == "replace" && a.size() >= 2) return Value::str(replace_all(to_string(v), to_string(a[0]), to_string(a[1])));
    if (f == "items") return items_of(v);
    if (f == "selectattr" || f == "rejectattr") {
      if (v.kind != K::kList) fail(f + " of " + kind_name(v.kind));
      if (a.empty() || a[0].kind != K::kString) fail(f + " needs an attribute name");
      List l;
      for (const Value& x : *v.list) {
        const Value attr = x.kind == K::kDict ? attribute(x, a[0].s) : Value();
        bool r;
        if (a.size() == 1) r = truthy(attr);
        else if (a.size() == 3 && a[1].kind == K::kString && (a[1].s == "equalto" || a[1].s == "eq" || a[1].s == "=="))
          r = equal(attr, a[2]);
        else if (a.size() == 2 && a[1].kind == K::kString && a[1].s == "defined") r = attr.kind != K::kUndefined;
        else if (a.size() == 2 && a[1].kind == K::kString && a[1].s == "undefined") r = attr.kind == K::kUndefined;
        else fail(f + " with this test is not supported");
        if (r == (f == "selectattr")) l.push_back(x);
      }
      return Value::make_list(std::move(l));
    }
    fail("unknown filter '" + f + "'");
  }

  bool test(const Expr& e) {
    const Value v = eval(*e.args[0]);
    const std::vector<Value> a = args_of(e, 1);
    const std::string& t = e.name;
    if (t == "defined") return v.kind != K::kUndefined;
    if (t == "undefined") return v.kind == K::kUndefined;
    if (t == "none") return v.kind == K::kNone;
    if (t == "string") return v.kind == K::kString;
    if (t == "number") return v.is_number();
    if (t == "integer") return v.kind == K::kInt;
    if (t == "float") return v.kind == K::kFloat;
    if (t == "boolean") return v.kind == K::kBool;
    if (t == "true") return v.kind == K::kBool && v.b;
    if (t == "false") return v.kind == K::kBool && !v.b;
    if (t == "mapping") return v.kind == K::kDict;
    if (t == "sequence") return v.kind == K::kList || v.kind == K::kString || v.kind == K::kDict;
    if (t == "iterable") return v.kind == K::kList || v.kind == K::kString || v.kind == K::kDict;
    if (t == "even" || t == "odd") {
      if (v.kind != K::kInt) fail(t + " test of " + kind_name(v.kind));
      return (v.i % 2 == 0) == (t == "even");
    }
    if ((t == "eq" || t == "equalto" || t == "sameas") && a.size() == 1) return equal(v, a[0]);
    fail("unknown test '" + t + "'");
  }

  std::vector<std::map<std::string, Value>> scopes_;
  int64_t iterations_ = 0;
  int depth_ = 0;
};

}  // namespace

ChatTemplate::ChatTemplate(std::string_view source) {
  StmtParser parser(split(source));
  std::string ended;
  auto root = std::make_shared<Node>();
  root->type = Node::Type::kBlock;
  root->body = parser.parse_body({}, &ended);
  root_ = std::move(root);
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  Renderer r(context);
  r.run(root_->body);
  return std::move(r.out);
}

std::string_view builtin_chat_template() {
  return "{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] + "
         "'\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}";
}

}  // namespace pagoda::server
