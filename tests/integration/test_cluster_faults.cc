// Integration tests of a formed cluster whose control plane misbehaves: bad joins (a daemon
// with a taken index, one configured for another node count, a garbled Join) that must be
// refused alone while the running job goes on, and daemons that hang (SIGSTOP: the kernel
// still answers TCP for them) that must be declared lost. Real parallaxd and worker
// processes on loopback; the garbled joins are a real daemon's Join message, damaged.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "tests/integration/harness.h"

using namespace pxt;

namespace {

const std::map<std::string, std::string> kExact = {{"PX_TEST_EXACT", "1"}};

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Steps a `steady` worker of global rank `rank` has completed (0 before its first).
long steps_done(const std::string& dir, int rank) {
  std::ifstream f(dir + "/steps-" + std::to_string(rank));
  long n = 0;
  return f >> n ? n : 0;
}

// Waits until each of the job's `workers` has completed `more` steps beyond what it had
// done when called; false (saying which worker lagged) at the deadline.
bool job_advances(const std::string& dir, int workers, long more, int timeout_ms,
                  std::string* lagging) {
  std::vector<long> from;
  for (int r = 0; r < workers; ++r) from.push_back(steps_done(dir, r));
  int64_t deadline = now_ms() + timeout_ms;
  for (;;) {
    int behind = -1;
    for (int r = 0; r < workers && behind < 0; ++r)
      if (steps_done(dir, r) < from[static_cast<size_t>(r)] + more) behind = r;
    if (behind < 0) return true;
    if (now_ms() > deadline) {
      *lagging = "worker " + std::to_string(behind) + " stayed at step " +
                 std::to_string(steps_done(dir, behind)) + " for " + std::to_string(timeout_ms) +
                 " ms";
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

sockaddr_in loopback(const std::string& endpoint) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1))));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

