#include "daemon/common/log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <systemd/sd-journal.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace px {
namespace {
LogLevel g_level = LogLevel::kInfo;
int g_node = 0;
std::mutex g_mutex;
const char* const kLevelNames[] = {"error", "warn", "info", "debug"};
const int kPriorities[] = {3, 4, 6, 7};  // syslog's err, warning, info, debug
std::string g_file;                      // guarded by g_mutex
// Whether stderr is the journal's stream (systemd's JOURNAL_STREAM names its device and
// inode): -1 not checked yet. Guarded by g_mutex; a log file makes it false.
int g_journal = -1;

bool stderr_is_journal() {
  if (g_journal < 0) {
    g_journal = 0;
    const char* stream = getenv("JOURNAL_STREAM");
    struct stat st;
    unsigned long long dev = 0, ino = 0;
    if (stream && sscanf(stream, "%llu:%llu", &dev, &ino) == 2 && fstat(STDERR_FILENO, &st) == 0)
      g_journal = st.st_dev == dev && st.st_ino == ino;
  }
  return g_journal == 1;
}

// A logfmt value: bare when it can be, else quoted with '"' and '\\' escaped.
std::string logfmt_value(const std::string& value) {
  if (!value.empty() && value.find_first_of(" \"=\n\t") == std::string::npos) return value;
  std::string out = "\"";
  for (char ch : value) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch == '\n' ? ' ' : ch;
  }
  return out + "\"";
}

void write_line(LogLevel level, const LogFields* fields, const char* fmt, va_list args) {
  char text[2048];
  vsnprintf(text, sizeof text, fmt, args);
  std::string suffix = fields ? log_fields_text(*fields, g_node) : "";
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (fields && stderr_is_journal()) {
    std::vector<std::string> items =
        journal_fields(level, *fields, g_node, std::string(text) + suffix);
    std::vector<iovec> iov;
    for (auto& item : items) iov.push_back({item.data(), item.size()});
    if (sd_journal_sendv(iov.data(), static_cast<int>(iov.size())) >= 0) return;
  }
  fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ parallaxd %s: %s%s\n", tm.tm_year + 1900,
          tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
          kLevelNames[static_cast<int>(level)], text, suffix.c_str());
}

// Points stderr at path, opened for appending (each line is one write, so lines from the
// daemon and from libraries never interleave within a line). Caller holds g_mutex.
bool redirect_stderr(const std::string& path, std::string* error) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  if (fd < 0) {
    *error = "cannot open log file " + path + ": " + strerror(errno);
    return false;
  }
  fflush(stderr);
  g_journal = 0;  // a file, not the journal's stream
  // dup2 replaces fd 2 atomically: a thread writing meanwhile reaches the old or the new file.
  if (fd != STDERR_FILENO) {
    int duplicated = dup2(fd, STDERR_FILENO);
    int saved_errno = errno;
    ::close(fd);
    if (duplicated < 0) {
      *error = "cannot redirect stderr to " + path + ": " + strerror(saved_errno);
      return false;
    }
  }
  return true;
}
}  // namespace

bool open_log_file(const std::string& path, std::string* error) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!redirect_stderr(path, error)) return false;
  g_file = path;
  return true;
}

bool reopen_log_file(std::string* error) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_file.empty() || redirect_stderr(g_file, error);
}

const std::string& log_file_path() {
  return g_file;
}

std::string log_fields_text(const LogFields& f, int node) {
  std::string out;
  auto add = [&out](const char* key, const std::string& value) {
    out += std::string(" ") + key + "=" + logfmt_value(value);
  };
  if (!f.job.empty()) add("job", f.job);
  if (!f.variable.empty()) add("variable", f.variable);
  if (f.step >= 0) add("step", std::to_string(f.step));
  if (f.rank >= 0) add("rank", std::to_string(f.rank));
  if (f.pid >= 0) add("pid", std::to_string(f.pid));
  if (f.peer >= 0) add("peer", std::to_string(f.peer));
  if (out.empty()) return "";
  return " |" + out + " node=" + std::to_string(node);
}

std::vector<std::string> journal_fields(LogLevel level, const LogFields& f, int node,
                                        const std::string& message) {
  std::vector<std::string> out = {
      "MESSAGE=" + message,
      "PRIORITY=" + std::to_string(kPriorities[static_cast<int>(level)]),
      "SYSLOG_IDENTIFIER=parallaxd",
  };
  if (!f.job.empty()) out.push_back("PX_JOB=" + f.job);
  if (!f.variable.empty()) out.push_back("PX_VARIABLE=" + f.variable);
  if (f.step >= 0) out.push_back("PX_STEP=" + std::to_string(f.step));
  if (f.rank >= 0) out.push_back("PX_RANK=" + std::to_string(f.rank));
  if (f.pid >= 0) out.push_back("PX_PID=" + std::to_string(f.pid));
  if (f.peer >= 0) out.push_back("PX_PEER=" + std::to_string(f.peer));
  out.push_back("PX_NODE=" + std::to_string(node));
  return out;
}

LogFields job_fields(const std::string& job, const std::string& variable) {
  LogFields fields;
  fields.job = job;
  fields.variable = variable;
  return fields;
}

LogFields peer_fields(int peer) {
  LogFields fields;
  fields.peer = peer;
  return fields;
}

void set_log_node(int node) {
  g_node = node;
}

void set_log_level(LogLevel level) {
  g_level = level;
}

void log_message(LogLevel level, const char* fmt, ...) {
  if (level > g_level) return;
  va_list args;
  va_start(args, fmt);
  write_line(level, nullptr, fmt, args);
  va_end(args);
}

void log_with_fields(LogLevel level, const LogFields& fields, const char* fmt, ...) {
  if (level > g_level) return;
  va_list args;
  va_start(args, fmt);
  write_line(level, &fields, fmt, args);
  va_end(args);
}

}  // namespace px
