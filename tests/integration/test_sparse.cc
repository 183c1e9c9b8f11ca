// Integration tests of sparse variables: real parallaxd processes (one, or a cluster on
// loopback over tcp;ofi_rxm) and real worker processes that check every pulled row
// against a reference optimizer (sparse_scenarios.cc).
#include <doctest/doctest.h>
#include <unistd.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tests/integration/harness.h"

using namespace pxt;

namespace {

// Every worker pulled the same final table.
bool same_table(const std::vector<WorkerResult>& results) {
  return same_field(results, "table_hash");
}

// sparse-train's flags: OPTIMIZER AGGREGATION STEPS, then optional extras.
std::vector<std::string> train(const std::string& optimizer, const std::string& aggregation,
                               int steps, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"sparse-train",       "--optimizer", optimizer,
                                   "--aggregation",      aggregation,   "--steps",
                                   std::to_string(steps)};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// sparse-bounded's flags, 30 steps, then optional extras.
std::vector<std::string> bounded(const std::string& consistency, int staleness,
                                 const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {
      "sparse-bounded",          "--consistency", consistency, "--staleness",
      std::to_string(staleness), "--steps",       "30"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

}  // namespace

TEST_CASE("sparse: one node, every optimizer, duplicates within and across workers") {
  DaemonProcess daemon("sp-opt");
  for (auto& [optimizer, args] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"sgd", train("sgd", "sum", 50)},
           {"adagrad", train("adagrad", "mean", 50, {"--partitions", "3", "--route", "ps"})},
           {"adam", train("adam", "sum", 50, {"--partitions", "2", "--route", "hybrid"})}}) {
    CAPTURE(optimizer);
    auto results = run_workers(daemon, "opt-" + optimizer, 3, args);
    CHECK(all_ok(results));
    CHECK(same_table(results));
  }
}

TEST_CASE("sparse: a bad index or a NaN fails that push alone and leaves no trace") {
  DaemonProcess daemon("sp-bad");
  CHECK(all_ok(run_workers(
      daemon, "bad", 2,
      train("adam", "mean", 10, {"--partitions", "0", "--route", "ps", "--bad-pushes"}))));
}

TEST_CASE("sparse: bad registrations, wrong operations and refused loads are clear errors") {
  DaemonProcess daemon("sp-err");
  CHECK(all_ok(run_workers(daemon, "errors", 2, {"sparse-errors"})));
  CHECK(contains(daemon.log(), "registered as sgd(lr="));
  CHECK(daemon.alive());
}

TEST_CASE("sparse groups: several tables take one pull and one push step together") {
  // px_register_sparse_group: one node, then two, on the routes that move rows differently.
  {
    DaemonProcess daemon("sp-group1");
    CHECK(all_ok(run_workers(daemon, "group", 2, {"group-train", "--steps", "6"})));
    CHECK(all_ok(run_workers(daemon, "group-mm", 2, {"group-mismatch"})));
  }
  ClusterProcesses cluster("sp-group2", 2);
  for (const char* route : {"ps", "allgatherv", "alltoall"}) {
    CAPTURE(route);
    CHECK(all_ok(run_cluster_workers(cluster, std::string("group-") + route, 1,
                                     {"group-train", "--steps", "6", "--route", route})));
  }
}

TEST_CASE("sparse: load, read and train from loaded values") {
  DaemonProcess daemon("sp-load");
  CHECK(all_ok(run_workers(daemon, "load", 2, {"sparse-load"})));
}

