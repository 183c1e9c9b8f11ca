// Starts real parallaxd and worker processes for the integration tests. Every test gets
// its own socket path and log file, so tests run in parallel.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace pxt {

class DaemonProcess {
 public:
  // Starts parallaxd --foreground on a fresh socket and waits until it accepts.
  explicit DaemonProcess(const std::string& tag, const std::vector<std::string>& extra_args = {});
  ~DaemonProcess();  // SIGTERM, then SIGKILL after 5 s

  const std::string& socket() const { return socket_; }
  pid_t pid() const { return pid_; }
  bool alive() const;
  std::string log() const;
  int open_fds() const;  // entries in /proc/PID/fd
  // open_fds() once the daemon is idle (the start-up probe connection is closed).
  int idle_fds() const;
  int arena_mappings() const;  // memfd arenas still mapped
  // Waits (up to timeout_ms) until open_fds() == fds and arena_mappings() == maps.
  bool settles_to(int fds, int maps, int timeout_ms) const;

 private:
  std::string socket_;
  std::string log_path_;
  pid_t pid_ = -1;
};

struct WorkerResult {
  int exit_code = -1;  // -1: killed at the deadline; 128+N: died of signal N
  std::string output;
};

// Runs local_size workers (px_test_worker ARGS...) of job on the daemon; waits for all.
std::vector<WorkerResult> run_workers(const DaemonProcess& daemon, const std::string& job,
                                      int local_size, const std::vector<std::string>& args,
                                      int timeout_ms = 120000,
                                      const std::map<std::string, std::string>& env = {});

// Every worker exited 0 (prints the outputs otherwise, for the test log).
bool all_ok(const std::vector<WorkerResult>& results);

}  // namespace pxt
