// A Jinja2 subset for chat templates: the tree-walking renderer over the parser's statement tree
// (jinja_parse.h) and values (jinja_value.h).
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

#include "pagoda/server/jinja_parse.h"
#include "pagoda/server/jinja_value.h"

namespace pagoda::server {

namespace {

using namespace jinja;  // NOLINT: the renderer is the parser's and the values' one client

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
  auto root = std::make_shared<Node>();
  root->type = Node::Type::kBlock;
  root->body = parse_template(source);
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
