// parallaxd: the per-node communication daemon.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "config.h"
#include "log.h"
#include "parallax_c.h"
#include "server.h"

namespace {

const char kUsage[] =
    "usage: parallaxd [options]\n"
    "\n"
    "The Parallax per-node communication daemon. Workers connect over a Unix socket\n"
    "and exchange gradients through shared memory.\n"
    "\n"
    "options:\n"
    "  --socket PATH          Unix socket (default $PARALLAX_SOCKET, else\n"
    "                         /run/parallax/parallaxd.sock); created 0660\n"
    "  --group NAME           also accept workers of this group (default: own user and root)\n"
    "  --foreground           stay in the foreground (default: detach once listening)\n"
    "  --threads N            reduction threads (default min(4, cores))\n"
    "  --arena-bytes N        default shared arena per worker (default 268435456)\n"
    "  --max-arena-bytes N    largest arena a worker may ask for (default 17179869184)\n"
    "  --ring-capacity N      entries per submission/completion ring, a power of two\n"
    "                         (default 1024): the most requests a worker can have in flight\n"
    "  --log-level LEVEL      error, warn, info (default) or debug\n"
    "  --version              print the version and exit\n"
    "  --help                 print this help and exit\n";

[[noreturn]] void die_usage(const std::string& message) {
  fprintf(stderr, "parallaxd: %s\n(see parallaxd --help)\n", message.c_str());
  exit(2);
}

uint64_t parse_u64(const std::string& flag, const char* text) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno || !end || *end || text[0] == '-' || text[0] == '\0')
    die_usage(flag + ": '" + text + "' is not a non-negative integer");
  return v;
}

px::DaemonConfig parse_args(int argc, char** argv) {
  px::DaemonConfig config;
  if (const char* env = getenv("PARALLAX_SOCKET"); env && *env) config.socket_path = env;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) die_usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      fputs(kUsage, stdout);
      exit(0);
    } else if (arg == "--version") {
      printf("parallaxd 0.1.0 (ABI %d.%d)\n", PX_ABI_VERSION_MAJOR, PX_ABI_VERSION_MINOR);
      exit(0);
    } else if (arg == "--socket") {
      config.socket_path = value();
    } else if (arg == "--group") {
      config.group = value();
    } else if (arg == "--foreground") {
      config.foreground = true;
    } else if (arg == "--threads") {
      config.threads = static_cast<unsigned>(parse_u64(arg, value()));
      if (config.threads > 256) die_usage("--threads: at most 256");
    } else if (arg == "--arena-bytes") {
      config.default_arena_bytes = parse_u64(arg, value());
    } else if (arg == "--max-arena-bytes") {
      config.max_arena_bytes = parse_u64(arg, value());
    } else if (arg == "--ring-capacity") {
      uint64_t v = parse_u64(arg, value());
      if (v < 2 || v > (1u << 20) || (v & (v - 1)))
        die_usage("--ring-capacity: a power of two in 2..1048576");
      config.ring_capacity = static_cast<uint32_t>(v);
    } else if (arg == "--log-level") {
      std::string level = value();
      if (level == "error")
        config.log_level = px::LogLevel::kError;
      else if (level == "warn")
        config.log_level = px::LogLevel::kWarn;
      else if (level == "info")
        config.log_level = px::LogLevel::kInfo;
      else if (level == "debug")
        config.log_level = px::LogLevel::kDebug;
      else
        die_usage("--log-level: '" + level + "' is not error, warn, info or debug");
    } else {
      die_usage("unknown option '" + arg + "'");
    }
  }
  if (config.default_arena_bytes > config.max_arena_bytes)
    die_usage("--arena-bytes is larger than --max-arena-bytes");
  return config;
}

// Detaches after the socket is listening, so "parallaxd && start-workers" is race-free.
// Returns in the child; the parent exits with the child's readiness.
void detach(int* ready_fd) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    perror("parallaxd: pipe");
    exit(1);
  }
  pid_t pid = fork();
  if (pid < 0) {
    perror("parallaxd: fork");
    exit(1);
  }
  if (pid > 0) {
    ::close(fds[1]);
    char status = 1;
    ssize_t n = read(fds[0], &status, 1);
    exit(n == 1 && status == 0 ? 0 : 1);
  }
  ::close(fds[0]);
  setsid();
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) {
    dup2(devnull, STDIN_FILENO);
    dup2(devnull, STDOUT_FILENO);
    ::close(devnull);
  }
  *ready_fd = fds[1];
}

}  // namespace

int main(int argc, char** argv) {
  px::DaemonConfig config = parse_args(argc, argv);
  px::set_log_level(config.log_level);
  int ready_fd = -1;
  if (!config.foreground) detach(&ready_fd);
  px::Server server(config);
  std::string error;
  if (!server.listen(&error)) {
    PX_LOG_ERROR("%s", error.c_str());
    return 1;
  }
  if (ready_fd >= 0) {
    char ok = 0;
    ssize_t n = write(ready_fd, &ok, 1);
    (void)n;
    ::close(ready_fd);
  }
  return server.run();
}
