// A cluster re-forms after losing a node: a member killed with SIGKILL and started again
// under its index rejoins, and so does every member when the coordinator is killed and
// restarted; the cluster goes on under a new epoch and a new job runs on every node. A job
// interrupted by the loss fails with PX_ERR_PEER_LOST naming the node. Real parallaxd and
// px_test_worker processes over tcp;ofi_rxm on loopback.
#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/harness.h"

using namespace pxt;

namespace {

const std::vector<std::string> kSweep = {"sweep", "--counts", "1,1000"};
const std::map<std::string, std::string> kExact = {{"PX_TEST_EXACT", "1"}};

// Node `victim` dies mid-job (SIGKILL), the others' workers fail naming it, it is started
// again, and the cluster re-forms under epoch 2: a new job runs on all three nodes.
// SIGKILL closes the victim's connections, so the loss is seen at once whatever the peer
// silence; the silence is long enough that a daemon starved of CPU for a second or two
// (sanitizer builds, a loaded machine) is not mistaken for a lost one.
void kill_and_restart(const std::string& tag, int victim) {
  ClusterProcesses cluster(tag, 3, {"--peer-silence-ms", "6000"});
  CHECK(all_ok(run_cluster_workers(cluster, "before", 1, kSweep, 120000, kExact)));

  KilledNodeRun run =
      run_cluster_workers_killing_node(cluster, "steady", 1, {"until-lost"}, victim);
  CHECK(run.ready_nodes == 3);
  std::string named = "node " + std::to_string(victim) + " (" +
                      cluster.endpoints()[static_cast<size_t>(victim)] + ")";
  for (int node = 0; node < 3; ++node) {
    if (node == victim) continue;
    const WorkerResult& r = run.results[static_cast<size_t>(node)];
    CHECK_MESSAGE(contains(r.output, "LOST at step"), r.output);
    CHECK_MESSAGE(contains(r.output, named), r.output);
  }

  cluster.restart(victim);
  for (int node = 0; node < 3; ++node) {
    CAPTURE(node);
    // The restarted daemon forms anew (its first epoch is the cluster's next); the others
    // re-form.
    std::string says = node == victim ? "ready: 3 nodes" : "re-formed under epoch 2";
    CHECK_MESSAGE(log_says(cluster.node(node), says, 30000), cluster.node(node).log());
    CHECK(cluster.node(node).alive());
  }
  auto results = run_cluster_workers(cluster, "after", 1, kSweep, 120000, kExact);
  CHECK(all_ok(results));
  for (auto& r : results) CHECK_MESSAGE(contains(r.output, "OK sweep"), r.output);
}

}  // namespace

TEST_CASE("cluster: a member killed and restarted under its index rejoins and a new job runs") {
  kill_and_restart("crf1", 2);
}

TEST_CASE(
    "cluster: the coordinator killed and restarted takes every member back and a new job runs") {
  kill_and_restart("crf0", 0);
}

TEST_CASE("cluster: workers waiting for their job's world hear at once that a node was lost") {
  // Nodes 0 and 1 have their workers connected and wait for node 2's part of the job, which
  // never comes: its daemon is killed. The waiting workers are refused with
  // PX_ERR_PEER_LOST naming node 2 at once, not at their 20 s connect deadline (an elastic
  // worker reconnecting just before a loss was seen must not wait that out).
  ClusterProcesses cluster("crfw", 3, {"--peer-silence-ms", "6000"});
  for (int node = 0; node < 3; ++node)
    REQUIRE_MESSAGE(log_says(cluster.node(node), "ready: 3 nodes", 30000),
                    cluster.node(node).log());
  std::vector<WorkerResult> results;
  std::thread workers([&] { results = run_workers_on(cluster, {0, 1}, "waits", 1, {"world"}); });
  for (int node : {0, 1})
    CHECK_MESSAGE(log_says(cluster.node(node), "job 'waits': all 1 local workers connected", 20000),
                  cluster.node(node).log());
  cluster.node(2).kill_and_reap(SIGKILL);
  workers.join();
  std::string named = "node 2 (" + cluster.endpoints()[2] + ")";
  for (const WorkerResult& r : results) {
    CHECK(r.exit_code == 1);
    CHECK_MESSAGE(contains(r.output, "px_connect: a peer worker or node was lost"), r.output);
    CHECK_MESSAGE(contains(r.output, named), r.output);
  }
  for (int node : {0, 1}) CHECK_MESSAGE(cluster.node(node).alive(), cluster.node(node).log());
}
