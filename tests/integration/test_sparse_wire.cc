// Sparse variables with a 16-bit wire dtype (px_sparse_options.wire_dtype): real parallaxd
// processes (one, or a cluster on loopback over tcp;ofi_rxm) and real workers that check
// every pulled row against a reference rounding where the daemons do (wire_scenarios.cc).
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "tests/integration/harness.h"
#include "tests/integration/text_util.h"

using namespace pxt;

namespace {

std::vector<std::string> wire_train(const std::string& wire, const std::string& partitions) {
  return {"wire-train", "--wire", wire, "--steps", "30", "--partitions", partitions};
}

uint64_t bytes_sent(const std::vector<WorkerResult>& results) {
  uint64_t total = 0;  // every worker of a node reports its node's count: sum node by node
  for (size_t i = 0; i < results.size(); i += 2)
    total += std::strtoull(field(results[i].output, "bytes_sent").c_str(), nullptr, 10);
  return total;
}

}  // namespace

TEST_CASE("wire: a bf16 wire on one node rounds pulls and pushes as across nodes") {
  DaemonProcess daemon("wire1");
  auto results = run_workers(daemon, "wire-bf16", 3, wire_train("bf16", "4"));
  CHECK(all_ok(results));
  CHECK(same_field(results, "table_hash"));
}

TEST_CASE(
    "wire: bf16 and f16 rows and gradients between 3 nodes follow the rounding "
    "reference, at half the value bytes, whichever node owns a row or column") {
  ClusterProcesses cluster("wire3", 3);
  auto f32 = run_cluster_workers(cluster, "wire-f32", 2, wire_train("f32", "6"));
  REQUIRE(all_ok(f32));
  CHECK(same_field(f32, "table_hash"));
  auto bf16 = run_cluster_workers(cluster, "wire-bf16", 2, wire_train("bf16", "6"));
  REQUIRE(all_ok(bf16));
  CHECK(same_field(bf16, "table_hash"));
  auto f16 = run_cluster_workers(cluster, "wire-f16", 2, wire_train("f16", "6"));
  REQUIRE(all_ok(f16));
  CHECK(same_field(f16, "table_hash"));
  // The same requests carry 2 bytes per value instead of 4 (indices and headers unchanged):
  // with 32 values per row, between 0.5 and 0.6 of the f32 bytes.
  double ratio = double(bytes_sent(bf16)) / double(bytes_sent(f32));
  CAPTURE(ratio);
  CHECK(ratio > 0.5);
  CHECK(ratio < 0.6);
  CHECK(bytes_sent(f16) == bytes_sent(bf16));
  // Every row on node 0 (one partition): the other nodes' sums are rounded as node 0's own
  // are, so the table is bitwise the one the six partitions gave.
  auto one_owner = run_cluster_workers(cluster, "wire-bf16-p1", 2, wire_train("bf16", "1"));
  REQUIRE(all_ok(one_owner));
  CHECK(field(one_owner[0].output, "table_hash") == field(bf16[0].output, "table_hash"));
  // Every node holding a slice of every row's columns (the column-wise alltoall route): each
  // column is summed, rounded and applied as a whole-row owner does, so the same table.
  std::vector<std::string> columns = wire_train("bf16", "0");
  columns.insert(columns.end(), {"--route", "alltoall-columns"});
  auto by_columns = run_cluster_workers(cluster, "wire-bf16-cols", 2, columns);
  REQUIRE(all_ok(by_columns));
  CHECK(field(by_columns[0].output, "table_hash") == field(bf16[0].output, "table_hash"));
}

TEST_CASE(
    "wire: dense allreduce on a bf16 and an f16 wire between 2 nodes is within the wire's "
    "bound of the exact sum, a wire value alike on every worker, and one node rounds nothing") {
  ClusterProcesses cluster("dwire", 2);
  for (std::string wire : {"bf16", "f16"}) {
    auto results = run_cluster_workers(cluster, "dwire-" + wire, 2, {"wire-dense", "--wire", wire});
    CHECK(all_ok(results));
    CHECK(same_field(results, "dense_hash"));
  }
  DaemonProcess daemon("dwire1");
  auto single = run_workers(daemon, "dwire-one", 2, {"wire-dense", "--wire", "bf16"});
  CHECK(all_ok(single));
  CHECK(same_field(single, "dense_hash"));
}
