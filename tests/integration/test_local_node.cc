// Integration tests on one node: a real parallaxd, real worker processes, real shared memory.
#include <doctest/doctest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "tests/integration/harness.h"

using namespace pxt;

namespace {

int raw_connect(const std::string& path) {
  int fd = connect_unix(path);
  REQUIRE(fd >= 0);
  return fd;
}

// True if the daemon closes fd within timeout_ms.
bool closed_by_peer(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return false;
  char buf[256];
  return recv(fd, buf, sizeof buf, 0) <= 0;
}

}  // namespace

TEST_CASE("allreduce: every dtype, op and memory mode at small sizes, 2 workers") {
  DaemonProcess daemon("sweep2");
  CHECK(all_ok(run_workers(daemon, "sweep2", 2, {"sweep", "--counts", "1,7,1000,65537"})));
}

TEST_CASE("allreduce: every dtype, op and memory mode, 3 workers") {
  DaemonProcess daemon("sweep3");
  CHECK(all_ok(run_workers(daemon, "sweep3", 3, {"sweep", "--counts", "1,4099,300000"})));
}

TEST_CASE("allreduce: every dtype, op and memory mode, 4 workers") {
  DaemonProcess daemon("sweep4");
  CHECK(all_ok(run_workers(daemon, "sweep4", 4, {"sweep", "--counts", "3,20000"})));
}

TEST_CASE("allreduce: 64 MiB across 2 and 4 workers, arena and ordinary memory") {
  DaemonProcess daemon("big");
  std::map<std::string, std::string> env = {{"PX_TEST_ARENA_BYTES", std::to_string(160ull << 20)}};
  CHECK(all_ok(run_workers(daemon, "big-f32", 2,
                           {"allreduce", "--dtype", "f32", "--op", "sum", "--count", "16777216",
                            "--memory", "arena", "--steps", "2"},
                           240000, env)));
  CHECK(all_ok(run_workers(daemon, "big-bf16", 4,
                           {"allreduce", "--dtype", "bf16", "--op", "mean", "--count", "33554432",
                            "--memory", "ordinary", "--steps", "1"},
                           240000, env)));
  CHECK(all_ok(run_workers(daemon, "big-i64", 2,
                           {"allreduce", "--dtype", "i64", "--op", "max", "--count", "8388608",
                            "--memory", "inplace-arena", "--steps", "1"},
                           240000, env)));
}

TEST_CASE("allreduce: many variables submitted in different orders, several steps in flight") {
  DaemonProcess daemon("shuffle");
  CHECK(all_ok(run_workers(daemon, "shuffle4", 4, {"shuffle", "--vars", "24", "--steps", "4"})));
  CHECK(all_ok(run_workers(daemon, "shuffle2", 2, {"shuffle", "--vars", "60", "--steps", "8"})));
}

TEST_CASE("barrier: repeated barriers across 4 workers") {
  DaemonProcess daemon("barrier");
  CHECK(all_ok(run_workers(daemon, "barrier", 4, {"barriers", "--count", "200"})));
}

TEST_CASE(
    "failure: a worker killed mid-step gives PX_ERR_PEER_LOST and its memory and fds are "
    "reclaimed") {
  DaemonProcess daemon("crash");
  int base_fds = daemon.idle_fds();
  REQUIRE(base_fds > 0);
  auto results = run_workers(daemon, "crash", 2, {"crash"}, 60000);
  CHECK(results[0].exit_code == 0);
  CHECK(results[1].exit_code == 128 + 9);
  CHECK(contains(results[0].output, "OK crash"));
  if (results[0].exit_code != 0) MESSAGE(results[0].output);
  CHECK(daemon.settles_to(base_fds, 0, 5000));
  CHECK(contains(daemon.log(), "lost its connection"));
  // The daemon still serves new jobs.
  CHECK(all_ok(run_workers(daemon, "after-crash", 2,
                           {"allreduce", "--dtype", "f32", "--op", "sum", "--count", "1000",
                            "--memory", "arena", "--steps", "3"})));
  CHECK(daemon.settles_to(base_fds, 0, 5000));
}

