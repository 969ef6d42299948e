#pragma once
/// Minimal leveled logging to stderr. The level comes from PAGODA_LOG_LEVEL (debug, info, warn,
/// error; default warn) read once. Thread-safe per line.

#include <string_view>

#include <fmt/format.h>

namespace pagoda {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

LogLevel log_level();
void log_line(LogLevel level, std::string_view message);

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (level >= log_level()) log_line(level, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace pagoda

#define PAGODA_LOG_DEBUG(...) ::pagoda::log(::pagoda::LogLevel::kDebug, __VA_ARGS__)
#define PAGODA_LOG_INFO(...) ::pagoda::log(::pagoda::LogLevel::kInfo, __VA_ARGS__)
#define PAGODA_LOG_WARN(...) ::pagoda::log(::pagoda::LogLevel::kWarn, __VA_ARGS__)
#define PAGODA_LOG_ERROR(...) ::pagoda::log(::pagoda::LogLevel::kError, __VA_ARGS__)
