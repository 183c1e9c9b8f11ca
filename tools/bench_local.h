// px-bench's single-node harness, shared by its local scenarios (px_bench.cc) and px-bench-gpu
// (bench_gpu.cc): a parallaxd started for the run, and workers in forked processes (each
// its own client, as a framework's ranks are; forked before the parent touches CUDA, which
// does not survive a fork).
#pragma once

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "parallax_c.h"
#include "tools/bench_common.h"

namespace pxbench {

// The build's parallaxd, beside the folder the benchmark runs from (BUILD/tools).
inline std::string default_daemon_path() {
  return tools_dir() + "/../daemon/parallaxd";
}

struct Daemon {
  pid_t pid = -1;
  std::string socket;
  ~Daemon() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
  }
};

inline bool can_connect(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return ok;
}

inline void start_daemon(Daemon& d, const std::string& path) {
  d.socket = "/tmp/px-bench-" + std::to_string(getpid()) + ".sock";
  d.pid = fork();
  if (d.pid == 0) {
    execl(path.c_str(), path.c_str(), "--foreground", "--socket", d.socket.c_str(), "--log-level",
          "warn", static_cast<char*>(nullptr));
    _exit(127);
  }
  double start = now_s();
  while (!can_connect(d.socket)) {
    if (now_s() - start > 10) die("parallaxd (" + path + ") did not start");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

inline px_client* connect_worker(const Daemon& d, const std::string& job, int rank, int size) {
  px_connect_options o;
  px_connect_options_init(&o);
  o.socket_path = d.socket.c_str();
  o.job_name = job.c_str();
  o.local_rank = rank;
  o.local_size = size;
  o.arena_bytes = 160ull << 20;
  px_client* c = nullptr;
  check(px_connect(&o, &c), "px_connect");
  return c;
}

// Runs fn(rank) in `workers` forked processes; rank 0's doubles come back through a pipe.
template <typename Fn>
std::vector<double> run_workers(int workers, Fn fn) {
  int fds[2];
  if (pipe(fds) != 0) die("pipe");
  std::vector<pid_t> pids;
  for (int r = 0; r < workers; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      std::vector<double> out = fn(r);
      if (r == 0) {
        ssize_t n = write(fds[1], out.data(), out.size() * sizeof(double));
        (void)n;
      }
      _exit(0);
    }
    pids.push_back(pid);
  }
  close(fds[1]);
  std::vector<double> result;
  double v;
  while (read(fds[0], &v, sizeof v) == sizeof v) result.push_back(v);
  close(fds[0]);
  for (pid_t p : pids) {
    int status = 0;
    waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) die("a benchmark worker failed");
  }
  return result;
}

// Seconds of each in-place allreduce of buf; the first `warmup` are not counted. aligned:
// each starts right after a barrier so all workers begin together (bandwidth); otherwise
// back to back (round trips).
inline std::vector<double> timed_allreduces(px_client* c, px_var* var, void* buf, int warmup,
                                            int iterations, bool aligned = true) {
  std::vector<double> seconds;
  for (int i = 0; i < warmup + iterations; ++i) {
    if (aligned) check(px_barrier(c, 300000), "px_barrier");
    px_request* r = nullptr;
    double t0 = now_s();
    check(px_allreduce(var, buf, buf, &r), "px_allreduce");
    check(px_wait(r, 300000), "px_wait");
    double t = now_s() - t0;
    px_request_free(r);
    if (i >= warmup) seconds.push_back(t);
  }
  return seconds;
}

}  // namespace pxbench