// A TCP connection to endpoint (retried until timeout_ms: a daemon opens its control port
// a little after the Unix socket the harness waits for); -1 if none.
int connect_tcp(const std::string& endpoint, int timeout_ms) {
  sockaddr_in addr = loopback(endpoint);
  for (int64_t deadline = now_ms() + timeout_ms; now_ms() < deadline;) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
    close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

// "127.0.0.1:PORT" of this end of a connection: how the coordinator names the newcomer.
std::string local_endpoint(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
}

// Reads until the peer closes the connection or timeout_ms passes (*closed says which).
std::string read_until_closed(int fd, int timeout_ms, bool* closed) {
  std::string got;
  *closed = false;
  for (int64_t deadline = now_ms() + timeout_ms; now_ms() < deadline;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      *closed = true;
      break;
    }
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

// Reads exactly n bytes by deadline_ms (steady clock); false if the peer closed or was late.
bool read_exactly(int fd, char* out, size_t n, int64_t deadline_ms) {
  for (size_t got = 0; got < n;) {
    pollfd p{fd, POLLIN, 0};
    if (now_ms() > deadline_ms) return false;
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t r = recv(fd, out + got, n - got, 0);
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

// The first control message (its Join, length prefix included) that a real daemon,
// node `index` of `endpoints`, sends to its coordinator: the test plays the coordinator on
// a free endpoint of its own.
std::string capture_join(const std::string& cluster, std::vector<std::string> endpoints,
                         int index) {
  endpoints[0] = ClusterProcesses::free_endpoints(1)[0];
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int on = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  sockaddr_in addr = loopback(endpoints[0]);
  REQUIRE(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(listen(listener, 4) == 0);
  DaemonProcess member(cluster + "-joiner", ClusterProcesses::node_args(cluster, endpoints, index),
                       false);
  pollfd p{listener, POLLIN, 0};
  REQUIRE_MESSAGE(poll(&p, 1, 20000) == 1, member.log());
  int fd = accept(listener, nullptr, nullptr);
  close(listener);
  std::string frame(4, '\0');
  int64_t deadline = now_ms() + 10000;
  bool ok = read_exactly(fd, frame.data(), 4, deadline);
  uint32_t len = 0;
  for (int i = 0; i < 4; ++i)
    len |= static_cast<uint32_t>(static_cast<unsigned char>(frame[static_cast<size_t>(i)]))
           << (8 * i);
  ok = ok && len < 4096;
  if (ok) {
    frame.resize(4 + len);
    ok = read_exactly(fd, frame.data() + 4, len, deadline);
  }
  close(fd);
  REQUIRE_MESSAGE(ok, member.log());
  return frame;
}

// Runs `steady` (1 worker per node) on a cluster in a thread of its own; the destructor
// asks the job to stop (DIR/stop) and waits for it, so a failed check ends it too.
class SteadyJob {
 public:
  SteadyJob(ClusterProcesses& cluster, const std::string& dir) : dir_(dir) {
    thread_ = std::thread([this, &cluster] {
      results_ =
          run_cluster_workers(cluster, "steady", 1, {"steady", "--dir", dir_}, 300000, kExact);
    });
  }
  ~SteadyJob() { finish(); }
  const std::vector<WorkerResult>& finish() {
    if (thread_.joinable()) {
      if (FILE* f = fopen((dir_ + "/stop").c_str(), "w")) fclose(f);
      thread_.join();
    }
    return results_;
  }

 private:
  std::string dir_;
  std::thread thread_;
  std::vector<WorkerResult> results_;
};

}  // namespace

TEST_CASE(
    "cluster: bad joins after the cluster formed are refused alone and the running job goes "
    "on") {
  ClusterProcesses cluster("cbad", 3);
  const std::vector<std::string>& endpoints = cluster.endpoints();
  ScratchDir scratch("cbad-steps");
  const std::string& dir = scratch.path();
  std::string joined = capture_join("cbad", endpoints, 2);
  SteadyJob job(cluster, dir);
  std::string lagging;
  REQUIRE_MESSAGE(job_advances(dir, 3, 5, 60000, &lagging), lagging);
  auto cluster_goes_on = [&](const std::string& after) {
    CAPTURE(after);
    for (int node = 0; node < 3; ++node)
      CHECK_MESSAGE(cluster.node(node).alive(), cluster.node(node).log());
    CHECK_MESSAGE(job_advances(dir, 3, 20, 20000, &lagging), lagging);
  };

  // (a) A second daemon for node 1: refused, and it says why.
  {
    DaemonProcess dup("cbad-dup", ClusterProcesses::node_args("cbad", endpoints, 1), false);
    CHECK(dup.wait_exit(20000) == 1);
    CHECK_MESSAGE(contains(dup.log(), "the coordinator refused this node: node index 1 is taken"),
                  dup.log());
    CHECK_MESSAGE(contains(dup.log(), endpoints[1]), dup.log());
  }
  CHECK(contains(cluster.node(0).log(), "refused a join from 127.0.0.1:"));
  cluster_goes_on("a daemon with a taken node index");

  // (b) A stray daemon of a 2-node cluster of the same name.
  {
    auto stray_args = ClusterProcesses::node_args("cbad", {endpoints[0], endpoints[1]}, 1);
    DaemonProcess stray("cbad-stray", stray_args, false);
    CHECK(stray.wait_exit(20000) == 1);
    CHECK_MESSAGE(contains(stray.log(), "this daemon expects 2 nodes; cluster 'cbad' has 3"),
                  stray.log());
  }
  cluster_goes_on("a daemon configured for 2 nodes");

  // (c) Garbled Joins, each from a connection of its own: a real Join whose index and count
  // are garbage (it still parses), one whose body after the segment table is random, and
  // 148 random bytes. Each is refused and logged with the connection's address.
  std::mt19937 rng(20261124);
  std::string garbage_fields = joined;
  // The Join's data word (nodeIndex 2, nodeCount 3, little-endian) is found by its value.
  const std::string fields("\x02\0\0\0\x03\0\0\0", 8);
  size_t at = garbage_fields.find(fields);
  REQUIRE(at != std::string::npos);
  for (size_t i = at; i < at + 8; ++i) garbage_fields[i] = static_cast<char>(rng());
  std::string random_body = joined;
  for (size_t i = 12; i < random_body.size(); ++i) random_body[i] = static_cast<char>(rng());
  std::string random_bytes(148, '\0');
  for (auto& b : random_bytes) b = static_cast<char>(rng());
  struct Garbled {
    const char* what;
    std::string bytes;
  };
  for (const Garbled& g : {Garbled{"a Join with a garbage index and count", garbage_fields},
                           Garbled{"a Join with a random body", random_body},
                           Garbled{"148 random bytes", random_bytes}}) {
    std::string what = g.what;
    CAPTURE(what);
    int fd = connect_tcp(endpoints[0], 10000);
    REQUIRE(fd >= 0);
    std::string from = local_endpoint(fd);
    REQUIRE(send(fd, g.bytes.data(), g.bytes.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(g.bytes.size()));
    bool closed = false;
    std::string reply = read_until_closed(fd, 20000, &closed);
    close(fd);
    CHECK(closed);
    // One framed message came back before the close (the Reject; its reason is logged).
    uint32_t len = 0;
    for (size_t i = 0; i < 4 && i < reply.size(); ++i)
      len |= static_cast<uint32_t>(static_cast<unsigned char>(reply[i])) << (8 * i);
    CHECK(reply.size() > 4);
    CHECK(reply.size() == 4 + static_cast<size_t>(len));
    std::string log;
    for (int i = 0; i < 250 && !contains(log = cluster.node(0).log(), from); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK_MESSAGE(contains(log, "refused a join from " + from), log);
    cluster_goes_on(g.what);
  }

  const std::vector<WorkerResult>& results = job.finish();
  CHECK(all_ok(results));
  for (auto& r : results) CHECK_MESSAGE(contains(r.output, "OK steady"), r.output);
}

namespace {

// Sends SIGCONT to a stopped daemon when the test leaves, however it leaves.
struct Continue {
  pid_t pid;
  ~Continue() { kill(pid, SIGCONT); }
};

long waited_ms(const std::string& output) {
  size_t at = output.find(" after ");
  return at == std::string::npos ? -1 : std::stol(output.substr(at + 7));
}

// 3 nodes x 1 worker running `until-lost` with a 3000 ms peer silence; node `stopped` is
// frozen with SIGSTOP once every worker completed a step. The workers of the other nodes
// must get PX_ERR_PEER_LOST naming it within a few silences, inside their 30 s waits; the
// frozen daemon is continued afterwards (its own worker then fails too). The silence is
// long enough that a running daemon starved of CPU for a second (sanitizer builds under
// load) is not taken for the stopped one.
void stop_a_daemon_mid_job(const std::string& tag, int stopped) {
  ClusterProcesses cluster(tag, 3, {"--peer-silence-ms", "3000"});
  ScratchDir ready(tag + "-ready");
  std::map<std::string, std::string> env = {{"PX_TEST_READY_DIR", ready.path()}};
  std::vector<WorkerResult> results[3];
  std::thread workers[3];
  for (int node = 0; node < 3; ++node)
    workers[node] = std::thread([&, node] {
      results[node] = run_workers(cluster.node(node), tag, 1, {"until-lost"}, 90000, env);
    });
  bool all_ready = wait_for_ready_files(ready.path(), 3, 60000) == 3;
  CHECK(all_ready);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  {
    Continue resume{cluster.node(stopped).pid()};
    if (all_ready) kill(resume.pid, SIGSTOP);
    for (int node = 0; node < 3; ++node)
      if (node != stopped) workers[node].join();
  }
  workers[stopped].join();
  std::string named = "node " + std::to_string(stopped) + " (" +
                      cluster.endpoints()[static_cast<size_t>(stopped)] + ")";
  for (int node = 0; node < 3; ++node) {
    CAPTURE(node);
    REQUIRE(results[node].size() == 1);
    const WorkerResult& r = results[node][0];
    CHECK_MESSAGE(r.exit_code == 0, r.output);
    CHECK_MESSAGE(contains(r.output, "LOST at step"), r.output);
    if (node == stopped) continue;
    CHECK_MESSAGE(contains(r.output, named), r.output);
    CHECK_MESSAGE(contains(r.output, "sent nothing for 3000 ms"), r.output);
    long ms = waited_ms(r.output);
    CHECK_MESSAGE((ms >= 0 && ms < 15000), r.output);
  }
  for (int node = 0; node < 3; ++node) CHECK(cluster.node(node).alive());
}

}  // namespace

TEST_CASE(
    "cluster: a member daemon stopped mid-job (SIGSTOP) is lost: PX_ERR_PEER_LOST naming it "
    "on every other node") {
  stop_a_daemon_mid_job("cstop", 2);
}

TEST_CASE(
    "cluster: the coordinator stopped mid-job (SIGSTOP) is lost: PX_ERR_PEER_LOST naming node "
    "0 on every member") {
  stop_a_daemon_mid_job("cstop0", 0);
}
