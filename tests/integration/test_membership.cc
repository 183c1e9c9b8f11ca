// Membership on etcd (docs/elastic.md): a 3-member etcd cluster on loopback and 3 parallaxd
// with --membership, no node list and no index. Indices are assigned, one coordinator is
// elected, jobs run; an etcd member killed changes nothing; the coordinator daemon killed,
// another is elected, a daemon started in its place takes the freed index and the cluster
// re-forms under a new epoch where a job runs; etcd lost entirely (no quorum) for more than
// a lease changes nothing for running jobs, and once it is back the same coordinator goes on;
// no epoch was ever formed by two coordinators (from the logs). With membership_min_nodes below
// the node count, the survivors of a lost member, and of a lost coordinator, form an epoch of
// their own, and a daemon started later is taken in. A node cut off by a partition (its
// network namespace's link down) and healed: a member is taken back in; a coordinator finds
// another elected and stops. An etcd that cannot be reached at start is a clear error.
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/etcd_cluster.h"
#include "tests/integration/harness.h"
#include "tests/integration/netns_bridge.h"

using namespace pxt;

namespace {

const std::vector<std::string> kSweep = {"sweep", "--counts", "1,1000"};
const std::map<std::string, std::string> kExact = {{"PX_TEST_EXACT", "1"}};

// Every match of pattern's first group in text.
std::vector<std::string> matches(const std::string& text, const std::string& pattern) {
  std::vector<std::string> found;
  std::regex re(pattern);
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
       ++it)
    found.push_back((*it)[1].str());
  return found;
}

// `pxctl status --json` of the daemon.
std::string pxctl_status(const DaemonProcess& daemon) {
  std::string command =
      std::string(PX_PXCTL_PATH) + " --socket " + daemon.socket() + " --json status 2>&1";
  std::string out;
  if (FILE* p = popen(command.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    pclose(p);
  }
  return out;
}

// Fencing, from the daemons' logs: `epochs` epochs were formed (at_least: that many or more,
// as a heal racing a re-formation may add one), each by one coordinator of one term.
void check_one_coordinator_per_epoch(const std::string& logs, size_t epochs,
                                     bool at_least = false) {
  std::map<std::string, std::set<std::string>> formers;  // epoch -> "node N term T"
  std::regex formed("(node [0-9]+)[^\n]* forms epoch ([0-9]+) as coordinator of term ([0-9]+)");
  for (auto it = std::sregex_iterator(logs.begin(), logs.end(), formed);
       it != std::sregex_iterator(); ++it)
    formers[(*it)[2].str()].insert((*it)[1].str() + " term " + (*it)[3].str());
  if (at_least)
    CHECK(formers.size() >= epochs);
  else
    CHECK(formers.size() == epochs);
  for (const auto& [epoch, who] : formers) CHECK_MESSAGE(who.size() == 1, "epoch " << epoch);
}

// Once all 3 daemons formed: the slot of the one that coordinates.
int formed_coordinator(ClusterProcesses& cluster) {
  int coordinator = -1;
  for (int slot = 0; slot < 3; ++slot) {
    CAPTURE(slot);
    REQUIRE_MESSAGE(log_says(cluster.node(slot), "ready: 3 nodes", 30000),
                    cluster.node(slot).log());
    if (contains(cluster.node(slot).log(), "waiting for 3 nodes")) coordinator = slot;
  }
  REQUIRE(coordinator >= 0);
  return coordinator;
}

int assigned_index(const DaemonProcess& daemon) {
  auto found = matches(daemon.log(), "node index ([0-9]+) assigned by etcd");
  return found.size() == 1 ? std::stoi(found[0]) : -1;
}

}  // namespace

