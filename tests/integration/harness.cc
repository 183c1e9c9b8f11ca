#include "tests/integration/harness.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace pxt {

std::atomic<bool> g_check_failed{false};

std::string program_path(const char* name, const char* built) {
  const char* path = getenv(name);
  return path && *path ? path : built;
}

void print_unclean_exit(const std::string& message) {
  fprintf(stderr, "%s\n", message.c_str());
}
void (*g_unclean_exit)(const std::string& message) = print_unclean_exit;

pid_t spawn_process(const std::vector<std::string>& argv,
                    const std::map<std::string, std::string>& env, const std::string& output_path) {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid != 0) return pid;
  // A test process that crashes (a sanitizer abort) must not leave its daemons and workers
  // running: they would hold ctest's output pipe open until the test's timeout. Children
  // are always reaped by the thread that spawned them, so the thread-based signal is safe.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
  for (auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  int fd = open(output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    close(fd);
  }
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}

namespace {

// Tests run workers from several threads (one per node), each naming its files.
std::atomic<int> g_counter{0};

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool can_connect(const std::string& path) {
  int fd = connect_unix(path);
  if (fd >= 0) close(fd);
  return fd >= 0;
}

// Waits for pid until deadline; kills it at the deadline. Returns the exit code.
int reap(pid_t pid, int64_t deadline_ms) {
  for (;;) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (now_ms() >= deadline_ms) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The last `lines` lines of a daemon's log, on stderr, after a failed check.
void print_log_tail(const std::string& path, size_t lines) {
  std::string text = slurp(path);
  size_t start = text.size();
  for (size_t seen = 0; start > 0 && seen <= lines; --start)
    if (text[start - 1] == '\n') ++seen;
  fprintf(stderr, "--- a check failed: the end of %s ---\n%s--- end of %s ---\n", path.c_str(),
          text.c_str() + start, path.c_str());
}

std::string unique_path(const std::string& tag, const char* suffix) {
  return "/tmp/pxt-" + tag + "-" + std::to_string(getpid()) + "-" + std::to_string(g_counter++) +
         suffix;
}

// Starts one px_test_worker (or env's PX_WORKER_PROGRAM) ARGS... as local rank `rank` of local_size
// on the daemon at socket; its output goes to a new file named after tag, added to outputs.
pid_t spawn_worker(const std::string& socket, const std::string& job, int rank, int local_size,
                   const std::vector<std::string>& args,
                   const std::map<std::string, std::string>& env, const std::string& tag,
                   std::vector<std::string>& outputs) {
  std::map<std::string, std::string> e = env;
  e["PARALLAX_SOCKET"] = socket;
  e["PARALLAX_JOB"] = job;
  e["PARALLAX_LOCAL_RANK"] = std::to_string(rank);
  e["PARALLAX_LOCAL_SIZE"] = std::to_string(local_size);
  // PX_WORKER_PROGRAM in env: another worker program (the GPU tests' px_gpu_worker).
  auto program = env.find("PX_WORKER_PROGRAM");
  std::vector<std::string> argv = {
      program != env.end() ? program->second : program_path("PX_TEST_WORKER", PX_WORKER_PATH)};
  argv.insert(argv.end(), args.begin(), args.end());
  outputs.push_back(unique_path(tag, ".out"));
  return spawn_process(argv, e, outputs.back());
}

// Waits for every worker (killing those past the deadline) and reads their output.
std::vector<WorkerResult> collect_workers(const std::vector<pid_t>& pids,
                                          const std::vector<std::string>& outputs,
                                          int64_t deadline_ms) {
  std::vector<WorkerResult> results;
  for (size_t i = 0; i < pids.size(); ++i) {
    WorkerResult r;
    r.exit_code = reap(pids[i], deadline_ms);
    r.output = slurp(outputs[i]);
    unlink(outputs[i].c_str());
    results.push_back(r);
  }
  return results;
}

}  // namespace

DaemonProcess::DaemonProcess(const std::string& tag, const std::vector<std::string>& extra_args,
                             bool wait_ready, const std::vector<std::string>& launcher) {
  socket_ = unique_path(tag, ".sock");
  log_path_ = unique_path(tag, ".log");
  std::vector<std::string> argv = launcher;
  argv.insert(argv.end(), {program_path("PX_TEST_DAEMON", PX_DAEMON_PATH), "--foreground",
                           "--socket", socket_, "--threads", "2"});
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  pid_ = spawn_process(argv, {}, log_path_);
  if (!wait_ready) return;
  int64_t deadline = now_ms() + 10000;
  while (!can_connect(socket_)) {
    if (now_ms() > deadline || !alive())
      throw std::runtime_error("parallaxd did not start: " + log());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

int DaemonProcess::kill_and_reap(int signal) {
  kill(pid_, signal);
  int code = reap(pid_, now_ms() + 10000);
  pid_ = -1;
  return code;
}

int DaemonProcess::wait_exit(int timeout_ms) {
  int64_t deadline = now_ms() + timeout_ms;
  while (now_ms() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    int code = reap(pid_, now_ms() + 5000);
    if (code != 0)
      g_unclean_exit("parallaxd (log " + log_path_ + ") did not exit cleanly on SIGTERM: " +
                     (code < 0 ? std::string("still running after 5 s, killed")
                               : "exit code " + std::to_string(code)));
  }
  unlink(socket_.c_str());
  if (g_check_failed.load()) print_log_tail(log_path_, 60);
  if (!getenv("PX_TEST_KEEP_LOGS")) unlink(log_path_.c_str());
}

bool DaemonProcess::alive() const {
  int status;
  return waitpid(pid_, &status, WNOHANG) == 0;
}

std::string DaemonProcess::log() const {
  return slurp(log_path_);
}

int DaemonProcess::open_fds() const {
  std::string dir = "/proc/" + std::to_string(pid_) + "/fd";
  DIR* d = opendir(dir.c_str());
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

int DaemonProcess::arena_mappings() const {
  std::ifstream maps("/proc/" + std::to_string(pid_) + "/maps");
  std::string line;
  int n = 0;
  while (std::getline(maps, line)) n += line.find("parallax-arena") != std::string::npos;
  return n;
}

int DaemonProcess::idle_fds() const {
  int last = open_fds();
  for (int stable = 0, i = 0; stable < 5 && i < 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    int now = open_fds();
    stable = now == last ? stable + 1 : 0;
    last = now;
  }
  return last;
}

bool DaemonProcess::settles_to(int fds, int maps, int timeout_ms) const {
  int64_t deadline = now_ms() + timeout_ms;
  while (now_ms() < deadline) {
    if (open_fds() == fds && arena_mappings() == maps) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

std::vector<WorkerResult> run_workers(const DaemonProcess& daemon, const std::string& job,
                                      int local_size, const std::vector<std::string>& args,
                                      int timeout_ms,
                                      const std::map<std::string, std::string>& env) {
  std::vector<pid_t> pids;
  std::vector<std::string> outputs;
  for (int rank = 0; rank < local_size; ++rank)
    pids.push_back(spawn_worker(daemon.socket(), job, rank, local_size, args, env,
                                job + "-w" + std::to_string(rank), outputs));
  return collect_workers(pids, outputs, now_ms() + timeout_ms);
}

int connect_unix(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
  close(fd);
  return -1;
}

sockaddr_in loopback_address(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

bool same_field(const std::vector<WorkerResult>& results, const std::string& key) {
  std::set<std::string> values;
  for (auto& r : results) values.insert(field(r.output, key));
  bool same = values.size() == 1 && !values.begin()->empty();
  if (!same) {
    std::string seen;
    for (auto& v : values) seen += " '" + v + "'";
    fprintf(stderr, "workers printed %zu different %s=:%s\n", values.size(), key.c_str(),
            seen.c_str());
  }
  return same;
}

bool log_says(const DaemonProcess& daemon, const std::string& what, int timeout_ms) {
  for (int waited = 0; waited < timeout_ms; waited += 50) {
    if (contains(daemon.log(), what)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

bool all_ok(const std::vector<WorkerResult>& results) {
  bool ok = true;
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].exit_code != 0) {
      ok = false;
      fprintf(stderr, "worker %zu exited %d:\n%s\n", i, results[i].exit_code,
              results[i].output.c_str());
    }
  }
  return ok;
}

}  // namespace pxt

namespace pxt {

std::vector<std::string> ClusterProcesses::free_endpoints(int n) {
  // Random free ports below the kernel's ephemeral range (32768+): a port handed out for
  // port 0 could be taken, before the daemon binds it, by the ephemeral listener of another
  // test's libfabric endpoint or by any outgoing connection.
  static std::mt19937 rng(
      static_cast<unsigned>(getpid()) ^
      static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::vector<int> fds;
  std::vector<std::string> endpoints;
  while (static_cast<int>(endpoints.size()) < n) {
    int port = 20000 + static_cast<int>(rng() % 12000);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr = loopback_address(port);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      close(fd);
      continue;
    }
    endpoints.push_back("127.0.0.1:" + std::to_string(port));
    fds.push_back(fd);
  }
  for (int fd : fds) close(fd);
  return endpoints;
}

std::vector<std::string> ClusterProcesses::node_args(const std::string& cluster,
                                                     const std::vector<std::string>& endpoints,
                                                     int index) {
  std::string nodes;
  for (auto& e : endpoints) nodes += (nodes.empty() ? "" : ",") + e;
  return {"--cluster",
          cluster,
          "--node-index",
          std::to_string(index),
          "--nodes",
          nodes,
          "--fabric-provider",
          "tcp;ofi_rxm",
          "--startup-timeout-ms",
          "20000"};
}

ClusterProcesses::ClusterProcesses(const std::string& tag, int nodes,
                                   const std::vector<std::string>& extra_args)
    : tag_(tag), endpoints_(free_endpoints(nodes)) {
  args_of_ = [tag, endpoints = endpoints_, extra_args](int i) {
    auto args = node_args(tag, endpoints, i);
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    return args;
  };
  for (int i = 0; i < nodes; ++i)
    nodes_.push_back(std::make_unique<DaemonProcess>(tag + "-n" + std::to_string(i), args_of_(i)));
}

ClusterProcesses::ClusterProcesses(const std::string& tag, int nodes, ArgsOf args_of)
    : tag_(tag), args_of_(std::move(args_of)), endpoints_(free_endpoints(nodes)) {
  for (int i = 0; i < nodes; ++i)
    nodes_.push_back(std::make_unique<DaemonProcess>(tag + "-n" + std::to_string(i), args_of_(i)));
}

ClusterProcesses::ClusterProcesses(const std::string& tag, int nodes, ArgsOf args_of,
                                   LauncherOf launcher_of)
    : tag_(tag),
      args_of_(std::move(args_of)),
      launcher_of_(std::move(launcher_of)),
      endpoints_(free_endpoints(nodes)) {
  for (int i = 0; i < nodes; ++i)
    nodes_.push_back(std::make_unique<DaemonProcess>(tag + "-n" + std::to_string(i), args_of_(i),
                                                     true, launcher_of_(i)));
}

void ClusterProcesses::restart(int i) {
  nodes_[static_cast<size_t>(i)] = std::make_unique<DaemonProcess>(
      tag_ + "-n" + std::to_string(i) + "r" + std::to_string(++restarts_), args_of_(i), true,
      launcher_of_(i));
}

std::vector<WorkerResult> run_cluster_workers(ClusterProcesses& cluster, const std::string& job,
                                              int per_node, const std::vector<std::string>& args,
                                              int timeout_ms,
                                              const std::map<std::string, std::string>& env) {
  std::vector<int> nodes;
  for (int node = 0; node < cluster.size(); ++node) nodes.push_back(node);
  return run_workers_on(cluster, nodes, job, per_node, args, timeout_ms, env);
}

std::vector<WorkerResult> run_workers_on(ClusterProcesses& cluster, const std::vector<int>& nodes,
                                         const std::string& job, int per_node,
                                         const std::vector<std::string>& args, int timeout_ms,
                                         const std::map<std::string, std::string>& env) {
  std::vector<pid_t> pids;
  std::vector<std::string> outputs;
  for (int node : nodes) {
    for (int rank = 0; rank < per_node; ++rank)
      pids.push_back(spawn_worker(cluster.node(node).socket(), job, rank, per_node, args, env,
                                  job + "-n" + std::to_string(node) + "w" + std::to_string(rank),
                                  outputs));
  }
  return collect_workers(pids, outputs, now_ms() + timeout_ms);
}

ScratchDir::ScratchDir(const std::string& name)
    : path_("/tmp/pxt-" + name + "-" + std::to_string(getpid())) {
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

ScratchDir::~ScratchDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

KilledNodeRun run_cluster_workers_killing_node(ClusterProcesses& cluster, const std::string& job,
                                               int per_node, const std::vector<std::string>& args,
                                               int victim, int timeout_ms) {
  KilledNodeRun run;
  ScratchDir ready("ready-" + job);
  std::thread workers([&] {
    run.results = run_cluster_workers(cluster, job, per_node, args, timeout_ms,
                                      {{"PX_TEST_READY_DIR", ready.path()}});
  });
  // The loss comes mid-run: once every node's worker has completed a step.
  run.ready_nodes = wait_for_ready_files(ready.path(), cluster.size(), 60000);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  cluster.node(victim).kill_and_reap(SIGKILL);
  workers.join();
  return run;
}

int wait_for_ready_files(const std::string& dir, int n, int timeout_ms) {
  auto ready = [&] {
    int count = 0;
    for (int i = 0; i < n; ++i) count += access((dir + "/" + std::to_string(i)).c_str(), F_OK) == 0;
    return count;
  };
  for (int waited = 0; waited < timeout_ms && ready() < n; waited += 20)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return ready();
}

}  // namespace pxt
