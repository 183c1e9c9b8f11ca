// Starts real parallaxd and worker processes for the integration tests. Every test gets
// its own socket path and log file, so tests run in parallel.
#pragma once

#include <netinet/in.h>
#include <sys/types.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/integration/text_util.h"  // contains, field

namespace pxt {

// Set once a check of this test process failed (failure_logs.cc, in the doctest programs):
// daemons then print the end of their logs as they stop.
extern std::atomic<bool> g_check_failed;
// Called when a daemon a DaemonProcess still owns does not exit with 0 on the SIGTERM of its
// destructor (a crash, a hang, a sanitizer's report at exit): failure_logs.cc makes it a
// failed check of the running test; px_fault_suite's prints it.
extern void (*g_unclean_exit)(const std::string& message);

// The program at environment variable `name` if set, else `built` (the build tree's). The
// GPU kit (tools/gpu-kit) sets PX_TEST_DAEMON, PX_TEST_WORKER and PX_TEST_GPU_WORKER.
std::string program_path(const char* name, const char* built);

class DaemonProcess {
 public:
  // Starts parallaxd --foreground on a fresh socket and waits until it accepts.
  // wait_ready: wait until the socket accepts (false for daemons expected to fail early).
  // launcher: a command that runs it, such as {"/usr/sbin/ip", "netns", "exec", NS} (it must
  // exec the daemon, so that pid() is the daemon's).
  explicit DaemonProcess(const std::string& tag, const std::vector<std::string>& extra_args = {},
                         bool wait_ready = true, const std::vector<std::string>& launcher = {});
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
  // Sends signal and waits for the exit; returns the exit code (128+N for signal N).
  int kill_and_reap(int signal);
  // Waits up to timeout_ms for the daemon to exit by itself; -1 if it did not.
  int wait_exit(int timeout_ms);

 private:
  std::string socket_;
  std::string log_path_;
  pid_t pid_ = -1;
};

// K daemons forming one cluster on loopback, each with its own socket and control port.
class ClusterProcesses {
 public:
  ClusterProcesses(const std::string& tag, int nodes,
                   const std::vector<std::string>& extra_args = {});
  // Daemons started with args_of(i) each (membership on etcd: no node list, no index).
  using ArgsOf = std::function<std::vector<std::string>(int)>;
  ClusterProcesses(const std::string& tag, int nodes, ArgsOf args_of);
  // The same, each daemon started through launcher_of(i) (see DaemonProcess).
  using LauncherOf = std::function<std::vector<std::string>(int)>;
  ClusterProcesses(const std::string& tag, int nodes, ArgsOf args_of, LauncherOf launcher_of);
  DaemonProcess& node(int i) { return *nodes_[static_cast<size_t>(i)]; }
  int size() const { return static_cast<int>(nodes_.size()); }
  // The nodes' control endpoints, by index ("127.0.0.1:PORT"; node 0's is the coordinator's).
  const std::vector<std::string>& endpoints() const { return endpoints_; }
  // The flags a daemon needs to be node `index` of this cluster.
  static std::vector<std::string> node_args(const std::string& cluster,
                                            const std::vector<std::string>& endpoints, int index);
  static std::vector<std::string> free_endpoints(int n);
  // Starts node i again with its flags (after it died or was killed): its control port is
  // the same, its socket and fabric endpoint are new.
  void restart(int i);

 private:
  std::string tag_;
  ArgsOf args_of_;
  LauncherOf launcher_of_ = [](int) { return std::vector<std::string>{}; };
  int restarts_ = 0;
  std::vector<std::unique_ptr<DaemonProcess>> nodes_;
  std::vector<std::string> endpoints_;
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

// Runs per_node workers of job on every node of the cluster; results node-major.
std::vector<WorkerResult> run_cluster_workers(ClusterProcesses& cluster, const std::string& job,
                                              int per_node, const std::vector<std::string>& args,
                                              int timeout_ms = 120000,
                                              const std::map<std::string, std::string>& env = {});
// The same on some of the cluster's daemons only (the survivors of a lost one).
std::vector<WorkerResult> run_workers_on(ClusterProcesses& cluster, const std::vector<int>& nodes,
                                         const std::string& job, int per_node,
                                         const std::vector<std::string>& args,
                                         int timeout_ms = 120000,
                                         const std::map<std::string, std::string>& env = {});

// A directory of its own under /tmp for one test (name plus the test process's pid),
// removed with everything in it when the test ends, however it ends.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name);
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Waits (up to timeout_ms) until files dir/0 .. dir/(n-1) exist; returns how many do.
int wait_for_ready_files(const std::string& dir, int n, int timeout_ms);

// Waits (up to timeout_ms) until the daemon's log contains what.
bool log_says(const DaemonProcess& daemon, const std::string& what, int timeout_ms);

// Every worker exited 0 (prints the outputs otherwise, for the test log).
bool all_ok(const std::vector<WorkerResult>& results);

// Every worker printed the same, non-empty key=VALUE (field()): e.g. a hash of its result.
bool same_field(const std::vector<WorkerResult>& results, const std::string& key);

struct KilledNodeRun {
  std::vector<WorkerResult> results;  // node-major, as run_cluster_workers gives them
  int ready_nodes = 0;                // nodes that reported a first step before the kill
};

// Runs per_node workers of job on every node of the cluster with a scenario that reports
// its first completed step in PX_TEST_READY_DIR (until-lost); once every node did (up to
// 60 s) and 200 ms more, SIGKILLs node `victim` and reaps it, then waits for the workers.
KilledNodeRun run_cluster_workers_killing_node(ClusterProcesses& cluster, const std::string& job,
                                               int per_node, const std::vector<std::string>& args,
                                               int victim, int timeout_ms = 90000);

// Starts argv with env added to this process's environment; stdout and stderr go to
// output_path. The child dies with the test process (PR_SET_PDEATHSIG).
pid_t spawn_process(const std::vector<std::string>& argv,
                    const std::map<std::string, std::string>& env, const std::string& output_path);
// A connected AF_UNIX stream socket to path, or -1 (nothing listens there).
int connect_unix(const std::string& path);

// 127.0.0.1:port.
sockaddr_in loopback_address(int port);

}  // namespace pxt
