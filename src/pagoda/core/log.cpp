#include "pagoda/core/log.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace pagoda {

LogLevel log_level() {
  static const LogLevel level = [] {
    const char* env = std::getenv("PAGODA_LOG_LEVEL");
    const std::string v = env ? env : "warn";
    if (v == "debug") return LogLevel::kDebug;
    if (v == "info") return LogLevel::kInfo;
    if (v == "error") return LogLevel::kError;
    return LogLevel::kWarn;
  }();
  return level;
}

void log_line(LogLevel level, std::string_view message) {
  static std::mutex mu;
  static constexpr const char* kNames[] = {"debug", "info", "warn", "error"};
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[pagoda %s] %.*s\n", kNames[static_cast<int>(level)],
               static_cast<int>(message.size()), message.data());
}

}  // namespace pagoda
