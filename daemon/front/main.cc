// parallaxd: the per-node communication daemon.
#include <fcntl.h>
#include <grp.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "daemon/cluster/etcd_membership.h"
#include "daemon/common/log.h"
#include "daemon/front/config.h"
#include "daemon/front/server.h"
#include "parallax_c.h"

namespace {

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

// --check-config: what parse_command_line did not already refuse, then one line.
int check_config(const px::DaemonConfig& config) {
  if (!config.group.empty() && !getgrnam(config.group.c_str())) {
    fprintf(stderr, "parallaxd: group: '%s' does not exist\n", config.group.c_str());
    return 2;
  }
  printf("parallaxd: configuration OK (socket %s, %d node%s%s%s)\n", config.socket_path.c_str(),
         config.node_count, config.node_count == 1 ? "" : "s",
         config.drain_checkpoint_dir.empty() ? "" : ", drain checkpoints in ",
         config.drain_checkpoint_dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  px::DaemonConfig config = px::parse_command_line(argc, argv);
  if (config.check_only) return check_config(config);
  px::set_log_level(config.log_level);
  px::set_log_node(config.node_index);
  std::string log_error;
  if (!config.log_file.empty() && !px::open_log_file(config.log_file, &log_error)) {
    fprintf(stderr, "parallaxd: log.file: %s\n", log_error.c_str());
    return 1;
  }
  // Sparse steps allocate and free buffers of megabytes every step; glibc would mmap and
  // munmap each one, paying page faults and zeroing every step. Keep them in the heap.
  // glibc refuses an mmap threshold above 32 MiB (half its arena heap size), and fixing
  // the trim threshold alone would pin the mmap threshold at its 128 KiB default. Set
  // after the configuration is checked, so a refused start prints its one line alone
  // (under the sanitizers, whose allocator refuses mallopt, this warns every start).
  if (mallopt(M_MMAP_THRESHOLD, 32 << 20) != 1 || mallopt(M_TRIM_THRESHOLD, 1 << 30) != 1)
    PX_LOG_WARN("mallopt refused the heap settings; sparse steps will be slower");
  int ready_fd = -1;
  if (!config.foreground) detach(&ready_fd);
  // Libraries that libfabric's providers load as fi_getinfo initializes them (PSM's
  // libinfinipath) install SIGINT/SIGTERM handlers that call exit(), which then waits
  // forever for the libfabric lock that very fi_getinfo holds: a daemon stopped during its
  // start hung (seen when a test stopped a forming cluster). SIGHUP's default action ends
  // the process: a daemon sent it while starting (logrotate) died. The signals the daemon
  // handles stay blocked, in this thread and every thread started from it, until
  // Server::run() has installed its own handlers; a signal sent meanwhile is delivered then.
  sigset_t handled = px::Server::handled_signals();
  pthread_sigmask(SIG_BLOCK, &handled, nullptr);
  // Membership on etcd: this node's index comes from there, before anything uses it. After
  // detach() (the lease's keep-alive thread must be the daemon's, not the parent's) and
  // after the handled signals are blocked (that thread must not take them either).
  std::unique_ptr<px::EtcdMembership> membership;
  if (!config.membership.empty()) {
    px::EtcdMembership::Settings settings;
    settings.url = config.membership;
    settings.address = config.listen;
    settings.node_count = px::cluster_indices(config);
    settings.lease_s = config.membership_lease_s;
    settings.startup_timeout_ms = config.startup_timeout_ms;
    std::string error;
    membership = px::EtcdMembership::register_node(settings, &config.node_index, &error);
    if (!membership) {
      PX_LOG_ERROR("%s", error.c_str());
      return 1;
    }
    px::set_log_node(config.node_index);
  }
  px::Server server(config, std::move(membership));
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
