#pragma once
/// Values of the chat-template renderer (a Jinja2 subset; see chat_template.h): Python-like
/// dynamic values (undefined, none, bool, int, float, UTF-8 str, list, insertion-ordered dict,
/// namespace), their conversions (str(), repr(), tojson), truthiness, equality, and the
/// renderer's limits. Internal to pagoda_server_core (chat_template.cpp, jinja_parse.cpp).
/// Every failure is a TemplateError.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/server/chat_template.h"

namespace pagoda::server::jinja {

inline constexpr size_t kMaxOutput = 1 << 20;       ///< bytes of rendered text or of any string value
inline constexpr int64_t kMaxIterations = 1 << 20;  ///< loop iterations per render
inline constexpr int kMaxDepth = 200;               ///< nesting of expressions and blocks

/// Throws TemplateError(msg).
[[noreturn]] void fail(const std::string& msg);

/// Strings are UTF-8; like Python's str, lengths, indices, slices and iteration count code
/// points (a byte that starts no valid sequence counts as one).
std::vector<std::string> code_points(const std::string& s);
/// The code point of one element of code_points().
uint32_t decode_cp(const std::string& cp);
/// Python's str.isspace() for one code point.
bool py_space(uint32_t c);

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

const char* kind_name(K k);
/// A JSON value of the render context as a Value (objects keep their key order).
Value from_json(const nlohmann::ordered_json& j);
/// Python truthiness.
bool truthy(const Value& v);
/// Python's repr() of a float / a str.
std::string py_float(double f);
std::string py_repr_str(const std::string& s);
/// Python's str() (repr() of the elements inside lists and dicts), or repr() when `repr`.
std::string to_string(const Value& v, bool repr = false);
/// Appends `s` as a JSON string literal (json.dumps escaping, non-ASCII kept).
void json_string(std::string& out, const std::string& s);
/// Appends tojson(v) with `indent` spaces per level (0 = one line), starting at `level`.
void to_json(std::string& out, const Value& v, int indent, int level);
/// Python ==.
bool equal(const Value& a, const Value& b);

}  // namespace pagoda::server::jinja