TEST_CASE("membership/etcd: assigned indices, an elected coordinator, its loss and a new one") {
  const std::string tag = "pxt-etcd-" + std::to_string(getpid());
  EtcdCluster etcd(tag, 3);
  const std::string url = "etcd://" + etcd.endpoints() + "/parallax-tests/" + tag;
  const auto listens = ClusterProcesses::free_endpoints(3);
  ClusterProcesses cluster(tag, 3, [&](int slot) {
    return membership_args(tag, url, 3, listens[static_cast<size_t>(slot)], 6000);
  });
  std::set<int> indices;
  int coordinator = -1;  // the slot whose daemon coordinates
  for (int slot = 0; slot < 3; ++slot) {
    CAPTURE(slot);
    REQUIRE_MESSAGE(log_says(cluster.node(slot), "ready: 3 nodes", 30000),
                    cluster.node(slot).log());
    indices.insert(assigned_index(cluster.node(slot)));
    if (contains(cluster.node(slot).log(), "waiting for 3 nodes")) {
      CHECK_MESSAGE(coordinator < 0, "two coordinators");
      coordinator = slot;
    }
  }
  CHECK(indices == std::set<int>{0, 1, 2});
  REQUIRE(coordinator >= 0);
  // pxctl status names the membership and the coordinator every node follows.
  std::string coordinator_node =
      "\"coordinator_node\":" + std::to_string(assigned_index(cluster.node(coordinator)));
  for (int slot = 0; slot < 3; ++slot) {
    std::string status = pxctl_status(cluster.node(slot));
    CHECK_MESSAGE(contains(status, "\"membership\":\"" + url + "\""), status);
    CHECK_MESSAGE(contains(status, coordinator_node), status);
  }
  CHECK(all_ok(run_cluster_workers(cluster, "before", 1, kSweep, 120000, kExact)));

  // An etcd member lost: the daemons renew their leases through the others; nothing changes.
  etcd.kill(0);
  std::this_thread::sleep_for(std::chrono::seconds(3));  // past a lease
  CHECK(all_ok(run_cluster_workers(cluster, "etcd-member-lost", 1, kSweep, 120000, kExact)));
  for (int slot = 0; slot < 3; ++slot) {
    CHECK(cluster.node(slot).alive());
    CHECK_FALSE(contains(cluster.node(slot).log(), "a new election"));
  }

  // The coordinator daemon killed mid-job: its workers' peers fail naming it, another node
  // is elected, and a daemon started in its slot takes the freed index; the cluster re-forms.
  int lost_index = assigned_index(cluster.node(coordinator));
  KilledNodeRun run =
      run_cluster_workers_killing_node(cluster, "steady", 1, {"until-lost"}, coordinator);
  CHECK(run.ready_nodes == 3);
  std::string logs = cluster.node(coordinator).log();
  for (int slot = 0; slot < 3; ++slot) {
    if (slot == coordinator) continue;
    const WorkerResult& r = run.results[static_cast<size_t>(slot)];
    CHECK_MESSAGE(contains(r.output, "LOST at step"), r.output);
    CHECK_MESSAGE(contains(r.output, "node " + std::to_string(lost_index)), r.output);
  }
  int elected = -1;
  for (int waited = 0; waited < 20000 && elected < 0; waited += 50) {
    for (int slot = 0; slot < 3; ++slot)
      if (slot != coordinator && contains(cluster.node(slot).log(), "waiting for 3 nodes"))
        elected = slot;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE_MESSAGE(elected >= 0, "no survivor became coordinator");
  cluster.restart(coordinator);
  CHECK(assigned_index(cluster.node(coordinator)) == lost_index);
  for (int slot = 0; slot < 3; ++slot) {
    CAPTURE(slot);
    std::string says = slot == coordinator ? "ready: 3 nodes" : "re-formed under epoch";
    CHECK_MESSAGE(log_says(cluster.node(slot), says, 30000), cluster.node(slot).log());
  }
  CHECK(all_ok(run_cluster_workers(cluster, "after", 1, kSweep, 120000, kExact)));

  // etcd lost (two of three members: no quorum) for more than a lease: the formed cluster
  // and its jobs do not need it. When it returns the coordinator is the same: a new etcd
  // leader extends every lease, so none expired.
  etcd.kill(1);
  // Every daemon sees it (a keep-alive fails: a leader without quorum may still answer one
  // for up to an election timeout), then a lease passes.
  for (int slot = 0; slot < 3; ++slot) {
    CAPTURE(slot);
    CHECK_MESSAGE(log_says(cluster.node(slot), "membership: etcd unreachable", 20000),
                  cluster.node(slot).log());
  }
  std::this_thread::sleep_for(std::chrono::seconds(3));
  CHECK(all_ok(run_cluster_workers(cluster, "etcd-lost", 1, kSweep, 120000, kExact)));
  etcd.restart(0);
  etcd.restart(1);
  for (int slot = 0; slot < 3; ++slot) {
    CAPTURE(slot);
    CHECK_MESSAGE(log_says(cluster.node(slot), "membership: etcd answers again", 30000),
                  cluster.node(slot).log());
  }
  CHECK(all_ok(run_cluster_workers(cluster, "etcd-back", 1, kSweep, 120000, kExact)));
  for (int slot = 0; slot < 3; ++slot) {
    CHECK(cluster.node(slot).alive());
    CHECK(matches(cluster.node(slot).log(), "(coordinator is node)").size() ==
          (slot == coordinator ? 1u : 2u));
  }

  // Fencing: every epoch was formed by one coordinator, of one term, and the new
  // coordinator's term is higher.
  for (int slot = 0; slot < 3; ++slot) logs += cluster.node(slot).log();
  check_one_coordinator_per_epoch(logs, 2);
  auto terms = matches(logs, "forms epoch [0-9]+ as coordinator of term ([0-9]+)");
  REQUIRE(terms.size() == 2);
  CHECK(std::stoll(terms[0]) != std::stoll(terms[1]));
}

// The WORLD line of the world scenario ("node=1/2 rank=1/2 ...") of each result.
static std::vector<std::string> worlds(const std::vector<WorkerResult>& results) {
  std::vector<std::string> found;
  for (const auto& r : results) {
    auto m = matches(r.output, "WORLD (node=[0-9]+/[0-9]+) ");
    found.push_back(m.empty() ? r.output : m[0]);
  }
  return found;
}

TEST_CASE("membership/etcd: the survivors re-form without a lost node and take a new one in") {
  // membership_min_nodes 2: a lost node is not waited for. 3 daemons: a member lost, the
  // survivors go on as 2; a daemon started joins and the cluster is 3 again; the
  // coordinator lost, the survivors elect another and go on as 2.
  const std::string tag = "pxt-etcd-survive-" + std::to_string(getpid());
  EtcdCluster etcd(tag, 1);
  const std::string url = "etcd://" + etcd.endpoints() + "/parallax-tests/" + tag;
  const auto listens = ClusterProcesses::free_endpoints(3);
  ClusterProcesses cluster(tag, 3, [&](int slot) {
    auto args = membership_args(tag, url, 3, listens[static_cast<size_t>(slot)], 6000);
    args.insert(args.end(), {"--membership-min-nodes", "2"});
    return args;
  });
  const int coordinator = formed_coordinator(cluster);
  const int member = (coordinator + 1) % 3, other = (coordinator + 2) % 3;
  const int member_index = assigned_index(cluster.node(member));

  // A member killed mid-job: the job fails on the others naming it, and without waiting for
  // a replacement the two survivors form an epoch of their own, ranked by node index.
  KilledNodeRun run =
      run_cluster_workers_killing_node(cluster, "steady", 1, {"until-lost"}, member);
  CHECK(run.ready_nodes == 3);
  for (int slot : {coordinator, other}) {
    CAPTURE(slot);
    CHECK_MESSAGE(contains(run.results[static_cast<size_t>(slot)].output,
                           "node " + std::to_string(member_index)),
                  run.results[static_cast<size_t>(slot)].output);
    CHECK_MESSAGE(log_says(cluster.node(slot), "2 of 3 nodes", 20000), cluster.node(slot).log());
  }
  std::vector<int> survivors = {std::min(coordinator, other), std::max(coordinator, other)};
  std::vector<int> ranks = {
      assigned_index(cluster.node(survivors[0])) < assigned_index(cluster.node(survivors[1])) ? 0
                                                                                              : 1};
  ranks.push_back(1 - ranks[0]);
  // pxctl counts the epoch's nodes, and names the lost one.
  std::string status = pxctl_status(cluster.node(coordinator));
  CHECK_MESSAGE(contains(status, "\"nodes_up\":2"), status);
  auto results = run_workers_on(cluster, survivors, "world", 1, {"world"}, 60000);
  CHECK(all_ok(results));
  CHECK(worlds(results) == std::vector<std::string>{"node=" + std::to_string(ranks[0]) + "/2",
                                                    "node=" + std::to_string(ranks[1]) + "/2"});
  // Dense results over the new world, and a sparse table sharded over the two.
  CHECK(all_ok(run_workers_on(cluster, survivors, "after-loss", 1, kSweep, 120000, kExact)));
  CHECK(all_ok(run_workers_on(
      cluster, survivors, "sparse-after-loss", 1,
      {"sparse-train", "--optimizer", "adam", "--aggregation", "mean", "--steps", "10"}, 120000)));

  // A daemon started mid-job: it takes the free index and the cluster re-forms on all three.
  // The coordinator's worker is told PX_ERR_MEMBERSHIP naming the node that joined (nothing
  // was lost). The other survivor's worker is an ABI 1.14 client, which predates that
  // status: it is told PX_ERR_PEER_LOST (as it may be anyway, should a transfer fail there
  // before the new epoch's table arrives).
  ScratchDir ready("ready-joined");
  std::vector<WorkerResult> joined_run;
  std::thread joined_workers([&] {
    joined_run = run_workers_on(cluster, survivors, "joined", 1, {"until-lost", "--joined"}, 120000,
                                {{"PX_TEST_READY_DIR", ready.path()},
                                 {"PX_TEST_OLD_ABI_SOCKET", cluster.node(other).socket()}});
  });
  CHECK(wait_for_ready_files(ready.path(), 2, 60000) == 2);
  cluster.restart(member);
  joined_workers.join();
  CHECK(all_ok(joined_run));  // each worker checks its status
  const WorkerResult& told = joined_run[survivors[0] == coordinator ? 0 : 1];
  bool names_it = contains(told.output, "node " + std::to_string(member_index) + " (") &&
                  contains(told.output, "joined)");
  CHECK_MESSAGE(names_it, told.output);
  CHECK(assigned_index(cluster.node(member)) == member_index);
  for (int slot = 0; slot < 3; ++slot) {
    CAPTURE(slot);
    std::string says = slot == member ? "ready: 3 nodes" : "3 of 3 nodes";
    CHECK_MESSAGE(log_says(cluster.node(slot), says, 30000), cluster.node(slot).log());
  }
  CHECK(all_ok(run_cluster_workers(cluster, "after-join", 1, kSweep, 120000, kExact)));

  // The coordinator killed: the other two elect one of them and form an epoch of two.
  const std::string two = "(re-formed under epoch [0-9]+: 2 of 3 nodes)";
  survivors = {std::min(member, other), std::max(member, other)};
  std::vector<size_t> before;
  for (int slot : survivors) before.push_back(matches(cluster.node(slot).log(), two).size());
  cluster.node(coordinator).kill_and_reap(SIGKILL);
  for (size_t i = 0; i < survivors.size(); ++i) {
    const DaemonProcess& d = cluster.node(survivors[i]);
    CAPTURE(survivors[i]);
    for (int waited = 0; waited < 20000 && matches(d.log(), two).size() <= before[i]; waited += 100)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CHECK_MESSAGE(matches(d.log(), two).size() == before[i] + 1, d.log());
    CHECK_MESSAGE(contains(d.log(), "a new election"), d.log());
  }
  CHECK(all_ok(run_workers_on(cluster, survivors, "after-coordinator", 1, kSweep, 120000, kExact)));

  // Fencing: every epoch was formed by one coordinator.
  std::string logs;
  for (int slot = 0; slot < 3; ++slot) logs += cluster.node(slot).log();
  check_one_coordinator_per_epoch(logs, 4);
}

// Waits up to 30 s until pattern matches the daemon's log more than `before` times.
static bool log_count_above(const DaemonProcess& daemon, const std::string& pattern,
                            size_t before) {
  for (int waited = 0; waited < 30000; waited += 100) {
    if (matches(daemon.log(), pattern).size() > before) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

TEST_CASE("membership/etcd: a partition cuts off a member, then the coordinator, and heals") {
  // Each daemon in a network namespace of its own, etcd's 3 members in a fourth, all on one
  // bridge; a partition takes a namespace's link down: the node can reach neither etcd nor
  // the other nodes, and they cannot reach it. Then a member and the coordinator are cut off
  // from each other alone (blackhole routes). membership_min_nodes 2: the others go on.
  const std::string unavailable = NetnsBridge::unavailable();
  if (!unavailable.empty()) {
    MESSAGE("partition test skipped: " << unavailable);
    return;
  }
  const std::string tag = "pxp" + std::to_string(getpid());
  NetnsBridge net(tag, 4);
  EtcdCluster etcd(tag, 3, net.address(3), net.launcher(3));
  const std::string url = "etcd://" + etcd.endpoints() + "/parallax-tests/" + tag;
  ClusterProcesses cluster(
      tag, 3,
      [&](int slot) {
        auto args = membership_args(tag, url, 3, net.address(slot) + ":7070", 3000);
        // shm would cross the namespaces: the partition must cut the data plane too.
        args.insert(args.end(),
                    {"--membership-min-nodes", "2", "--fabric-provider", "tcp;ofi_rxm"});
        return args;
      },
      [&](int slot) { return net.launcher(slot); });
  const int coordinator = formed_coordinator(cluster);
  CHECK(all_ok(run_cluster_workers(cluster, "whole", 1, kSweep, 120000, kExact)));
  const std::string two = "re-formed under epoch [0-9]+: (2) of 3 nodes";
  const std::string three = "re-formed under epoch [0-9]+: (3) of 3 nodes";
  auto count = [&](int slot, const std::string& pattern) {
    return matches(cluster.node(slot).log(), pattern).size();
  };
  auto sorted = [](int a, int b) { return std::vector<int>{std::min(a, b), std::max(a, b)}; };

  // A member cut off: silent to its peers and to etcd, it is lost; the other two form an
  // epoch of their own once its lease is gone, and run a job.
  const int member = (coordinator + 1) % 3, other = (coordinator + 2) % 3;
  size_t twos[3] = {count(0, two), count(1, two), count(2, two)};
  net.set_link(member, false);
  for (int slot : {coordinator, other}) {
    CAPTURE(slot);
    CHECK_MESSAGE(log_count_above(cluster.node(slot), two, twos[slot]), cluster.node(slot).log());
  }
  CHECK(all_ok(run_workers_on(cluster, sorted(coordinator, other), "member-cut", 1, kSweep, 120000,
                              kExact)));
  CHECK(cluster.node(member).alive());

  // Healed: it renews its lease, takes its index back and is taken in again.
  size_t threes[3] = {count(0, three), count(1, three), count(2, three)};
  net.set_link(member, true);
  for (int slot : {coordinator, other}) {
    CAPTURE(slot);
    CHECK_MESSAGE(log_count_above(cluster.node(slot), three, threes[slot]),
                  cluster.node(slot).log());
  }
  CHECK_MESSAGE(log_says(cluster.node(member), "3 of 3 nodes", 30000), cluster.node(member).log());
  CHECK(all_ok(run_cluster_workers(cluster, "member-healed", 1, kSweep, 120000, kExact)));

  // The member cut off from the coordinator alone: etcd and the third node still reach it,
  // so its key stays; after peer_silence_ms the coordinator forms without it, and takes it
  // back in when the cut mends.
  for (int slot = 0; slot < 3; ++slot) twos[slot] = count(slot, two);
  net.set_cut(member, coordinator, true);
  for (int slot : {coordinator, other}) {
    CAPTURE(slot);
    CHECK_MESSAGE(log_count_above(cluster.node(slot), two, twos[slot]), cluster.node(slot).log());
  }
  CHECK_MESSAGE(contains(cluster.node(coordinator).log(),
                         "is registered in etcd but has not joined within peer_silence_ms"),
                cluster.node(coordinator).log());
  CHECK(all_ok(run_workers_on(cluster, sorted(coordinator, other), "member-cut-from-coordinator", 1,
                              kSweep, 120000, kExact)));
  for (int slot = 0; slot < 3; ++slot) threes[slot] = count(slot, three);
  net.set_cut(member, coordinator, false);
  for (int slot = 0; slot < 3; ++slot) {
    CAPTURE(slot);
    CHECK_MESSAGE(log_count_above(cluster.node(slot), three, threes[slot]),
                  cluster.node(slot).log());
  }
  CHECK(all_ok(run_cluster_workers(cluster, "cut-mended", 1, kSweep, 120000, kExact)));

  // The coordinator cut off: the other two elect one of them and go on as two.
  for (int slot = 0; slot < 3; ++slot) twos[slot] = count(slot, two);
  net.set_link(coordinator, false);
  for (int slot : {member, other}) {
    CAPTURE(slot);
    CHECK_MESSAGE(log_count_above(cluster.node(slot), two, twos[slot]), cluster.node(slot).log());
    CHECK_MESSAGE(contains(cluster.node(slot).log(), "a new election"), cluster.node(slot).log());
  }
  CHECK(all_ok(run_workers_on(cluster, sorted(member, other), "coordinator-cut", 1, kSweep, 120000,
                              kExact)));

  // Healed, the old coordinator finds another elected under a newer term: it may no longer
  // act for the cluster, and its daemon stops naming why. Started again (as systemd's
  // Restart= would), it joins as a member.
  net.set_link(coordinator, true);
  CHECK(cluster.node(coordinator).wait_exit(30000) > 0);
  CHECK_MESSAGE(
      contains(cluster.node(coordinator).log(), "while this one could not renew its lease"),
      cluster.node(coordinator).log());
  std::string logs = cluster.node(coordinator).log();
  for (int slot = 0; slot < 3; ++slot) threes[slot] = count(slot, three);
  cluster.restart(coordinator);
  for (int slot : {member, other}) {
    CAPTURE(slot);
    CHECK_MESSAGE(log_count_above(cluster.node(slot), three, threes[slot]),
                  cluster.node(slot).log());
  }
  CHECK(all_ok(run_cluster_workers(cluster, "coordinator-healed", 1, kSweep, 120000, kExact)));

  // Fencing: every epoch, the cut-off coordinator's included, was formed by one coordinator.
  for (int slot = 0; slot < 3; ++slot) logs += cluster.node(slot).log();
  check_one_coordinator_per_epoch(logs, 7, /*at_least=*/true);
}

TEST_CASE("membership/etcd: an etcd that cannot be reached at start is a clear error") {
  auto ports = ClusterProcesses::free_endpoints(2);  // nothing listens on ports[0]
  DaemonProcess daemon("pxt-etcd-unreachable",
                       {"--membership", "etcd://" + ports[0] + "/parallax-tests/none",
                        "--node-count", "2", "--listen", ports[1]},
                       false);
  CHECK(daemon.wait_exit(15000) == 1);
  CHECK_MESSAGE(contains(daemon.log(), "membership: cannot reach etcd at etcd://" + ports[0]),
                daemon.log());
}
