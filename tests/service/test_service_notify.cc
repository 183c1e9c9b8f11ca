// parallaxd and systemd: readiness, watchdog and stopping through a real NOTIFY_SOCKET
// (a datagram socket the test owns, as systemd's), and SIGHUP reopening the log file.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tests/service/service_util.h"

using namespace pxt;

namespace {

// What systemd would receive: one datagram per sd_notify call.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
    REQUIRE(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    timeval tv{0, 50000};  // recv gives up after 50 ms, so every wait keeps its deadline
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~NotifySocket() {
    close(fd_);
    unlink(path_.c_str());
  }
  // The next datagram within timeout_ms, or "".
  std::string next(int timeout_ms) {
    int64_t deadline = monotonic_ms() + timeout_ms;
    char buffer[4096];
    while (monotonic_ms() < deadline) {
      ssize_t n = recv(fd_, buffer, sizeof buffer, 0);
      if (n > 0) return std::string(buffer, static_cast<size_t>(n));
    }
    return "";
  }
  // Waits up to timeout_ms for a datagram containing part; every datagram read is kept.
  bool wait_for(const std::string& part, int timeout_ms) {
    int64_t deadline = monotonic_ms() + timeout_ms;
    while (monotonic_ms() < deadline) {
      std::string d = next(static_cast<int>(deadline - monotonic_ms()));
      if (d.empty()) continue;
      seen.push_back(d);
      if (contains(d, part)) return true;
    }
    return false;
  }
  std::vector<std::string> seen;

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace

TEST_CASE("service: READY=1 once the socket accepts, WATCHDOG=1 every half interval, STOPPING=1") {
  ScratchDir scratch("svc-notify");
  std::string socket = scratch.path() + "/d.sock";
  NotifySocket notify(scratch.path() + "/notify");
  std::string log = scratch.path() + "/daemon.out";
  // 200 ms watchdog: systemd's WATCHDOG_USEC; pings every 100 ms.
  pid_t pid = spawn_process(
      {PX_DAEMON_PATH, "--foreground", "--socket", socket, "--threads", "2"},
      {{"NOTIFY_SOCKET", scratch.path() + "/notify"}, {"WATCHDOG_USEC", "200000"}}, log);
  REQUIRE(notify.wait_for("READY=1", 10000));
  // Ready means workers can connect: at once, with no retry.
  int fd = connect_unix(socket);
  CHECK(fd >= 0);
  if (fd >= 0) close(fd);
  CHECK(contains(notify.seen.back(), "STATUS=0 jobs, 0 workers"));
  // Pings keep coming while the loop runs: at least 5 in one second (10 expected).
  int pings = 0;
  int64_t until = monotonic_ms() + 1000;
  while (monotonic_ms() < until) {
    std::string d = notify.next(static_cast<int>(until - monotonic_ms()));
    if (contains(d, "WATCHDOG=1")) ++pings;
  }
  CHECK(pings >= 5);
  CHECK(pings <= 15);
  // A stopped loop (SIGSTOP: what a hung one looks like to systemd) stops pinging.
  kill(pid, SIGSTOP);
  while (!notify.next(150).empty()) {
  }  // pings sent before the stop
  std::string during = notify.next(600);
  CHECK(during.empty());
  kill(pid, SIGCONT);
  CHECK(notify.wait_for("WATCHDOG=1", 2000));

  kill(pid, SIGTERM);
  CHECK(notify.wait_for("STOPPING=1", 5000));
  CHECK(wait_for_exit(pid, 10000) == 0);
  std::string text = read_text(log);
  CHECK(contains(text, "told systemd the daemon is ready (watchdog every 100 ms)"));
  CHECK(contains(text, "SIGTERM: draining"));
}

TEST_CASE("service: without NOTIFY_SOCKET nothing is sent and the daemon runs as before") {
  DaemonProcess daemon("svc-nonotify");
  CHECK(!contains(daemon.log(), "told systemd"));
  CHECK(daemon.kill_and_reap(SIGTERM) == 0);
}

TEST_CASE("service: SIGHUP reopens log.file after logrotate renamed it") {
  ScratchDir scratch("svc-hup");
  std::string log = scratch.path() + "/parallaxd.log";
  DaemonProcess daemon("svc-hup", {"--log-file", log});
  REQUIRE(wait_for_text(log, "listening on", 5000));
  // stderr itself went to the file: nothing is left for the captured output.
  CHECK(!contains(daemon.log(), "listening on"));
  REQUIRE(rename(log.c_str(), (log + ".1").c_str()) == 0);
  kill(daemon.pid(), SIGHUP);
  REQUIRE(wait_for_text(log, "SIGHUP: reopened the log file " + log, 5000));
  // Later lines go to the new file only.
  CHECK(daemon.kill_and_reap(SIGTERM) == 0);
  std::string rotated = read_text(log + ".1"), fresh = read_text(log);
  CHECK(contains(rotated, "listening on"));
  CHECK(!contains(rotated, "reopened"));
  CHECK(contains(fresh, "SIGTERM: draining"));
  CHECK(!contains(fresh, "listening on"));
}

TEST_CASE("service: SIGHUP without a log file is logged and harmless") {
  DaemonProcess daemon("svc-hup-stderr");
  kill(daemon.pid(), SIGHUP);
  int64_t deadline = monotonic_ms() + 5000;
  while (!contains(daemon.log(), "no log file to reopen") && monotonic_ms() < deadline)
    usleep(10000);
  CHECK(contains(daemon.log(), "SIGHUP: logging to stderr, no log file to reopen"));
  CHECK(daemon.alive());
  CHECK(daemon.kill_and_reap(SIGTERM) == 0);
}

TEST_CASE("service: with stderr the journal's stream, lines about a job carry PX_* fields") {
  // systemd sets JOURNAL_STREAM to the device:inode of the stream it gives a service as
  // stderr; sd_journal_send writes native-protocol datagrams to this socket. The test plays
  // journald where none runs (as in CI); on a machine whose journald owns the socket it
  // cannot, and says so.
  const std::string journal_socket = "/run/systemd/journal/socket";
  if (access(journal_socket.c_str(), F_OK) == 0) {
    MESSAGE("skipped: a journald owns " << journal_socket);
    return;
  }
  mkdir("/run/systemd", 0755);
  mkdir("/run/systemd/journal", 0755);
  NotifySocket journal(journal_socket);
  ScratchDir scratch("svc-journal");
  std::string socket = scratch.path() + "/d.sock";
  std::string log = scratch.path() + "/daemon.out";
  write_text_file(log, "");
  struct stat st {};
  REQUIRE(stat(log.c_str(), &st) == 0);  // the daemon's stderr: this file (same inode)
  std::string stream = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  pid_t pid = spawn_process({PX_DAEMON_PATH, "--foreground", "--socket", socket, "--threads", "2"},
                            {{"JOURNAL_STREAM", stream}}, log);
  REQUIRE(wait_until_accepting(socket, 10000));
  auto results = run_service_workers(socket, "journaled", 1, {"verify", "0", "1"});
  CHECK(all_ok(results));
  // The table's line: MESSAGE with the logfmt suffix, and the fields apart.
  CHECK(journal.wait_for("PX_VARIABLE=emb\n", 10000));
  const std::string& table = journal.seen.back();
  CHECK(contains(table, "MESSAGE=variable 'emb' of job 'journaled': "));
  CHECK(contains(table, "| job=journaled variable=emb node=0\n"));
  CHECK(contains(table, "PRIORITY=6\n"));
  CHECK(contains(table, "SYSLOG_IDENTIFIER=parallaxd\n"));
  CHECK(contains(table, "PX_JOB=journaled\n"));
  CHECK(contains(table, "PX_NODE=0\n"));
  // A worker's line names it.
  bool worker_line = false;
  for (auto& d : journal.seen) worker_line = worker_line || contains(d, "PX_RANK=0\nPX_PID=");
  CHECK(worker_line);
  // Lines about nothing in particular stay plain on stderr.
  CHECK(contains(read_text(log), "listening on " + socket));
  kill(pid, SIGTERM);
  CHECK(wait_for_exit(pid, 30000) == 0);
  unlink(journal_socket.c_str());
}
