#pragma once
/// Status: the error value of paths that must not throw (kernel launches, CUDA-graph replay).
/// Callers at an API boundary convert a bad Status into an Error with throw_if_error().

#include <string>
#include <utility>

#include "pagoda/core/error.h"

namespace pagoda {

class [[nodiscard]] Status {
 public:
  /// The OK status.
  Status() = default;
  Status(ErrorCode code, std::string message) : ok_(false), code_(code), message_(std::move(message)) {}
  static Status ok() { return Status(); }

  bool is_ok() const { return ok_; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  /// Throws Error(code, message) when not OK.
  void throw_if_error() const {
    if (!ok_) throw Error(code_, message_);
  }

 private:
  bool ok_ = true;
  ErrorCode code_ = ErrorCode::kInternal;
  std::string message_;
};

}  // namespace pagoda
