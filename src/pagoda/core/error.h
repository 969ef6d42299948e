#pragma once
/// Errors raised at API boundaries for bad input or configuration (ARCHITECTURE §4, tier c).
///
/// A broken internal invariant is not an Error: it aborts through PAGODA_CHECK (check.h).
/// "Does not fit now" is not an Error either: it is an empty std::optional.
/// Every throwing API documents that it leaves its object unchanged when it throws.

#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace pagoda {

/// What kind of bad input an Error reports; stable for tests and the CLI's exit messages.
enum class ErrorCode {
  kInvalidArgument,    ///< wrong shape, dtype, length or combination of options
  kOutOfRange,         ///< an index (slot, page, row, layer) outside its valid range
  kUnsupported,        ///< valid input that this backend/platform cannot serve (names what can)
  kResourceExhausted,  ///< a pool or table is full and the caller asked for a hard failure
  kFailedPrecondition, ///< the object is in the wrong state for the call (e.g. double free)
  kInternal,           ///< an external library (CUDA, BLAS, I/O) failed
};

/// Printable name of an ErrorCode ("invalid argument", ...).
std::string_view error_code_name(ErrorCode code);

/// Exception type of every pagoda API-boundary error. what() is "<code>: <message>".
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  ErrorCode code() const { return code_; }
  /// The message without the "<code>: " prefix.
  const std::string& message() const { return message_; }

 private:
  ErrorCode code_;
  std::string message_;
};

/// Throws Error(code, fmt::format(format, args...)). Never returns.
template <typename... Args>
[[noreturn]] void throw_error(ErrorCode code, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace pagoda

/// Validates API input: throws pagoda::Error(code, message) when `cond` is false.
/// Use only at module boundaries and before any state has been mutated.
#define PAGODA_REQUIRE(cond, code, ...)                          \
  do {                                                           \
    if (!(cond)) ::pagoda::throw_error(::pagoda::ErrorCode::code, __VA_ARGS__); \
  } while (0)
