// PX_ROUTE_AUTO: tables that move between routes mid-training (daemon/sparse/route_move.cc)
// give the reference table, pull by pull; and the estimate, agreed by the nodes, moves a
// table whose pulls another route serves with fewer bytes. Real daemons on loopback, real
// workers checking every pulled row against a reference optimizer (sparse_scenarios.cc).
#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

#include "tests/integration/harness.h"

using namespace pxt;

namespace {

std::vector<std::string> train(const std::string& optimizer, int steps,
                               const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"sparse-train",       "--optimizer", optimizer,
                                   "--aggregation",      "mean",        "--steps",
                                   std::to_string(steps)};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

const char* const kEveryRoute = "alltoall-columns,allreduce,alltoall-rows,allgatherv,ps";

}  // namespace

TEST_CASE("sparse auto: a table moved through every route mid-training gives the reference") {
  // An estimate every 4 pull steps, each choosing the next route of the sequence: the table
  // moves 9 times within the 40 steps, Adam's state and step count with it.
  for (int nodes : {2, 3}) {
    CAPTURE(nodes);
    ClusterProcesses cluster("sa-seq" + std::to_string(nodes), nodes,
                             {"--route-estimate-steps", "4", "--route-auto-sequence", kEveryRoute});
    for (const char* optimizer : {"adam", "adagrad"}) {
      CAPTURE(optimizer);
      auto results = run_cluster_workers(cluster, std::string("auto-") + optimizer, 6 / nodes,
                                         train(optimizer, 40, {"--route", "auto", "--bad-pushes"}));
      CHECK(all_ok(results));
      CHECK(same_field(results, "table_hash"));
    }
    for (int i = 0; i < nodes; ++i) {
      std::string log = cluster.node(i).log();
      for (const char* move : {"moved from ps to alltoall-columns before pull step 4 ",
                               "moved from alltoall-columns to allreduce before pull step 8 ",
                               "moved from allreduce to alltoall-rows before pull step 12 ",
                               "moved from alltoall-rows to allgatherv before pull step 16 ",
                               "moved from allgatherv to ps before pull step 20 "}) {
        CAPTURE(move);
        CHECK(contains(log, "variable 'emb' of job 'auto-adam': " + std::string(move)));
        CHECK(contains(log, "variable 'emb' of job 'auto-adagrad': " + std::string(move)));
      }
      CHECK(contains(log, "starts on ps, moved to the route the estimates choose"));
    }
  }
}

TEST_CASE("sparse auto: every row touched each step moves the table to allreduce, by estimate") {
  // 1000 x 8 rows, all pulled every step: allreduce's dense exchange moves 20% fewer bytes
  // than ps on 2 and 3 nodes (route_model.h). The nodes agree on the estimate and move, as
  // they do for the default route (hybrid); a table given ps only logs the choice.
  for (int nodes : {2, 3}) {
    CAPTURE(nodes);
    ClusterProcesses cluster("sa-est" + std::to_string(nodes), nodes,
                             {"--route-estimate-steps", "4"});
    auto results = run_cluster_workers(cluster, "dense", 6 / nodes,
                                       train("sgd", 12, {"--route", "auto", "--every-row"}));
    CHECK(all_ok(results));
    CHECK(same_field(results, "table_hash"));
    auto fixed = run_cluster_workers(cluster, "fixed", 6 / nodes,
                                     train("sgd", 6, {"--route", "ps", "--every-row"}));
    CHECK(all_ok(fixed));
    // The default route, hybrid, is auto for a sync table.
    auto hybrid = run_cluster_workers(cluster, "default", 6 / nodes,
                                      train("sgd", 12, {"--route", "hybrid", "--every-row"}));
    CHECK(all_ok(hybrid));
    CHECK(same_field(hybrid, "table_hash"));
    CHECK(field(hybrid[0].output, "table_hash") == field(results[0].output, "table_hash"));
    for (int i = 0; i < nodes; ++i) {
      std::string log = cluster.node(i).log();
      CHECK(contains(log,
                     "variable 'emb' of job 'dense': moved from ps to allreduce before pull "
                     "step 4 "));
      CHECK(contains(log,
                     "variable 'emb' of job 'default': moved from ps to allreduce before pull "
                     "step 4 "));
      CHECK(contains(log, "the table moves from ps to allreduce"));
      CHECK(contains(log, "the table stays on ps (its route was given"));
    }
  }
}

