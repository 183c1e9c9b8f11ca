// Leveled logging to stderr (journald picks it up under systemd). With a log file
// (log.file), stderr itself is pointed at the file, so libraries' own messages land there too.
//
// Lines about a job, a variable, a step, a worker or another node carry those as fields:
// after the text as logfmt ("... | job=train variable=emb step=42 rank=1 pid=311 node=0",
// every such line ends with this daemon's node), and, when stderr is the journal
// (JOURNAL_STREAM, as systemd sets it), as journal fields too (PX_JOB, PX_VARIABLE,
// PX_STEP, PX_RANK, PX_PID, PX_PEER, PX_NODE) so `journalctl PX_JOB=train` finds them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace px {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// What a line is about; unset fields (empty, -1) are left out.
struct LogFields {
  std::string job;
  std::string variable;
  int64_t step = -1;
  int rank = -1;     // a worker's local rank on this node
  int64_t pid = -1;  // a worker's process
  int peer = -1;     // another node the line is about
};

// Fields naming a job and, optionally, one of its variables.
LogFields job_fields(const std::string& job, const std::string& variable = "");
// Fields naming another node.
LogFields peer_fields(int peer);

void set_log_level(LogLevel level);
// This daemon's node index, ending every line that has fields (0 until set).
void set_log_node(int node);
void log_message(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void log_with_fields(LogLevel level, const LogFields& fields, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

// " | job=train variable=emb step=42 node=0" (logfmt: a value with a space, '"' or '=' is
// quoted); "" when fields has none set.
std::string log_fields_text(const LogFields& fields, int node);
// The journal fields of one line: MESSAGE, PRIORITY, SYSLOG_IDENTIFIER and the PX_* ones.
std::vector<std::string> journal_fields(LogLevel level, const LogFields& fields, int node,
                                        const std::string& message);

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
// The same with fields: PX_LOG_WARN_AT(fields, "format", ...).
#define PX_LOG_ERROR_AT(fields, ...) \
  ::px::log_with_fields(::px::LogLevel::kError, fields, __VA_ARGS__)
#define PX_LOG_WARN_AT(fields, ...) \
  ::px::log_with_fields(::px::LogLevel::kWarn, fields, __VA_ARGS__)
#define PX_LOG_INFO_AT(fields, ...) \
  ::px::log_with_fields(::px::LogLevel::kInfo, fields, __VA_ARGS__)
#define PX_LOG_DEBUG_AT(fields, ...) \
  ::px::log_with_fields(::px::LogLevel::kDebug, fields, __VA_ARGS__)
