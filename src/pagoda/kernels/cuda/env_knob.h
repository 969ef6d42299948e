#pragma once
/// The test / A/B knobs of the CUDA launchers (PAGODA_SM90_*, PAGODA_MLA_*): environment
/// variables read on every call, because tests and benchmarks change them inside one process.
/// Host-only, no CUDA dependency (env_knob_tests checks the parsing).

#include <cstdlib>
#include <cstring>

namespace pagoda::kernels::cuda {

/// The integer value of `name`; `fallback` when it is unset, empty or not a whole number.
inline int env_knob(const char* name, int fallback) {
  const char* e = std::getenv(name);
  if (e == nullptr || *e == '\0') return fallback;
  char* end = nullptr;
  const long v = std::strtol(e, &end, 10);
  return *end == '\0' ? static_cast<int>(v) : fallback;
}

/// Whether `name` is set to exactly "0" (a path turned off).
inline bool env_knob_off(const char* name) {
  const char* e = std::getenv(name);
  return e != nullptr && std::strcmp(e, "0") == 0;
}

}  // namespace pagoda::kernels::cuda