TEST_CASE("sparse auto: reads between pull and push, checkpoints and restores across moves") {
  // Reads mid-step at every step, moves every 3 pull steps (so some reads come while a move
  // waits for the push they precede); a checkpoint after six moves (the table by columns
  // again, its rows moved through every layout), restored onto 3 nodes and onto 1, where the
  // resumed training matches the uninterrupted reference.
  ScratchDir scratch("auto-ckpt");
  const std::string& dir = scratch.path();
  {
    ClusterProcesses cluster("sa-ck2", 2,
                             {"--route-estimate-steps", "3", "--route-auto-sequence", kEveryRoute});
    auto results = run_cluster_workers(cluster, "ck", 3,
                                       train("adam", 20, {"--route", "auto", "--read-mid-step"}),
                                       120000, {{"PX_TEST_CHECKPOINT_DIR", dir}});
    CHECK(all_ok(results));
    CHECK(same_field(results, "table_hash"));
    CHECK(contains(cluster.node(1).log(), "moved from allgatherv to ps before pull step 15 "));
    CHECK(contains(cluster.node(0).log(), "checkpoint of variable 'emb'"));
  }
  std::map<std::string, std::string> resume = {{"PX_TEST_START_STEP", "20"}};
  {
    ClusterProcesses cluster("sa-ck3", 3,
                             {"--restore", dir, "--route-estimate-steps", "2",
                              "--route-auto-sequence", "alltoall-columns,allreduce"});
    auto results = run_cluster_workers(cluster, "ck", 2, train("adam", 26, {"--route", "auto"}),
                                       120000, resume);
    CHECK(all_ok(results));
    CHECK(same_field(results, "table_hash"));
    CHECK(contains(cluster.node(2).log(), "restored from"));
    CHECK(contains(cluster.node(2).log(), "moved from alltoall-columns to allreduce"));
  }
  {
    DaemonProcess daemon("sa-ck1", {"--restore", dir});
    CHECK(all_ok(
        run_workers(daemon, "ck", 6, train("adam", 26, {"--route", "auto"}), 120000, resume)));
  }
}

TEST_CASE("sparse auto: loads and checkpoints wait for a move under way") {
  ClusterProcesses cluster("sa-load", 2,
                           {"--route-estimate-steps", "1", "--route-auto-sequence", kEveryRoute});
  CHECK(all_ok(run_cluster_workers(cluster, "auto-load", 2, {"sparse-load", "--route", "auto"})));
}

TEST_CASE("sparse auto: a daemon killed while the table moves every step fails the others' steps") {
  // Every pull step is an estimate and a move (the sequence cycles), so the kill lands on an
  // agreement or a move: the survivors' operations held by it must fail with PX_ERR_PEER_LOST
  // naming the lost node, within their deadline, and a checkpoint after it too.
  ClusterProcesses cluster("sa-kill", 3,
                           {"--route-estimate-steps", "1", "--route-auto-sequence", kEveryRoute});
  KilledNodeRun run = run_cluster_workers_killing_node(
      cluster, "steady", 1, {"until-lost", "--sparse", "--auto-route"}, 1);
  CHECK(run.ready_nodes == 3);
  REQUIRE(run.results.size() == 3);
  for (int node : {0, 2}) {
    const WorkerResult& r = run.results[static_cast<size_t>(node)];
    CHECK_MESSAGE(r.exit_code == 0, r.output);
    CHECK_MESSAGE(contains(r.output, "node 1"), r.output);
    CHECK_MESSAGE(contains(r.output, "CHECKPOINT failed"), r.output);
  }
  CHECK(cluster.node(0).alive());
  CHECK(cluster.node(2).alive());
  // The nodes agreed on an estimate before the kill (every node finished a step by then);
  // the kill lands on an agreement, a move or a step between them.
  CHECK(contains(cluster.node(0).log(),
                 "variable 'steady' of job 'steady': route estimate over pull steps 0-0: "));
}