TEST_CASE(
    "failure: the same variable registered with another dtype is PX_ERR_MISMATCH for everyone") {
  DaemonProcess daemon("mismatch");
  auto results = run_workers(daemon, "mismatch", 2, {"mismatch"}, 60000);
  CHECK(all_ok(results));
}

TEST_CASE("failure: a client of another ABI major is refused at connect, naming both versions") {
  DaemonProcess daemon("abi");
  auto results = run_workers(daemon, "abi", 1, {"abi"}, 30000);
  CHECK(all_ok(results));
  CHECK(contains(daemon.log(), "client ABI 2.0 is not supported"));
}

TEST_CASE("failure: a wait past its deadline is PX_ERR_TIMEOUT and the request can be freed") {
  DaemonProcess daemon("timeout");
  CHECK(all_ok(run_workers(daemon, "timeout", 2, {"timeout"}, 60000)));
}

TEST_CASE("failure: bad arguments are refused with clear errors") {
  DaemonProcess daemon("errors");
  CHECK(all_ok(run_workers(daemon, "errors", 1, {"errors"}, 30000)));
}

TEST_CASE("failure: garbage and truncated bytes on the socket drop that connection only") {
  DaemonProcess daemon("garbage");
  int base_fds = daemon.idle_fds();
  {
    int fd = raw_connect(daemon.socket());
    const char junk[] = "\xff\xff\xff\x7fthis is not a frame";
    REQUIRE(send(fd, junk, sizeof junk, 0) > 0);
    CHECK(closed_by_peer(fd, 5000));
    close(fd);
  }
  {
    int fd = raw_connect(daemon.socket());
    unsigned char frame[4 + 16] = {16, 0, 0, 0};
    for (int i = 4; i < 20; ++i) frame[i] = static_cast<unsigned char>(i * 37);
    REQUIRE(send(fd, frame, sizeof frame, 0) > 0);
    CHECK(closed_by_peer(fd, 5000));
    close(fd);
  }
  {
    int fd = raw_connect(daemon.socket());
    unsigned char truncated[4 + 10] = {100, 0, 0, 0, 1, 2, 3};
    REQUIRE(send(fd, truncated, sizeof truncated, 0) > 0);
    close(fd);  // the daemon must forget the half frame
  }
  CHECK(daemon.settles_to(base_fds, 0, 5000));
  std::string log = daemon.log();
  CHECK(contains(log, "malformed control stream"));
  CHECK(contains(log, "malformed control message"));
  CHECK(all_ok(run_workers(daemon, "after-garbage", 2,
                           {"allreduce", "--dtype", "i32", "--op", "sum", "--count", "100",
                            "--memory", "ordinary", "--steps", "2"})));
}

TEST_CASE("daemon: a second parallaxd on the same socket is refused") {
  DaemonProcess daemon("twice");
  bool threw = false;
  try {
    DaemonProcess second_on_same_socket("twice-b", {"--socket", daemon.socket()});
  } catch (const std::exception&) {
    threw = true;
  }
  // The later --socket wins on the command line, so the second daemon tries our socket:
  // it must refuse instead of stealing it, and ours must keep serving.
  CHECK(threw);
  CHECK(daemon.alive());
  CHECK(all_ok(run_workers(daemon, "twice", 1,
                           {"allreduce", "--dtype", "f64", "--op", "min", "--count", "10",
                            "--memory", "arena", "--steps", "1"})));
}

// While it lives, daemons started by this process have a listen() that pauses 300 ms first (a
// preloaded shim, slow_listen.cc): a window in the start that tests can aim at.
class SlowListen {
 public:
  SlowListen() : asan_(getenv("ASAN_OPTIONS") ? getenv("ASAN_OPTIONS") : "") {
    setenv("LD_PRELOAD", PX_SLOW_LISTEN_PATH, 1);
    // An ASan daemon insists on its runtime coming first in the library list.
    std::string options = asan_ + (asan_.empty() ? "" : ":") + "verify_asan_link_order=0";
    setenv("ASAN_OPTIONS", options.c_str(), 1);
  }
  ~SlowListen() {
    unsetenv("LD_PRELOAD");
    if (asan_.empty())
      unsetenv("ASAN_OPTIONS");
    else
      setenv("ASAN_OPTIONS", asan_.c_str(), 1);
  }

