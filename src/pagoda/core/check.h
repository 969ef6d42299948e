#pragma once
/// Invariant checks (ARCHITECTURE §4, tier a). A failed check prints the location, the condition
/// and both operands, then aborts: it means a bug in pagoda, never bad user input (see error.h).
///
///   PAGODA_CHECK(cond, "fmt", args...)   always on
///   PAGODA_CHECK_EQ(a, b) / _NE / _LT / _LE / _GT / _GE   always on, prints a and b
///   PAGODA_DCHECK(cond)                  only when NDEBUG is not defined (hot paths)

#include <cstdio>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

namespace pagoda::detail {

[[noreturn]] void check_failed(const char* file, int line, const char* expr, const std::string& msg);

template <typename A, typename B>
[[noreturn]] void check_op_failed(const char* file, int line, const char* expr, const A& a,
                                  const B& b) {
  check_failed(file, line, expr, fmt::format("lhs = {}, rhs = {}", a, b));
}

}  // namespace pagoda::detail

#define PAGODA_CHECK(cond, ...)                                                         \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      ::pagoda::detail::check_failed(__FILE__, __LINE__, #cond,                         \
                                     ::fmt::format("" __VA_ARGS__));                    \
    }                                                                                   \
  } while (0)

#define PAGODA_CHECK_OP_(a, b, op)                                                      \
  do {                                                                                  \
    const auto& pagoda_a_ = (a);                                                        \
    const auto& pagoda_b_ = (b);                                                        \
    if (!(pagoda_a_ op pagoda_b_)) {                                                    \
      ::pagoda::detail::check_op_failed(__FILE__, __LINE__, #a " " #op " " #b,         \
                                        pagoda_a_, pagoda_b_);                          \
    }                                                                                   \
  } while (0)

#define PAGODA_CHECK_EQ(a, b) PAGODA_CHECK_OP_(a, b, ==)
#define PAGODA_CHECK_NE(a, b) PAGODA_CHECK_OP_(a, b, !=)
#define PAGODA_CHECK_LT(a, b) PAGODA_CHECK_OP_(a, b, <)
#define PAGODA_CHECK_LE(a, b) PAGODA_CHECK_OP_(a, b, <=)
#define PAGODA_CHECK_GT(a, b) PAGODA_CHECK_OP_(a, b, >)
#define PAGODA_CHECK_GE(a, b) PAGODA_CHECK_OP_(a, b, >=)

#ifdef NDEBUG
#define PAGODA_DCHECK(cond, ...) \
  do {                           \
  } while (0)
#else
#define PAGODA_DCHECK(cond, ...) PAGODA_CHECK(cond, __VA_ARGS__)
#endif
