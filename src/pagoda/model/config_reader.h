#pragma once
/// Internal to pagoda_model: typed, range-checked reads of a config.json object, shared by the
/// Llama-family parser (config.cpp) and the DeepSeek one (config_deepseek.cpp).

#include <cmath>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/model/config.h"

namespace pagoda::model::config_detail {

using nlohmann::json;

/// A short printable form of a JSON value for error messages.
inline std::string show(const json& v) {
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

/// Reads typed, range-checked values from one JSON object; `where` prefixes key names in
/// errors ("rope_scaling.factor").
class Reader {
 public:
  Reader(const json& j, std::string where) : j_(j), where_(std::move(where)) {}

  /// Present and not null.
  bool has(const char* key) const {
    auto it = j_.find(key);
    return it != j_.end() && !it->is_null();
  }
  /// Present with the value null.
  bool explicitly_null(const char* key) const {
    auto it = j_.find(key);
    return it != j_.end() && it->is_null();
  }
  const json& at(const char* key) const { return *j_.find(key); }
  std::string name(const char* key) const { return where_ + key; }

  int64_t integer(const char* key, int64_t lo, int64_t hi) const {
    PAGODA_REQUIRE(has(key), kInvalidArgument, "config.json: {} is required", name(key));
    return integer_value(at(key), name(key), lo, hi);
  }
  int64_t integer_or(const char* key, int64_t fallback, int64_t lo, int64_t hi) const {
    return has(key) ? integer(key, lo, hi) : fallback;
  }
  double number_or(const char* key, double fallback, double lo, double hi) const {
    if (!has(key)) return fallback;
    const json& v = at(key);
    PAGODA_REQUIRE(v.is_number(), kInvalidArgument, "config.json: {} must be a number (got {})",
                   name(key), show(v));
    const double x = v.get<double>();
    PAGODA_REQUIRE(std::isfinite(x) && x >= lo && x <= hi, kInvalidArgument,
                   "config.json: {} = {} outside [{}, {}]", name(key), x, lo, hi);
    return x;
  }
  bool boolean_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    PAGODA_REQUIRE(at(key).is_boolean(), kInvalidArgument,
                   "config.json: {} must be true or false (got {})", name(key), show(at(key)));
    return at(key).get<bool>();
  }
  std::string string_or(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    PAGODA_REQUIRE(at(key).is_string(), kInvalidArgument,
                   "config.json: {} must be a string (got {})", name(key), show(at(key)));
    return at(key).get<std::string>();
  }

  static int64_t integer_value(const json& v, const std::string& name, int64_t lo, int64_t hi) {
    PAGODA_REQUIRE(v.is_number_integer(), kInvalidArgument,
                   "config.json: {} must be an integer (got {})", name, show(v));
    int64_t x = 0;
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      x = u > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(u);
    } else {
      x = v.get<int64_t>();
    }
    PAGODA_REQUIRE(x >= lo && x <= hi, kInvalidArgument, "config.json: {} = {} outside [{}, {}]",
                   name, x, lo, hi);
    return x;
  }

 private:
  const json& j_;
  std::string where_;
};

template <size_t N>
bool listed(const std::string_view (&list)[N], std::string_view key) {
  for (std::string_view k : list)
    if (k == key) return true;
  return false;
}

/// The parsed family of `r` (architectures, else model_type; Error naming what is unsupported).
ModelFamily parse_family(const Reader& r);
/// Error(kUnsupported) when model_type is present and is not family `f`'s.
void check_model_type(const Reader& r, ModelFamily f);
/// A token id key (an int, or a list whose first entry counts), in [0, vocab); -1 when absent.
int parse_token_id(const Reader& r, const char* key, int64_t vocab);
/// dtype (transformers 5) or torch_dtype: float32 (default), float16 or bfloat16.
DType parse_weights_dtype(const Reader& r);
/// Keys that never change the forward pass (bookkeeping, dropout, labels: config.cpp's list).
bool is_harmless_key(std::string_view key);
/// The DeepSeek-V2 / V3 parse of a config.json object whose family is `f` (config_deepseek.cpp).
ModelConfig parse_deepseek_config(const nlohmann::json& j, ModelFamily f);
/// The Bamba parse of a config.json object whose family is BambaForCausalLM (config_bamba.cpp).
ModelConfig parse_bamba_config(const nlohmann::json& j);

}  // namespace pagoda::model::config_detail
