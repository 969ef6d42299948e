#pragma once
// Shared helpers of the config.json tests (config_families_test.cpp, config_deepseek_test.cpp).

#include <gtest/gtest.h>

#include <cstdint>
#include <exception>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/model/config.h"

namespace pagoda::testing {

/// Expects `fn` to throw a pagoda::Error with `code` whose message contains `needle`.
template <typename Fn>
void expect_error(Fn&& fn, ErrorCode code, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "'" << e.what() << "' does not mention '" << needle << "'";
  }
}

/// `base` (a JSON text) with `key` set to `value` (a JSON text; "DELETE" removes the key).
inline nlohmann::json edited(const char* base, const std::string& key, const std::string& value) {
  nlohmann::json j = nlohmann::json::parse(base);
  if (value == "DELETE") {
    j.erase(key);
  } else {
    j[key] = nlohmann::json::parse(value);
  }
  return j;
}

/// `iterations` times: a random base from `bases` with 1–3 random edits (a key erased, or set
/// to value(rng)) must parse to a config that validates, or throw pagoda::Error (anything else
/// fails the test). Returns {accepted, rejected}.
template <typename Value>
std::pair<int, int> mutate_configs(std::span<const char* const> bases, Value value, uint64_t seed,
                                   int iterations) {
  std::mt19937_64 rng(seed);
  int accepted = 0, rejected = 0;
  for (int it = 0; it < iterations; ++it) {
    nlohmann::json j = nlohmann::json::parse(bases[rng() % bases.size()]);
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      std::vector<std::string> keys;
      for (const auto& [k, v] : j.items()) keys.push_back(k);
      const std::string key = keys[rng() % keys.size()];
      if (rng() % 8 == 0) {
        j.erase(key);
      } else {
        j[key] = value(rng);
      }
    }
    try {
      const model::ModelConfig c = model::config_from_hf_json(j);
      EXPECT_NO_THROW(c.validate()) << "iteration " << it << ": " << j.dump();
      ++accepted;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "iteration " << it << " (seed " << seed << "): non-pagoda exception "
                    << e.what() << " for " << j.dump();
    }
  }
  return {accepted, rejected};
}

}  // namespace pagoda::testing