TEST_CASE("sparse: every route on 1, 2 and 3 nodes gives the reference table") {
  // World size 6 each time: 1 x 6, 2 x 3, 3 x 2 nodes x workers. Every run is checked
  // against the same reference, so the routes and node counts agree with each other.
  // {job, route, partitions, alltoall split}; the table is 8 columns wide, so by columns
  // 3 nodes hold 3, 3 and 2 of them.
  const char* routes[][4] = {
      {"hybrid", "hybrid", "0", "rows"},          {"ps", "ps", "7", "rows"},
      {"allgatherv", "allgatherv", "0", "rows"},  {"allreduce", "allreduce", "0", "rows"},
      {"alltoall-rows", "alltoall", "0", "rows"}, {"alltoall-columns", "alltoall", "0", "columns"}};
  auto args = [](const char* const* route) {
    return train(
        "adam", "mean", 50,
        {"--partitions", route[2], "--route", route[1], "--split", route[3], "--bad-pushes"});
  };
  {
    DaemonProcess daemon("sp-eq1");
    for (auto& route : routes) {
      CAPTURE(route[0]);
      auto results = run_workers(daemon, std::string("eq-") + route[0], 6, args(route));
      CHECK(all_ok(results));
      CHECK(same_table(results));
    }
  }
  for (int nodes : {2, 3}) {
    CAPTURE(nodes);
    ClusterProcesses cluster("sp-eq" + std::to_string(nodes), nodes);
    for (auto& route : routes) {
      CAPTURE(route[0]);
      auto results =
          run_cluster_workers(cluster, std::string("eq-") + route[0], 6 / nodes, args(route));
      CHECK(all_ok(results));
      CHECK(same_table(results));
    }
    // Every node holds its slice of columns of every row.
    for (int i = 0; i < nodes; ++i)
      CHECK(contains(cluster.node(i).log(), "alltoall by columns: every row's columns ["));
    // hybrid's automatic partitions: each node timed 4 groupings (1, 2, 4 and 8 requests per
    // node) within the 50 steps, switching between them mid-training, and kept one.
    for (int i = 0; i < nodes; ++i) {
      std::string log = cluster.node(i).log();
      CHECK(contains(log, "variable 'emb' of job 'eq-hybrid'"));
      CHECK(contains(log, "partition search: measured P=" + std::to_string(nodes) + ":"));
      CHECK(contains(log, " P=" + std::to_string(8 * nodes) + ": "));
      CHECK(contains(log, " time at P="));  // fitted, or measured when noise rules the fit
    }
    // Every route's table had its first route estimate after 32 pull steps (route_model.h).
    for (int i = 0; i < nodes; ++i) {
      std::string log = cluster.node(i).log();
      for (auto& route : routes) {
        CAPTURE(route[0]);
        CHECK(contains(log, std::string("variable 'emb' of job 'eq-") + route[0] +
                                "': route estimate over pull steps 0-31: "));
      }
      // Each route's estimate is listed.
      for (const char* each : {"link: ps ", ", alltoall-rows ", ", alltoall-columns ",
                               ", allgatherv ", ", allreduce "})
        CHECK(contains(log, each));
    }
  }
}

TEST_CASE("sparse: payloads cut into many chunks arrive whole") {
  // 4 KiB chunks: a step's pull replies and pushes span several messages per owner.
  ClusterProcesses cluster("sp-chunk", 2, {"--chunk-bytes", "4096"});
  for (auto [route, split] : std::vector<std::pair<std::string, std::string>>{
           {"hybrid", "rows"}, {"allgatherv", "rows"}, {"alltoall", "columns"}}) {
    CAPTURE(route);
    auto results = run_cluster_workers(
        cluster, "chunk-" + route + "-" + split, 2,
        train("adagrad", "sum", 20,
              {"--partitions", "0", "--route", route, "--split", split, "--bad-pushes"}));
    CHECK(all_ok(results));
    CHECK(same_table(results));
  }
}

