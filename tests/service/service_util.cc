#include "tests/service/service_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

namespace pxt {

int64_t monotonic_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int wait_for_exit(pid_t pid, int timeout_ms) {
  int64_t deadline = monotonic_ms() + timeout_ms;
  for (;;) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (monotonic_ms() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

int run_command(const std::vector<std::string>& argv, std::string* output, int timeout_ms,
                const std::map<std::string, std::string>& env) {
  char path[] = "/tmp/pxt-service-cmd-XXXXXX";
  int fd = mkstemp(path);
  if (fd >= 0) close(fd);
  int code = wait_for_exit(spawn_process(argv, env, path), timeout_ms);
  *output = read_text(path);
  unlink(path);
  return code;
}

bool wait_until_accepting(const std::string& socket, int timeout_ms) {
  int64_t deadline = monotonic_ms() + timeout_ms;
  while (monotonic_ms() < deadline) {
    int fd = connect_unix(socket);
    if (fd >= 0) {
      close(fd);
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

bool wait_for_text(const std::string& path, const std::string& part, int timeout_ms) {
  int64_t deadline = monotonic_ms() + timeout_ms;
  while (monotonic_ms() < deadline) {
    if (contains(read_text(path), part)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

BackgroundWorkers::BackgroundWorkers(const std::string& socket, const std::string& job,
                                     int local_size, const std::vector<std::string>& args,
                                     const std::map<std::string, std::string>& extra_env) {
  for (int rank = 0; rank < local_size; ++rank) {
    std::map<std::string, std::string> env = extra_env;
    env.insert({{"PARALLAX_SOCKET", socket},
                {"PARALLAX_JOB", job},
                {"PARALLAX_LOCAL_RANK", std::to_string(rank)},
                {"PARALLAX_LOCAL_SIZE", std::to_string(local_size)}});
    std::vector<std::string> argv = {PX_SERVICE_WORKER_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    static int counter = 0;  // two nodes' workers of one job need files of their own
    outputs_.push_back("/tmp/pxt-service-" + job + "-" + std::to_string(getpid()) + "-" +
                       std::to_string(counter++) + "-w" + std::to_string(rank) + ".out");
    pids_.push_back(spawn_process(argv, env, outputs_.back()));
  }
}

BackgroundWorkers::~BackgroundWorkers() {
  for (pid_t pid : pids_) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  for (auto& path : outputs_) unlink(path.c_str());
}

std::vector<WorkerResult> BackgroundWorkers::collect(int timeout_ms) {
  int64_t deadline = monotonic_ms() + timeout_ms;
  std::vector<WorkerResult> results;
  for (size_t i = 0; i < pids_.size(); ++i) {
    WorkerResult r;
    r.exit_code =
        wait_for_exit(pids_[i], static_cast<int>(std::max<int64_t>(0, deadline - monotonic_ms())));
    r.output = read_text(outputs_[i]);
    results.push_back(r);
  }
  pids_.clear();
  return results;
}

std::vector<WorkerResult> run_service_workers(const std::string& socket, const std::string& job,
                                              int local_size, const std::vector<std::string>& args,
                                              int timeout_ms) {
  BackgroundWorkers workers(socket, job, local_size, args);
  return workers.collect(timeout_ms);
}

}  // namespace pxt
