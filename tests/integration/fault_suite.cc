// Randomized faults on a 3-node cluster of real daemons running sparse and dense training
// (px_test_worker until-lost): SIGKILL of a worker, of a member daemon or of the
// coordinator, SIGSTOP of a daemon past the peer silence, a daemon killed and started again
// at once under its index, and a stray daemon of another configuration. After each fault:
// every worker has exited within its deadline (none is killed by this suite), the workers
// of the surviving nodes were told PX_ERR_PEER_LOST naming the right node or worker, no
// surviving daemon has died, and once the victim is back the cluster has re-formed and a
// job runs on every node. Prints one JSON object; exits 0 when every fault ended so.
// With --membership the daemons' membership is on a 3-member etcd cluster started here
// (docs/elastic.md): indices are assigned and the coordinator elected, so the victims are
// found by what each daemon's log says it is, a stopped daemon is left out (its lease would
// expire: a stopped coordinator is replaced and exits when it runs again, by design), and
// one more fault kills an etcd member while the job runs (it must not notice; the member
// is started again after). With --partition (implies --membership; needs root) each daemon
// runs in a network namespace of its own and etcd in a fourth, and one more fault takes a
// node's link down past the peer silence and its lease, then heals it: the job fails
// naming it, and the cluster re-forms on all three (a cut-off coordinator finds another
// elected and exits, by design; it is started again, as after a kill).
//   px_fault_suite [--faults N] [--seed S] [--membership] [--partition]
// The test suite runs a short count (tests/integration/CMakeLists.txt), `px-bench faults`
// the full one.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/etcd_cluster.h"
#include "tests/integration/harness.h"
#include "tests/integration/netns_bridge.h"

using namespace pxt;

