#include "daemon/common/log.h"

#include <time.h>

#include <cstdarg>
#include <cstdio>
#include <mutex>

namespace px {
namespace {
LogLevel g_level = LogLevel::kInfo;
std::mutex g_mutex;
const char* const kLevelNames[] = {"error", "warn", "info", "debug"};
}  // namespace

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
