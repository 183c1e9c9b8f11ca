// Processes for the service tests: parallaxd started as systemd would (its own environment,
// a configuration file), workers started in the background, short commands whose output is
// checked. Everything is killed at its deadline; nothing waits without one.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace pxt {

int64_t monotonic_ms();

// spawn_process: tests/integration/harness.h.
// The exit code of pid (128+N for signal N), or -1 if it had not exited within timeout_ms
// (it is then killed and reaped).
int wait_for_exit(pid_t pid, int timeout_ms);
// Runs argv to its end (up to timeout_ms); its exit code, and its output in *output.
int run_command(const std::vector<std::string>& argv, std::string* output, int timeout_ms = 20000,
                const std::map<std::string, std::string>& env = {});

std::string read_text(const std::string& path);
void write_text_file(const std::string& path, const std::string& text);
// Waits up to timeout_ms until the daemon at socket accepts connections.
bool wait_until_accepting(const std::string& socket, int timeout_ms);
// Waits up to timeout_ms until the file at path contains part.
bool wait_for_text(const std::string& path, const std::string& part, int timeout_ms);

// Workers (px_service_worker ARGS...) of one job running in the background.
class BackgroundWorkers {
 public:
  BackgroundWorkers(const std::string& socket, const std::string& job, int local_size,
                    const std::vector<std::string>& args,
                    const std::map<std::string, std::string>& env = {});
  ~BackgroundWorkers();  // kills those still running
  // Waits for every worker (killing those past the deadline).
  std::vector<WorkerResult> collect(int timeout_ms);

 private:
  std::vector<pid_t> pids_;
  std::vector<std::string> outputs_;
};

// The service worker run to its end as local_size workers of job.
std::vector<WorkerResult> run_service_workers(const std::string& socket, const std::string& job,
                                              int local_size, const std::vector<std::string>& args,
                                              int timeout_ms = 60000);

}  // namespace pxt
