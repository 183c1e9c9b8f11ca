// Minimal leveled logging to stderr (journald picks it up under systemd). With a log file
// (log.file), stderr itself is pointed at the file, so libraries' own messages land there too.
#pragma once

#include <string>

namespace px {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void set_log_level(LogLevel level);
void log_message(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// Appends everything written to stderr from now on to path (created 0640 if missing).
// false with error if it cannot be opened; stderr is then unchanged.
bool open_log_file(const std::string& path, std::string* error);
// Opens the log file's path again (logrotate renamed or removed it): later lines go to the
// file now at that path. True with nothing to do when no log file is set.
bool reopen_log_file(std::string* error);
// The log file's path, "" for plain stderr.
const std::string& log_file_path();

}  // namespace px

#define PX_LOG_ERROR(...) ::px::log_message(::px::LogLevel::kError, __VA_ARGS__)
#define PX_LOG_WARN(...) ::px::log_message(::px::LogLevel::kWarn, __VA_ARGS__)
#define PX_LOG_INFO(...) ::px::log_message(::px::LogLevel::kInfo, __VA_ARGS__)
#define PX_LOG_DEBUG(...) ::px::log_message(::px::LogLevel::kDebug, __VA_ARGS__)