 private:
  std::string asan_;
};

TEST_CASE("daemon: its socket file appears only once it accepts connections") {
  // Scripts, service managers and the Python tests wait for the file, then connect: the file
  // must never exist while connect() would be refused. With listen() slowed, a daemon that
  // binds at the path before it listens fails this every time.
  SlowListen slow;
  for (int start = 0; start < 3; ++start) {
    DaemonProcess daemon("appears", {}, /*wait_ready=*/false);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    struct stat st {};
    while (stat(daemon.socket().c_str(), &st) != 0) {
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    int fd = connect_unix(daemon.socket());
    CHECK_MESSAGE(fd >= 0, "start " << start << ": the socket existed but refused a connection");
    if (fd >= 0) close(fd);
    CHECK((st.st_mode & 0777) == 0660);
    // Nothing is left under the private name it was bound with.
    std::filesystem::path dir = std::filesystem::path(daemon.socket()).parent_path();
    std::string prefix = std::filesystem::path(daemon.socket()).filename().string() + ".starting-";
    for (const auto& entry : std::filesystem::directory_iterator(dir))
      CHECK(entry.path().filename().string().rfind(prefix, 0) == std::string::npos);
  }
}

TEST_CASE("daemon: SIGHUP and SIGTERM sent while it starts wait for its handlers") {
  // logrotate's SIGHUP, or a stop, can reach a daemon that is still starting: it must be
  // handled once the daemon runs, not take the default action (SIGHUP's ends the process).
  SlowListen slow;  // the start lasts 300 ms more, with the signals blocked
  for (int signum : {SIGHUP, SIGTERM}) {
    CAPTURE(signum);
    DaemonProcess daemon("start-signal", {}, /*wait_ready=*/false);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    // Its first line comes from Server::listen(), which then spends 300 ms in listen().
    while (!contains(daemon.log(), "gpu: ")) {
      REQUIRE_MESSAGE(daemon.alive(), "parallaxd exited: " << daemon.log());
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    REQUIRE(kill(daemon.pid(), signum) == 0);
    if (signum == SIGHUP) {
      while (!contains(daemon.log(), "SIGHUP: logging to stderr, no log file to reopen")) {
        REQUIRE_MESSAGE(daemon.alive(), "parallaxd died of SIGHUP: " << daemon.log());
        REQUIRE(std::chrono::steady_clock::now() < deadline);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      CHECK(contains(daemon.log(), "listening on"));
      CHECK(daemon.kill_and_reap(SIGTERM) == 0);
    } else {
      CHECK(daemon.wait_exit(20000) == 0);  // drained: it started, then stopped cleanly
      CHECK(contains(daemon.log(), "SIGTERM: draining"));
    }
  }
}

TEST_CASE("daemon: a dead daemon's socket file is replaced") {
  // A daemon killed with SIGKILL leaves its socket file behind; the next one on that path
  // must take it over (connect() to it is refused, so no live daemon holds it).
  std::string path = "/tmp/pxt-stale-" + std::to_string(getpid()) + ".sock";
  int stale = socket(AF_UNIX, SOCK_STREAM, 0);
  REQUIRE(stale >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  unlink(path.c_str());
  REQUIRE(bind(stale, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  close(stale);  // the file stays, with nobody listening
  REQUIRE(std::filesystem::exists(path));
  {
    // The later --socket wins; the harness would wait on its own path, so this test waits.
    DaemonProcess daemon("stale", {"--socket", path}, /*wait_ready=*/false);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    int fd;
    while ((fd = connect_unix(path)) < 0) {
      REQUIRE_MESSAGE(daemon.alive(), "parallaxd exited: " << daemon.log());
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    close(fd);
    CHECK(daemon.alive());
    CHECK(daemon.kill_and_reap(SIGTERM) == 0);
  }
  unlink(path.c_str());
}
