// Values of the chat-template renderer: conversions, truthiness, equality (jinja_value.h).
#include "pagoda/server/jinja_value.h"

#include <cmath>

namespace pagoda::server::jinja {

void fail(const std::string& msg) { throw TemplateError(msg); }

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

bool py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}



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

std::string to_string(const Value& v, bool repr) {
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


}  // namespace pagoda::server::jinja
