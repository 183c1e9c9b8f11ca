// Daemons authenticate each other with a shared cluster secret at rendezvous
// (daemon/cluster/cluster_auth.h): real daemons over loopback, each with its own secret file.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <future>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "tests/integration/harness.h"

using namespace pxt;

namespace {

// Writes a secret file with the given mode; returns its path.
std::string secret_file(const ScratchDir& dir, const std::string& name, const std::string& text,
                        mode_t mode = 0600) {
  std::string path = dir.path() + "/" + name;
  std::ofstream(path) << text << "\n";
  ::chmod(path.c_str(), mode);
  return path;
}

std::vector<std::string> node(const std::string& cluster, const std::vector<std::string>& endpoints,
                              int index, const std::string& secret,
                              std::vector<std::string> more = {}) {
  auto args = ClusterProcesses::node_args(cluster, endpoints, index);
  if (!secret.empty()) args.insert(args.end(), {"--secret-file", secret});
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

const std::vector<std::string> kAllreduce = {"allreduce", "--dtype", "f32",  "--op",
                                             "sum",       "--count", "4096", "--memory",
                                             "arena",     "--steps", "3"};

// Inputs whose sums are exact in f32, so every node order gives the reference bit for bit.
const std::map<std::string, std::string> kExact = {{"PX_TEST_EXACT", "1"}};

}  // namespace

TEST_CASE("cluster auth: daemons with the same secret form a cluster and run a job") {
  ScratchDir dir("auth-ok");
  std::string key = secret_file(dir, "key", "0123456789abcdef0123456789abcdef");
  ClusterProcesses cluster("authok", 3, {"--secret-file", key});
  CHECK(all_ok(run_cluster_workers(cluster, "j", 1, kAllreduce, 60000, kExact)));
  for (int n = 1; n < 3; ++n)
    CHECK(contains(cluster.node(n).log(), "proved it holds the cluster secret"));
}

TEST_CASE("cluster auth: a daemon with another secret, or none, is refused and logged") {
  ScratchDir dir("auth-bad");
  std::string key = secret_file(dir, "key", "0123456789abcdef0123456789abcdef");
  std::string other = secret_file(dir, "other", "fedcba9876543210fedcba9876543210");
  auto endpoints = ClusterProcesses::free_endpoints(2);
  DaemonProcess n0("authbad-n0", node("authbad", endpoints, 0, key));
  {
    DaemonProcess wrong("authbad-wrong", node("authbad", endpoints, 1, other), false);
    CHECK(wrong.wait_exit(10000) == 1);
    CHECK_MESSAGE(contains(wrong.log(),
                           "the coordinator refused this node: it failed "
                           "authentication"),
                  wrong.log());
  }
  {
    DaemonProcess none("authbad-none", node("authbad", endpoints, 1, ""), false);
    CHECK(none.wait_exit(10000) == 1);
    CHECK_MESSAGE(contains(none.log(), "it sent no authentication"), none.log());
  }
  // The coordinator logged both with their addresses and still waits for the real node 1.
  CHECK(contains(n0.log(), "refused a join from 127.0.0.1:"));
  CHECK(contains(n0.log(), "failed authentication"));
  CHECK(n0.alive());
  DaemonProcess n1("authbad-n1", node("authbad", endpoints, 1, key));
  // Both nodes are up: run a job across them through their sockets.
  auto r0 = std::async(std::launch::async,
                       [&] { return run_workers(n0, "j", 1, kAllreduce, 60000, kExact); });
  auto r1 = run_workers(n1, "j", 1, kAllreduce, 60000, kExact);
  CHECK(all_ok(r0.get()));
  CHECK(all_ok(r1));
}

TEST_CASE("cluster auth: a node with a secret and a coordinator without one say so") {
  ScratchDir dir("auth-coord");
  std::string key = secret_file(dir, "key", "0123456789abcdef0123456789abcdef");
  auto endpoints = ClusterProcesses::free_endpoints(2);
  DaemonProcess n0("authcoord-n0",
                   node("authcoord", endpoints, 0, "", {"--startup-timeout-ms", "3000"}));
  DaemonProcess n1("authcoord-n1",
                   node("authcoord", endpoints, 1, key, {"--startup-timeout-ms", "1500"}), false);
  CHECK(n1.wait_exit(10000) == 1);
  CHECK_MESSAGE(contains(n1.log(), "no authentication challenge from the coordinator"), n1.log());
  CHECK(n0.wait_exit(10000) == 1);  // node 1 never joined
}

TEST_CASE("cluster auth: a secret file others may read, or too short, stops the daemon at once") {
  ScratchDir dir("auth-file");
  auto endpoints = ClusterProcesses::free_endpoints(2);
  std::string open_key = secret_file(dir, "open", "0123456789abcdef0123456789abcdef", 0644);
  DaemonProcess loose("authfile-open", node("authfile", endpoints, 0, open_key), false);
  CHECK(loose.wait_exit(10000) != 0);
  CHECK_MESSAGE(contains(loose.log(), "secret_file: " + open_key +
                                          " may be read by group or others (mode 0644)"),
                loose.log());
  std::string short_key = secret_file(dir, "short", "tiny");
  DaemonProcess tiny("authfile-short", node("authfile", endpoints, 0, short_key), false);
  CHECK(tiny.wait_exit(10000) != 0);
  CHECK_MESSAGE(contains(tiny.log(), "holds 4 bytes"), tiny.log());
  DaemonProcess missing("authfile-missing", node("authfile", endpoints, 0, dir.path() + "/none"),
                        false);
  CHECK(missing.wait_exit(10000) != 0);
  CHECK_MESSAGE(contains(missing.log(), "secret_file: " + dir.path() + "/none"), missing.log());
}

namespace {

// The fabric address a cluster daemon logged when the cluster formed ("" if none yet).
std::string logged_fabric_address(const DaemonProcess& daemon) {
  std::string log = daemon.log();
  const std::string key = "fabric address ";
  size_t at = log.find(key);
  if (at == std::string::npos) return "";
  size_t end = log.find_first_of(" \n", at + key.size());
  return log.substr(at + key.size(), end - at - key.size());
}

}  // namespace

TEST_CASE("cluster auth: fabric messages from outside the address table are never delivered") {
  // A stray libfabric endpoint floods node 1 with messages in the tags of the job's
  // allreduces, barriers and sparse requests while the job runs exact sums: a delivered one
  // would fail an exact-length receive or change a sum, and the steady scenario checks every
  // step. Two lines hold: ofi_rxm refuses connections from addresses outside the endpoint's
  // address vector (the epoch's table, FabricEndpoint::set_peers/reset_peers), and every
  // receive is posted for one sender (FI_DIRECTED_RECV), so a message from elsewhere would
  // match none.
  ScratchDir dir("auth-stray");
  ClusterProcesses cluster("authstray", 2);
  std::string address;
  for (int i = 0; i < 100 && address.empty(); ++i) {
    address = logged_fabric_address(cluster.node(1));
    if (address.empty()) usleep(100000);
  }
  REQUIRE_MESSAGE(!address.empty(), cluster.node(1).log());
  pid_t stray = spawn_process({PX_STRAY_SENDER_PATH, address, "6"}, {}, dir.path() + "/stray.log");
  REQUIRE(stray > 0);
  auto job = std::async(std::launch::async, [&] {
    return run_cluster_workers(cluster, "stray", 1, {"steady", "--dir", dir.path()}, 120000);
  });
  int status = 0;
  REQUIRE(waitpid(stray, &status, 0) == stray);
  std::ofstream(dir.path() + "/stop") << "stop\n";
  auto results = job.get();
  CHECK(all_ok(results));
  std::ifstream log(dir.path() + "/stray.log");
  std::string said((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  MESSAGE("stray sender: " << said);
  CHECK(contains(said, "SENT"));
  // The first line: the daemon's provider (ofi_rxm) refuses a connection from an address
  // outside its address vector, which holds the epoch's table and nothing else, so not
  // one message left the stray (its sends wait on a refused connection).
  CHECK(contains(said, "DELIVERED 0 "));
  for (int n = 0; n < 2; ++n) CHECK(cluster.node(n).alive());
  // The cluster still runs new jobs.
  CHECK(all_ok(run_cluster_workers(cluster, "after", 1, kAllreduce, 60000, kExact)));
}