TEST_CASE("sparse: a checkpoint on 2 nodes restores onto 3 nodes and onto 1") {
  // Saved after 10 Adam steps (world size 6), resumed for 5 more on another node count and
  // partitioning: every pull, and the final table, still match the uninterrupted reference
  // (values and optimizer state, including Adam's step count, came back).
  ScratchDir scratch("ckpt");
  const std::string& dir = scratch.path();
  std::map<std::string, std::string> save = {{"PX_TEST_CHECKPOINT_DIR", dir}};
  std::map<std::string, std::string> resume = {{"PX_TEST_START_STEP", "10"}};
  {
    ClusterProcesses cluster("sp-ck2", 2);
    CHECK(all_ok(run_cluster_workers(
        cluster, "ck", 3, train("adam", "mean", 10, {"--partitions", "0", "--route", "hybrid"}),
        120000, save)));
    CHECK(contains(cluster.node(0).log(), "checkpoint of variable 'emb'"));
  }
  CHECK(access((dir + "/ck.emb.manifest").c_str(), F_OK) == 0);
  CHECK(access((dir + "/ck.emb.node1.shard").c_str(), F_OK) == 0);
  {
    ClusterProcesses cluster("sp-ck3", 3, {"--restore", dir});
    auto results = run_cluster_workers(
        cluster, "ck", 2, train("adam", "mean", 15, {"--partitions", "5", "--route", "ps"}), 120000,
        resume);
    CHECK(all_ok(results));
    CHECK(same_table(results));
    CHECK(contains(cluster.node(2).log(), "restored from"));
  }
  {
    DaemonProcess daemon("sp-ck1", {"--restore", dir});
    CHECK(all_ok(run_workers(daemon, "ck", 6, train("adam", "mean", 15), 120000, resume)));
    // Another shape under the same name cannot take the checkpoint.
    auto results = run_workers(daemon, "ck", 1, {"sparse-restore-mismatch"}, 60000);
    CHECK(all_ok(results));
  }
}

TEST_CASE("sparse: alltoall checkpoints restore onto another node count, split and route") {
  // Saved by columns on 3 nodes (8 columns: 3, 3 and 2 per node) after 10 Adam steps, then
  // resumed by columns on 2 nodes (4 and 4: each node's columns come from two files) and on
  // ps with 5 partitions on 1 node (whole rows from three column files); saved by rows on 2
  // nodes, resumed by columns on 3.
  // Every pull and the final table match the uninterrupted reference.
  std::map<std::string, std::string> resume = {{"PX_TEST_START_STEP", "10"}};
  auto alltoall = [](const char* split, int steps) {
    return train("adam", "mean", steps, {"--route", "alltoall", "--split", split});
  };
  ScratchDir columns_scratch("ckpt-columns");
  const std::string& columns_dir = columns_scratch.path();
  {
    ClusterProcesses cluster("sp-a2a-c3", 3);
    CHECK(all_ok(run_cluster_workers(cluster, "ck", 2, alltoall("columns", 10), 120000,
                                     {{"PX_TEST_CHECKPOINT_DIR", columns_dir}})));
  }
  for (int i = 0; i < 3; ++i)
    CHECK(access((columns_dir + "/ck.emb.node" + std::to_string(i) + ".shard").c_str(), F_OK) == 0);
  {
    ClusterProcesses cluster("sp-a2a-c2", 2, {"--restore", columns_dir});
    auto results = run_cluster_workers(cluster, "ck", 3, alltoall("columns", 15), 120000, resume);
    CHECK(all_ok(results));
    CHECK(same_table(results));
    CHECK(contains(cluster.node(1).log(), "restored from"));
  }
  {
    DaemonProcess daemon("sp-a2a-ps1", {"--restore", columns_dir});
    CHECK(all_ok(run_workers(daemon, "ck", 6,
                             train("adam", "mean", 15, {"--partitions", "5", "--route", "ps"}),
                             120000, resume)));
  }
  ScratchDir rows_scratch("ckpt-rows");
  const std::string& rows_dir = rows_scratch.path();
  {
    ClusterProcesses cluster("sp-a2a-r2", 2);
    CHECK(all_ok(run_cluster_workers(cluster, "ck", 3, alltoall("rows", 10), 120000,
                                     {{"PX_TEST_CHECKPOINT_DIR", rows_dir}})));
  }
  {
    ClusterProcesses cluster("sp-a2a-c3b", 3, {"--restore", rows_dir});
    auto results = run_cluster_workers(cluster, "ck", 2, alltoall("columns", 15), 120000, resume);
    CHECK(all_ok(results));
    CHECK(same_table(results));
  }
}