namespace {

constexpr int kNodes = 3;
constexpr int kSilenceMs = 1500;

enum Kind {
  kKillWorker,
  kKillMember,
  kKillCoordinator,
  kStopDaemon,
  kRestartAtOnce,
  kStray,
  kKillEtcdMember,
  kPartition
};
const char* kKindNames[] = {"kill_worker",     "kill_member",  "kill_coordinator", "stop_daemon",
                            "restart_at_once", "stray_daemon", "kill_etcd_member", "partition"};

// The node index the daemon's log last says etcd assigned it; the slot itself in a static
// cluster.
int index_of(ClusterProcesses& cluster, int slot, bool membership) {
  if (!membership) return slot;
  std::string log = cluster.node(slot).log();
  const std::string mark = "node index ";
  size_t at = log.rfind(mark);
  return at == std::string::npos ? -1 : atoi(log.c_str() + at + mark.size());
}

// The slot of the coordinating daemon: 0 in a static cluster; with membership, the one that
// last said it waits for the nodes as coordinator (the others say "coordinator is" too).
int coordinator_slot(ClusterProcesses& cluster, bool membership) {
  if (!membership) return 0;
  int slot = -1;
  size_t latest = 0;
  for (int i = 0; i < kNodes; ++i) {
    std::string log = cluster.node(i).log();
    size_t at = log.rfind("coordinator of cluster");
    if (at != std::string::npos && (slot < 0 || at >= latest)) slot = i, latest = at;
  }
  return slot < 0 ? 0 : slot;
}

struct Tally {
  int faults = 0, ok = 0, hangs = 0, crashes = 0, misnamed = 0, failed_heals = 0;
  std::map<std::string, int> by_kind;
  std::vector<std::string> failures;  // the first few, for the log
};

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

void fail(Tally& t, int& bad, const std::string& what) {
  ++bad;
  if (t.failures.size() < 20) t.failures.push_back(what);
  fprintf(stderr, "FAULT SUITE: %s\n", what.c_str());
}

// A job on every node runs until it sees the fault; returns once every worker exited.
std::vector<WorkerResult> run_until_fault(ClusterProcesses& cluster, const std::string& job,
                                          bool sparse, const std::string& ready_dir,
                                          const std::map<std::string, std::string>& extra_env,
                                          const std::function<void()>& inject) {
  std::map<std::string, std::string> env = extra_env;
  env["PX_TEST_READY_DIR"] = ready_dir;
  std::vector<std::string> args = {"until-lost"};
  if (sparse) args.push_back("--sparse");
  std::vector<WorkerResult> results;
  // 60 s: far past every wait of the scenario (30 s) and the loss detection (1.25 x 1.5 s).
  std::thread workers([&] { results = run_cluster_workers(cluster, job, 1, args, 60000, env); });
  wait_for_ready_files(ready_dir, kNodes, 60000);
  inject();
  workers.join();
  return results;
}

// Once every daemon is up: a small job on every node, retried while the cluster re-forms.
bool healthy(ClusterProcesses& cluster, const std::string& job) {
  for (int attempt = 0; attempt < 15; ++attempt) {
    auto results = run_cluster_workers(cluster, job + "-" + std::to_string(attempt), 1,
                                       {"sweep", "--counts", "1"}, 60000, {{"PX_TEST_EXACT", "1"}});
    if (all_ok(results)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  int faults = 6;
  unsigned seed = 20261123;
  bool membership = false, partition = false;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--membership")
      membership = true;
    else if (flag == "--partition")
      membership = partition = true;
    else if (flag == "--faults" && i + 1 < argc)
      faults = atoi(argv[++i]);
    else if (flag == "--seed" && i + 1 < argc)
      seed = static_cast<unsigned>(strtoul(argv[++i], nullptr, 10));
  }
  std::mt19937 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  auto start = std::chrono::steady_clock::now();
  std::unique_ptr<NetnsBridge> net;  // destroyed last: the processes in it go first
  if (partition) {
    std::string unavailable = NetnsBridge::unavailable();
    if (!unavailable.empty()) {
      printf("px_fault_suite --partition: skipped: %s\n", unavailable.c_str());
      return 77;
    }
    net = std::make_unique<NetnsBridge>("pxf" + std::to_string(getpid()), kNodes + 1);
  }
  auto launcher = [&](int slot) { return net ? net->launcher(slot) : std::vector<std::string>{}; };
  std::unique_ptr<EtcdCluster> etcd;
  std::vector<std::string> listens = ClusterProcesses::free_endpoints(kNodes);
  if (net)
    for (int slot = 0; slot < kNodes; ++slot)
      listens[static_cast<size_t>(slot)] = net->address(slot) + ":7070";
  std::string url;
  if (membership) {
    const std::string tag = "faults-" + std::to_string(getpid());
    etcd = net ? std::make_unique<EtcdCluster>(tag, 3, net->address(kNodes), launcher(kNodes))
               : std::make_unique<EtcdCluster>(tag, 3);
    url = "etcd://" + etcd->endpoints() + "/parallax-faults/" + std::to_string(getpid());
  }
  ClusterProcesses cluster = [&] {
    if (!membership)
      return ClusterProcesses("faults", kNodes, {"--peer-silence-ms", std::to_string(kSilenceMs)});
    return ClusterProcesses(
        "faults", kNodes,
        [&](int slot) {
          auto args = membership_args("faults", url, kNodes, listens[static_cast<size_t>(slot)],
                                      kSilenceMs);
          // shm would cross the namespaces: a partition must cut the data plane too.
          if (net) args.insert(args.end(), {"--fabric-provider", "tcp;ofi_rxm"});
          return args;
        },
        launcher);
  }();
  // The kinds this run draws from, in the order the first faults cover them once.
  std::vector<Kind> kinds = {kKillWorker, kKillMember,    kKillCoordinator,
                             kStopDaemon, kRestartAtOnce, kStray};
  if (membership)
    kinds = {kKillWorker, kKillMember, kKillCoordinator, kKillEtcdMember, kRestartAtOnce, kStray};
  if (partition) kinds.push_back(kPartition);
  const int kinds_count = static_cast<int>(kinds.size());
  Tally tally;
  for (int i = 0; i < faults; ++i) {
    // The first faults cover every kind once; then at random.
    Kind kind = kinds[static_cast<size_t>(i < kinds_count ? i : pick(kinds_count))];
    bool sparse = pick(2) == 1;
    int coordinator = coordinator_slot(cluster, membership);
    int victim = kind == kKillCoordinator ? coordinator
                 : kind == kKillMember    ? (coordinator + 1 + pick(kNodes - 1)) % kNodes
                                          : pick(kNodes);
    int victim_index = index_of(cluster, victim, membership);
    std::string job("f");  // appended: "f" + string trips a GCC 12 -Wrestrict false positive
    job += std::to_string(i);
    int etcd_victim = membership ? pick(3) : 0;
    std::string what =
        std::string(kKindNames[kind]) + " node " + std::to_string(victim_index) +
        (kind == kKillEtcdMember ? " and etcd member " + std::to_string(etcd_victim) : "") +
        (sparse ? " (sparse)" : " (dense)") + ", fault " + std::to_string(i);
    ScratchDir ready("faults-ready-" + std::to_string(i));
    std::map<std::string, std::string> env;
    int delay_ms = pick(800);
    bool daemon_down = kind == kKillMember || kind == kKillCoordinator || kind == kRestartAtOnce;
    int stray_exit = 0;
    if (kind == kKillWorker || kind == kStray || kind == kKillEtcdMember) {
      // The worker of global rank `victim_index` (one worker a node, so on that node) kills
      // itself a few steps in; a stray daemon or an etcd member's death comes first, and the
      // job must not notice it.
      env["PX_TEST_KILL_RANK"] = std::to_string(victim_index);
      env["PX_TEST_KILL_STEP"] = std::to_string(kind == kKillWorker ? 2 + pick(20) : 40 + pick(20));
    }
    auto inject = [&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      switch (kind) {
        case kKillWorker:
          break;  // the worker does it
        case kKillEtcdMember:
          etcd->kill(etcd_victim);
          break;
        case kStray: {
          // A daemon of a 2-node cluster of the same name: refused alone.
          std::string coordinator_at =
              membership ? listens[static_cast<size_t>(coordinator)] : cluster.endpoints()[0];
          auto args =
              ClusterProcesses::node_args("faults", {coordinator_at, cluster.endpoints()[1]}, 1);
          DaemonProcess stray("faults-stray" + std::to_string(i), args, false, launcher(victim));
          stray_exit = stray.wait_exit(20000);
          break;
        }
        case kPartition: {
          // Past the peer silence and the lease (2 s): its peers lose it, etcd lets its key
          // and, for a coordinator, the coordinator's key go.
          net->set_link(victim, false);
          std::this_thread::sleep_for(std::chrono::milliseconds(2 * kSilenceMs + pick(2000)));
          net->set_link(victim, true);
          break;
        }
        case kStopDaemon: {
          kill(cluster.node(victim).pid(), SIGSTOP);
          std::this_thread::sleep_for(std::chrono::milliseconds(kSilenceMs * 5 / 2));
          kill(cluster.node(victim).pid(), SIGCONT);
          break;
        }
        default: {
          // A restart at once (as systemd's Restart= does, 100 ms later) once the coordinator
          // has seen the connection close: before that the index is still taken.
          size_t losses = count(cluster.node(coordinator).log(), " lost: ");
          cluster.node(victim).kill_and_reap(SIGKILL);
          if (kind != kRestartAtOnce) break;
          for (int waited = 0; victim != coordinator && waited < 10000 &&
                               count(cluster.node(coordinator).log(), " lost: ") == losses;
               waited += 20)
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          cluster.restart(victim);
        }
      }
    };
    std::vector<size_t> reformed_before;
    for (int node = 0; node < kNodes; ++node)
      reformed_before.push_back(count(cluster.node(node).log(), "re-formed under"));
    auto results = run_until_fault(cluster, job, sparse, ready.path(), env, inject);
    if (kind == kKillMember || kind == kKillCoordinator) cluster.restart(victim);
    if (kind == kKillEtcdMember) etcd->restart(etcd_victim);
    bool restarted = daemon_down;
    if (kind == kPartition && victim == coordinator) {
      // Healed, it finds another elected under a newer term and exits; started again, as
      // systemd's Restart= would, it joins as a member.
      cluster.node(victim).wait_exit(20000);
      if (contains(cluster.node(victim).log(), "while this one could not renew its lease")) {
        cluster.restart(victim);
        restarted = true;
      }
    }
    if (daemon_down || kind == kStopDaemon || kind == kPartition) {
      // A node was lost: wait until every daemon has re-formed (a restarted one formed).
      for (int node = 0; node < kNodes; ++node) {
        bool fresh = restarted && node == victim;
        for (int waited = 0; waited < 30000; waited += 50) {
          std::string log = cluster.node(node).log();
          if (fresh ? contains(log, "ready: 3 nodes")
                    : count(log, "re-formed under") > reformed_before[static_cast<size_t>(node)])
            break;
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      }
    }
    ++tally.faults;
    ++tally.by_kind[kKindNames[kind]];
    int bad = 0;
    std::string named = "node " + std::to_string(victim_index);
    for (int node = 0; node < kNodes; ++node) {
      const WorkerResult& r = results[static_cast<size_t>(node)];
      if (r.exit_code == -1) {
        fail(tally, bad, what + ": node " + std::to_string(node) + "'s worker hung:\n" + r.output);
        ++tally.hangs;
      } else if (node == victim && (kind == kStopDaemon || kind == kPartition)) {
        // The stopped (or cut-off) daemon's own worker hears, once it runs again (or
        // without waiting for the heal), that its node (or, for the coordinator, the
        // others) was lost.
        if (r.exit_code != 0 || !contains(r.output, "LOST at step")) {
          fail(tally, bad, what + ": the stopped node's worker:\n" + r.output);
          ++tally.misnamed;
        }
      } else if (node == victim) {
        continue;  // killed with its daemon, or by itself
      } else if (r.exit_code != 0 || !contains(r.output, "LOST at step") ||
                 !contains(r.output, named)) {
        fail(tally, bad, what + ": node " + std::to_string(node) + "'s worker:\n" + r.output);
        ++tally.misnamed;
      }
    }
    if (kind == kStray && stray_exit != 1)
      fail(tally, bad, what + ": the stray daemon was not refused");
    for (int node = 0; node < kNodes; ++node) {
      if (restarted && node == victim) continue;
      if (!cluster.node(node).alive()) {
        fail(tally, bad,
             what + ": node " + std::to_string(node) + "'s daemon died:\n" +
                 cluster.node(node).log());
        ++tally.crashes;
        cluster.restart(node);
      }
    }
    if (!healthy(cluster, job + "-health")) {
      fail(tally, bad, what + ": no job ran on every node afterwards");
      ++tally.failed_heals;
    }
    if (bad == 0) ++tally.ok;
    fprintf(stderr, "fault %d: %s: %s\n", i, what.c_str(), bad == 0 ? "ok" : "FAILED");
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  printf(
      "{\"scenario\": \"faults\", \"membership\": \"%s\", \"nodes\": %d, \"faults\": %d, "
      "\"ok\": %d, \"hangs\": %d, "
      "\"daemon_crashes\": %d, \"misnamed\": %d, \"failed_heals\": %d, \"seed\": %u, "
      "\"seconds\": %.1f, \"by_kind\": {",
      partition    ? "etcd-netns"
      : membership ? "etcd"
                   : "static",
      kNodes, tally.faults, tally.ok, tally.hangs, tally.crashes, tally.misnamed,
      tally.failed_heals, seed, seconds);
  bool first = true;
  for (auto& [name, n] : tally.by_kind) {
    printf("%s\"%s\": %d", first ? "" : ", ", name.c_str(), n);
    first = false;
  }
  printf("}}\n");
  return tally.ok == tally.faults ? 0 : 1;
}
