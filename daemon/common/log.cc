#include "daemon/common/log.h"

#include <fcntl.h>
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
std::mutex g_mutex;
const char* const kLevelNames[] = {"error", "warn", "info", "debug"};
std::string g_file;  // guarded by g_mutex

// Points stderr at path, opened for appending (each line is one write, so lines from the
// daemon and from libraries never interleave within a line). Caller holds g_mutex.
bool redirect_stderr(const std::string& path, std::string* error) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  if (fd < 0) {
    *error = "cannot open log file " + path + ": " + strerror(errno);
    return false;
  }
  fflush(stderr);
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

void set_log_level(LogLevel level) {
  g_level = level;
}

void log_message(LogLevel level, const char* fmt, ...) {
  if (level > g_level) return;
  char text[2048];
  va_list args;
  va_start(args, fmt);
  vsnprintf(text, sizeof text, fmt, args);
  va_end(args);
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  std::lock_guard<std::mutex> lock(g_mutex);
  fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ parallaxd %s: %s\n", tm.tm_year + 1900,
          tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
          kLevelNames[static_cast<int>(level)], text);
}

}  // namespace px