TEST_CASE("sparse: sync, bounded and async consistency across 3 nodes") {
  ClusterProcesses cluster("sp-cons", 3);
  CHECK(all_ok(run_cluster_workers(cluster, "sync", 1, bounded("sync", 0))));
  CHECK(all_ok(run_cluster_workers(cluster, "bounded", 1, bounded("bounded", 2))));
  CHECK(all_ok(run_cluster_workers(cluster, "async", 1, bounded("async", 0))));
  // The same rules on the alltoall route, by columns (each node one unit of steps).
  std::vector<std::string> columns = {"--route", "alltoall", "--split", "columns"};
  CHECK(all_ok(run_cluster_workers(cluster, "sync-columns", 1, bounded("sync", 0, columns))));
  CHECK(all_ok(run_cluster_workers(cluster, "bounded-columns", 1, bounded("bounded", 2, columns))));
  CHECK(all_ok(run_cluster_workers(cluster, "async-columns", 1, bounded("async", 0, columns))));
}

TEST_CASE(
    "sparse: errors, loads, option mismatches and a checkpoint past its deadline on a cluster") {
  ClusterProcesses cluster("sp-cerr", 2);
  CHECK(all_ok(run_cluster_workers(cluster, "errors", 2, {"sparse-errors"})));
  ScratchDir load_scratch("sp-load-ckpt");
  const std::string& load_dir = load_scratch.path();
  for (auto [route, split] :
       std::vector<std::pair<std::string, std::string>>{{"ps", "rows"},
                                                        {"allgatherv", "rows"},
                                                        {"allreduce", "rows"},
                                                        {"alltoall", "rows"},
                                                        {"alltoall", "columns"}}) {
    CAPTURE(route);
    CAPTURE(split);
    CHECK(all_ok(run_cluster_workers(cluster, "load-" + route + "-" + split, 2,
                                     {"sparse-load", "--route", route, "--split", split}, 120000,
                                     {{"PX_TEST_CHECKPOINT_DIR", load_dir}})));
  }
  // By columns node 1 held none of the 1-column table's columns: its shard file is an
  // empty slice, and the checkpoint completed.
  CHECK(access((load_dir + "/load-alltoall-columns.large1.node1.shard").c_str(), F_OK) == 0);
  CHECK(access((load_dir + "/load-alltoall-columns.large1.manifest").c_str(), F_OK) == 0);
  auto results = run_cluster_workers(cluster, "mismatch", 1, {"sparse-node-mismatch"});
  CHECK(all_ok(results));
  CHECK(contains(results[0].output, "node-mismatch"));
  ScratchDir scratch("sp-ckpt-timeout");
  const std::string& dir = scratch.path();
  results = run_cluster_workers(cluster, "checkpoint-timeout", 1,
                                {"sparse-checkpoint-timeout", "--dir", dir});
  CHECK(all_ok(results));
  CHECK(contains(results[0].output, "checkpoint-timeout"));
}

TEST_CASE(
    "sparse: a daemon killed mid-training gives PX_ERR_PEER_LOST naming it, checkpoints too") {
  ClusterProcesses cluster("sp-kill", 3);
  KilledNodeRun run =
      run_cluster_workers_killing_node(cluster, "steady", 1, {"until-lost", "--sparse"}, 1);
  CHECK(run.ready_nodes == 3);
  const std::vector<WorkerResult>& results = run.results;
  REQUIRE(results.size() == 3);
  for (int node : {0, 2}) {
    const WorkerResult& r = results[static_cast<size_t>(node)];
    CHECK_MESSAGE(r.exit_code == 0, r.output);
    CHECK_MESSAGE(contains(r.output, "node 1"), r.output);
    // Then a checkpoint fails within its deadline, naming the lost node.
    // (the worker checks the status is PX_ERR_PEER_LOST).
    size_t at = r.output.find("CHECKPOINT failed");
    REQUIRE_MESSAGE(at != std::string::npos, r.output);
    std::string line = r.output.substr(at, r.output.find('\n', at) - at);
    CHECK_MESSAGE(contains(line, "node 1"), line);
  }
  CHECK(cluster.node(0).alive());
  CHECK(cluster.node(2).alive());
}
