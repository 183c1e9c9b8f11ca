// px-bench: Parallax benchmarks. Each scenario prints one JSON object with --json.
//
//   px-bench local [--json] [--daemon PATH] [--iterations N]
//     4 KiB allreduce round trip between 2 workers (median, p99), 64 MiB allreduce across
//     2 and 4 workers (GB/s of algorithm bandwidth), and single-thread memcpy bandwidth
//     measured in the same run for reference.
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "parallax_c.h"

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

[[noreturn]] void die(const std::string& what) {
  fprintf(stderr, "px-bench: %s\n", what.c_str());
  exit(1);
}

void check(px_status s, const char* what) {
  if (s != PX_OK) die(std::string(what) + ": " + px_strerror(s) + ": " + px_last_error());
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// Single-thread memcpy of 64 MiB, median of several runs, in GB/s (10^9 bytes/s).
double memcpy_gbps() {
  const size_t bytes = 64ull << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  std::vector<double> rates;
  for (int i = 0; i < 12; ++i) {
    double t0 = now_s();
    std::memcpy(b.data(), a.data(), bytes);
    double t = now_s() - t0;
    if (i >= 2) rates.push_back(static_cast<double>(bytes) / t / 1e9);
    a[static_cast<size_t>(i)] = b[static_cast<size_t>(i) + 1];  // keep the copies observable
  }
  return percentile(rates, 0.5);
}

// Round trip of a bare eventfd ping-pong between two processes (two wake-ups), in us: the
// floor under any doorbell-driven round trip on this machine, measured for reference.
std::vector<double> eventfd_ping_pong(int iterations) {
  int ping = eventfd(0, EFD_CLOEXEC), pong = eventfd(0, EFD_CLOEXEC);
  uint64_t one = 1, value = 0;
  auto wait_and_read = [&](int fd) {
    pollfd p{fd, POLLIN, 0};
    while (poll(&p, 1, -1) < 0) {
    }
    if (read(fd, &value, sizeof value) != sizeof value) die("eventfd read");
  };
  pid_t child = fork();
  if (child == 0) {
    for (int i = 0; i < iterations + 100; ++i) {
      wait_and_read(ping);
      if (write(pong, &one, sizeof one) != sizeof one) _exit(1);
    }
    _exit(0);
  }
  std::vector<double> us;
  for (int i = 0; i < iterations + 100; ++i) {
    double t0 = now_s();
    if (write(ping, &one, sizeof one) != sizeof one) die("eventfd write");
    wait_and_read(pong);
    if (i >= 100) us.push_back((now_s() - t0) * 1e6);
  }
  waitpid(child, nullptr, 0);
  close(ping);
  close(pong);
  return us;
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

bool can_connect(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return ok;
}

void start_daemon(Daemon& d, const std::string& path) {
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

px_client* connect_worker(const Daemon& d, const std::string& job, int rank, int size) {
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

// Round trip of one small allreduce (submit to completion) as seen by rank 0, in us.
std::vector<double> round_trips(const Daemon& d, int iterations) {
  return run_workers(2, [&](int rank) {
    px_client* c = connect_worker(d, "rtt", rank, 2);
    px_var* var = nullptr;
    check(px_register_dense(c, "rtt4k", PX_F32, 1024, PX_SUM, &var), "register");
    void* buf = nullptr;
    check(px_alloc(c, 4096, &buf), "px_alloc");
    std::memset(buf, 0, 4096);
    std::vector<double> us;
    for (int i = 0; i < iterations + 200; ++i) {
      px_request* r = nullptr;
      double t0 = now_s();
      check(px_allreduce(var, buf, buf, &r), "px_allreduce");
      check(px_wait(r, 60000), "px_wait");
      double t = now_s() - t0;
      px_request_free(r);
      if (i >= 200) us.push_back(t * 1e6);
    }
    px_disconnect(c);
    return us;
  });
}

// Seconds per 64 MiB allreduce (barrier-aligned), as seen by rank 0.
std::vector<double> big_allreduce(const Daemon& d, int workers, bool arena, int iterations) {
  const uint64_t count = 16ull << 20;  // f32: 64 MiB
  std::string job = "big" + std::to_string(workers) + (arena ? "a" : "o");
  return run_workers(workers, [&](int rank) {
    px_client* c = connect_worker(d, job, rank, workers);
    px_var* var = nullptr;
    check(px_register_dense(c, "big", PX_F32, count, PX_SUM, &var), "register");
    void* arena_buf = nullptr;
    std::vector<float> plain;
    float* buf;
    if (arena) {
      check(px_alloc(c, count * 4, &arena_buf), "px_alloc");
      buf = static_cast<float*>(arena_buf);
    } else {
      plain.resize(count);
      buf = plain.data();
    }
    for (uint64_t i = 0; i < count; ++i) buf[i] = 1.0f;
    std::vector<double> seconds;
    for (int i = 0; i < iterations + 2; ++i) {
      check(px_barrier(c, 60000), "px_barrier");
      px_request* r = nullptr;
      double t0 = now_s();
      check(px_allreduce(var, buf, buf, &r), "px_allreduce");
      check(px_wait(r, 60000), "px_wait");
      double t = now_s() - t0;
      px_request_free(r);
      if (i >= 2) seconds.push_back(t);
    }
    px_disconnect(c);
    return seconds;
  });
}

std::string default_daemon_path() {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return "parallaxd";
  self[n] = '\0';
  std::string dir(self);
  dir = dir.substr(0, dir.rfind('/'));
  return dir + "/../daemon/parallaxd";
}

int bench_local(bool json, const std::string& daemon_path, int iterations) {
  double memcpy_rate = memcpy_gbps();
  std::vector<double> floor_us = eventfd_ping_pong(iterations);
  Daemon daemon;
  start_daemon(daemon, daemon_path);
  std::vector<double> rtt = round_trips(daemon, iterations);
  struct Row {
    int workers;
    const char* memory;
    double gbps;
  };
  std::vector<Row> rows;
  for (int workers : {2, 4}) {
    for (bool arena : {true, false}) {
      std::vector<double> t = big_allreduce(daemon, workers, arena, 8);
      rows.push_back(
          {workers, arena ? "arena" : "ordinary", (64.0 * 1048576.0) / percentile(t, 0.5) / 1e9});
    }
  }
  double median = percentile(rtt, 0.5), p99 = percentile(rtt, 0.99);
  if (json) {
    printf("{\"scenario\":\"local\",\"cores\":%u,\"memcpy_gbps\":%.3f,",
           std::thread::hardware_concurrency(), memcpy_rate);
    printf("\"rtt_4k_2_workers_us\":{\"median\":%.2f,\"p99\":%.2f,\"samples\":%zu},", median, p99,
           rtt.size());
    printf("\"eventfd_ping_pong_us\":{\"median\":%.2f,\"p99\":%.2f},", percentile(floor_us, 0.5),
           percentile(floor_us, 0.99));
    printf("\"allreduce_64mib\":[");
    for (size_t i = 0; i < rows.size(); ++i)
      printf("%s{\"workers\":%d,\"memory\":\"%s\",\"algbw_gbps\":%.3f,\"fraction_of_memcpy\":%.3f}",
             i ? "," : "", rows[i].workers, rows[i].memory, rows[i].gbps,
             rows[i].gbps / memcpy_rate);
    printf("]}\n");
  } else {
    printf("single-thread memcpy (64 MiB):     %.2f GB/s\n", memcpy_rate);
    printf("4 KiB allreduce round trip, 2 wk:  median %.1f us, p99 %.1f us (%zu samples)\n", median,
           p99, rtt.size());
    printf("eventfd ping-pong, 2 processes:    median %.1f us, p99 %.1f us (wake-up floor)\n",
           percentile(floor_us, 0.5), percentile(floor_us, 0.99));
    for (const Row& r : rows)
      printf("64 MiB allreduce, %d workers, %-8s %.2f GB/s (%.0f%% of memcpy)\n", r.workers,
             r.memory, r.gbps, 100 * r.gbps / memcpy_rate);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help") {
    fprintf(stderr, "usage: px-bench local [--json] [--daemon PATH] [--iterations N]\n");
    return argc < 2 ? 2 : 0;
  }
  std::string scenario = argv[1];
  bool json = false;
  std::string daemon_path = default_daemon_path();
  int iterations = 5000;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json")
      json = true;
    else if (a == "--daemon" && i + 1 < argc)
      daemon_path = argv[++i];
    else if (a == "--iterations" && i + 1 < argc)
      iterations = std::max(10, atoi(argv[++i]));
    else
      die("unknown option " + a);
  }
  if (scenario == "local") return bench_local(json, daemon_path, iterations);
  die("unknown scenario '" + scenario + "' (this build has: local)");
}
