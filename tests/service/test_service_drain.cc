// SIGTERM drains parallaxd: steps under way finish, sparse variables are checkpointed, the
// daemon exits 0, and a restarted daemon restores the same rows; operations that cannot
// finish are cut at the deadline with a message naming the draining node; new workers are
// refused meanwhile. Real daemons, real workers, real shared memory.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/service/service_util.h"

using namespace pxt;

namespace {

// A daemon as the unit starts it: a configuration file and --foreground.
pid_t start_daemon(const std::string& config, const std::string& output) {
  return spawn_process({PX_DAEMON_PATH, "--config", config, "--foreground", "--threads", "2"}, {},
                       output);
}

}  // namespace

TEST_CASE("service: SIGTERM drains sparse+dense training, checkpoints, a restart restores") {
  ScratchDir scratch("svc-drain");
  const std::string& dir = scratch.path();
  std::string socket = dir + "/d.sock", checkpoints = dir + "/checkpoints", log = dir + "/d.log";
  std::string config = dir + "/parallaxd.toml";
  write_text_file(config, "socket = \"" + socket + "\"\nrestore = \"" + checkpoints +
                              "\"\n[log]\nfile = \"" + log +
                              "\"\n[service]\ndrain_timeout_ms = 20000\n");
  pid_t daemon = start_daemon(config, dir + "/d.out");
  REQUIRE(wait_until_accepting(socket, 10000));
  std::string ready = dir + "/ready";
  REQUIRE(mkdir(ready.c_str(), 0755) == 0);
  BackgroundWorkers workers(socket, "drain", 2, {"train", ready});
  REQUIRE(wait_for_ready_files(ready, 2, 30000) == 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // well into training

  int64_t start = monotonic_ms();
  kill(daemon, SIGTERM);
  int code = wait_for_exit(daemon, 25000);
  int64_t took = monotonic_ms() - start;
  CHECK(code == 0);
  CHECK(took < 20000);
  std::vector<WorkerResult> results = workers.collect(10000);
  REQUIRE(all_ok(results));
  // Both workers stopped after the same push step, told why by the daemon.
  std::string pushes = field(results[0].output, "pushes");
  CHECK(pushes == field(results[1].output, "pushes"));
  REQUIRE(!pushes.empty());
  CHECK(std::stoull(pushes) > 0);
  for (auto& r : results) CHECK(contains(r.output, "parallaxd on node 0 "));
  std::string text = read_text(log);
  INFO(text);
  CHECK(contains(text, "SIGTERM: draining"));
  CHECK(contains(
      text, "drain: saved sparse variable 'emb' of job 'drain' after " + pushes + " push steps"));
  CHECK(contains(text,
                 "drained (SIGTERM) and exits; its sparse variables are saved in " + checkpoints));
  CHECK(access((checkpoints + "/drain.emb.manifest").c_str(), F_OK) == 0);
  CHECK(access((checkpoints + "/drain.emb.node0.shard").c_str(), F_OK) == 0);

  // The restarted daemon restores the table: read back through a client, bit for bit.
  pid_t again = start_daemon(config, dir + "/d2.out");
  REQUIRE(wait_until_accepting(socket, 10000));
  auto verified = run_service_workers(socket, "drain", 1, {"verify", pushes, "2"});
  CHECK(all_ok(verified));
  CHECK(contains(verified[0].output, "rows_match pushes=" + pushes));
  kill(again, SIGTERM);
  CHECK(wait_for_exit(again, 10000) == 0);
  CHECK(contains(read_text(log), "variable 'emb' of job 'drain' restored from " + checkpoints));
}

TEST_CASE("service: a drain cuts what cannot finish at its deadline and refuses new workers") {
  ScratchDir scratch("svc-cut");
  const std::string& dir = scratch.path();
  std::string socket = dir + "/d.sock", config = dir + "/parallaxd.toml";
  write_text_file(config, "socket = \"" + socket + "\"\n[service]\ndrain_timeout_ms = 1500\n");
  pid_t daemon = start_daemon(config, dir + "/d.out");
  REQUIRE(wait_until_accepting(socket, 10000));
  std::string ready = dir + "/ready";
  REQUIRE(mkdir(ready.c_str(), 0755) == 0);
  // Two workers each wait for the other in another variable: neither step can complete.
  BackgroundWorkers workers(socket, "stall", 2, {"stall", ready});
  REQUIRE(wait_for_ready_files(ready, 2, 30000) == 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the daemon has both entries

  int64_t start = monotonic_ms();
  kill(daemon, SIGTERM);
  REQUIRE(wait_for_text(dir + "/d.out", "SIGTERM: draining", 5000));
  // Meanwhile a new worker is refused, told why.
  auto late = run_service_workers(socket, "late", 1, {"refused"}, 10000);
  CHECK(all_ok(late));
  int code = wait_for_exit(daemon, 15000);
  int64_t took = monotonic_ms() - start;
  CHECK(code == 0);  // nothing sparse to lose
  CHECK(took >= 1500);
  CHECK(took < 10000);
  auto results = workers.collect(10000);
  CHECK(all_ok(results));
  std::string text = read_text(dir + "/d.out");
  INFO(text);
  CHECK(contains(text, "2 operations in flight get 1500 ms"));
  CHECK(contains(text, "drain: 2 operations still in flight after 1500 ms: failing them"));
}

TEST_CASE("service: a second SIGTERM exits at once") {
  ScratchDir scratch("svc-twice");
  const std::string& dir = scratch.path();
  std::string socket = dir + "/d.sock", config = dir + "/parallaxd.toml";
  write_text_file(config, "socket = \"" + socket + "\"\n[service]\ndrain_timeout_ms = 60000\n");
  pid_t daemon = start_daemon(config, dir + "/d.out");
  REQUIRE(wait_until_accepting(socket, 10000));
  std::string ready = dir + "/ready";
  REQUIRE(mkdir(ready.c_str(), 0755) == 0);
  BackgroundWorkers workers(socket, "stall", 2, {"stall", ready});
  REQUIRE(wait_for_ready_files(ready, 2, 30000) == 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(daemon, SIGTERM);
  REQUIRE(wait_for_text(dir + "/d.out", "SIGTERM: draining", 5000));
  int64_t start = monotonic_ms();
  kill(daemon, SIGTERM);
  CHECK(wait_for_exit(daemon, 10000) == 1);
  CHECK(monotonic_ms() - start < 5000);
  CHECK(contains(read_text(dir + "/d.out"), "second SIGTERM: exiting now"));
}

TEST_CASE("service: one node of a cluster drains: the job ends everywhere naming it, rows saved") {
  // Node 1 drains while a 2-node job trains. Its checkpoint asks every node's owners for
  // their shards (here one machine: one directory), the other node's worker hears that
  // node 1 drained, and the saved table restores onto a single daemon.
  ScratchDir scratch("svc-cl");
  const std::string& dir = scratch.path();
  std::string checkpoints = dir + "/checkpoints", ready = dir + "/ready";
  REQUIRE(mkdir(ready.c_str(), 0755) == 0);
  std::string pushes;
  {
    ClusterProcesses cluster("svc-cl", 2, {"--checkpoint-dir", checkpoints});
    std::map<std::string, std::string> env = {{"PX_TEST_DRAINING_NODE", "1"}};
    BackgroundWorkers node0(cluster.node(0).socket(), "cl", 1, {"train", ready}, env);
    BackgroundWorkers node1(cluster.node(1).socket(), "cl", 1, {"train", ready}, env);
    REQUIRE(wait_for_ready_files(ready, 2, 30000) == 2);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    kill(cluster.node(1).pid(), SIGTERM);
    CHECK(cluster.node(1).wait_exit(20000) == 0);
    std::vector<WorkerResult> results = node0.collect(20000);
    std::vector<WorkerResult> drained = node1.collect(10000);
    results.insert(results.end(), drained.begin(), drained.end());
    CHECK(all_ok(results));
    std::string log = cluster.node(1).log();
    INFO(log);
    // The push steps in the checkpoint: every node's pushes up to the drained node's last.
    pushes = field(drained[0].output, "pushes");
    REQUIRE(!pushes.empty());
    CHECK(contains(
        log, "drain: saved sparse variable 'emb' of job 'cl' after " + pushes + " push steps"));
    CHECK(contains(results[0].output, "drained (SIGTERM) and exits"));
  }
  CHECK(access((checkpoints + "/cl.emb.node0.shard").c_str(), F_OK) == 0);
  CHECK(access((checkpoints + "/cl.emb.node1.shard").c_str(), F_OK) == 0);
  DaemonProcess restored("svc-cl-r", {"--restore", checkpoints});
  auto verified = run_service_workers(restored.socket(), "cl", 1, {"verify", pushes, "2"});
  CHECK(all_ok(verified));
}
