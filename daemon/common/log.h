// Minimal leveled logging to stderr (journald picks it up under systemd).
#pragma once

namespace px {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void set_log_level(LogLevel level);
void log_message(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace px

#define PX_LOG_ERROR(...) ::px::log_message(::px::LogLevel::kError, __VA_ARGS__)
#define PX_LOG_WARN(...) ::px::log_message(::px::LogLevel::kWarn, __VA_ARGS__)
#define PX_LOG_INFO(...) ::px::log_message(::px::LogLevel::kInfo, __VA_ARGS__)
#define PX_LOG_DEBUG(...) ::px::log_message(::px::LogLevel::kDebug, __VA_ARGS__)
