// Prefetch with EmbRace's relaxed dependency (px_sparse_options.prefetch, px_prefetch_rows):
// real parallaxd processes (one, or a cluster on loopback over tcp;ofi_rxm) and real workers
// that pull each step before the previous push and check every row bitwise against a
// reference (prefetch_scenarios.cc): no stale row, whichever route, and rows served ahead.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "tests/integration/harness.h"
#include "tests/integration/text_util.h"

using namespace pxt;

namespace {

std::vector<std::string> prefetch_train(std::vector<std::string> more) {
  std::vector<std::string> args = {"prefetch-train", "--steps", "12"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

uint64_t served_ahead(const std::vector<WorkerResult>& results, size_t workers_per_node) {
  uint64_t total = 0;  // every worker of a node reports its node's count
  for (size_t i = 0; i < results.size(); i += workers_per_node)
    total += std::strtoull(field(results[i].output, "rows_served_ahead").c_str(), nullptr, 10);
  return total;
}

}  // namespace

TEST_CASE("prefetch: on one node a pull issued before the previous push sees that push") {
  DaemonProcess daemon("prefetch1");
  auto results = run_workers(daemon, "prefetch-1", 2, prefetch_train({"--partitions", "3"}));
  CHECK(all_ok(results));
  CHECK(same_field(results, "table_hash"));
}

TEST_CASE(
    "prefetch: across 3 nodes the next step's rows are served ahead of the push where no "
    "node pulled them, never stale, on the ps, alltoall and bf16-wire routes") {
  ClusterProcesses cluster("prefetch3", 3);
  std::string hash;
  for (auto route : std::vector<std::vector<std::string>>{{"--route", "ps", "--partitions", "6"},
                                                          {"--route", "hybrid"},
                                                          {"--route", "alltoall-rows"},
                                                          {"--route", "alltoall-columns"}}) {
    CAPTURE(route[1]);
    auto results = run_cluster_workers(cluster, "prefetch-" + route[1], 2, prefetch_train(route));
    REQUIRE(all_ok(results));
    CHECK(same_field(results, "table_hash"));
    if (hash.empty()) hash = field(results[0].output, "table_hash");
    CHECK(field(results[0].output, "table_hash") == hash);  // every route, the same table
    CHECK(served_ahead(results, 2) > 0);
  }
  auto bf16 = run_cluster_workers(cluster, "prefetch-bf16", 2,
                                  prefetch_train({"--route", "ps", "--wire", "bf16"}));
  REQUIRE(all_ok(bf16));
  CHECK(same_field(bf16, "table_hash"));
  CHECK(served_ahead(bf16, 2) > 0);
}
