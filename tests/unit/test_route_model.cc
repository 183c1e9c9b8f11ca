// The route estimates of a measuring router (route_model.h): the byte counts of each route
// against hand-computed ones, and the choice as α, skew and node count change.
#include <doctest/doctest.h>

#include <vector>

#include "sharding/route_model.h"

namespace px {
namespace {

RouteMeasure measure(int nodes, uint64_t rows, uint64_t dim, double unique_rows) {
  RouteMeasure m;
  m.nodes = nodes;
  m.rows = rows;
  m.dim = dim;
  m.unique_rows = unique_rows;
  m.ps_share.assign(static_cast<size_t>(nodes), 1.0 / nodes);
  m.rows_share = m.ps_share;
  m.ps_requests_per_owner = 1;
  return m;
}

const RouteEstimate& named(const std::vector<RouteEstimate>& all, const std::string& route) {
  for (const RouteEstimate& e : all)
    if (e.route == route) return e;
  FAIL("no estimate for " << route);
  return all.front();
}

TEST_CASE("route model: bytes per step of every route, by hand") {
  // 4 nodes, 1,000,000 rows of 64 f32, 10,000 unique rows a node per step, even shares.
  auto all = estimate_routes(measure(4, 1000000, 64, 10000), LinkModel{});
  REQUIRE(all.size() == 5);
  // ps: out = 3·u·¼·256 + u·¾·(16+256) = 1,920,000 + 2,040,000; in the same, mirrored.
  CHECK(named(all, "ps").busiest_bytes == doctest::Approx(3960000));
  CHECK(named(all, "alltoall-rows").busiest_bytes == doctest::Approx(3960000));
  // Columns: 3·u·(16 + 2·16·4) = 4,320,000 (the indices go to every node).
  CHECK(named(all, "alltoall-columns").busiest_bytes == doctest::Approx(4320000));
  CHECK(named(all, "allgatherv").busiest_bytes == doctest::Approx(3.0 * 10000 * (8 + 256)));
  CHECK(named(all, "allreduce").busiest_bytes == doctest::Approx(1.5 * 1000000 * 64 * 4));
  CHECK(fastest(all).route == "ps");
  // Time: bytes at 125 MB/s plus 50 µs a message (6 messages per owner on ps).
  CHECK(named(all, "ps").seconds == doctest::Approx(3960000 / 125e6 + 18 * 50e-6));
}

TEST_CASE("route model: skew on the owners favours columns; a 16-bit wire halves values") {
  // Every node's rows mostly on node 0 under both row maps (a hot head on one owner).
  RouteMeasure m = measure(4, 1000000, 64, 10000);
  m.ps_share = {0.7, 0.1, 0.1, 0.1};
  m.rows_share = m.ps_share;
  auto all = estimate_routes(m, LinkModel{});
  CHECK(share_skew(m.ps_share) == doctest::Approx(2.8));
  double columns = named(all, "alltoall-columns").busiest_bytes;
  CHECK(named(all, "ps").busiest_bytes > 1.4 * columns);
  CHECK(fastest(all).route == "alltoall-columns");
  m.wire_value_bytes = 2;
  auto half = estimate_routes(m, LinkModel{});
  CHECK(named(half, "alltoall-columns").busiest_bytes == doctest::Approx(3.0 * 10000 * (16 + 64)));
  // The replicated routes send f32 whatever the wire.
  CHECK(named(half, "allgatherv").busiest_bytes == named(all, "allgatherv").busiest_bytes);
}

TEST_CASE("route model: a table touched whole each step goes to allreduce; messages break ties") {
  // 2,000 rows, every node touching all of them each step: the dense ring moves less
  // (at 1,500 rows a node ps would still move less: (N-1)/N·u·(16+2db) against 2(N-1)/N·R·4d).
  auto dense = estimate_routes(measure(4, 2000, 64, 2000), LinkModel{});
  CHECK(fastest(dense).route == "allreduce");
  // Messages decide between equal bytes: ps with 8 requests per owner pays for them.
  RouteMeasure m = measure(2, 1000000, 64, 100);
  m.ps_requests_per_owner = 8;
  auto few = estimate_routes(m, LinkModel{});
  CHECK(named(few, "ps").busiest_bytes == named(few, "alltoall-rows").busiest_bytes);
  CHECK(named(few, "ps").seconds > named(few, "alltoall-rows").seconds);
  // One node: nothing crosses a link; every route but the replicated ones' messages ties.
  auto alone = estimate_routes(measure(1, 1000, 8, 100), LinkModel{});
  for (const RouteEstimate& e : alone) CHECK(e.busiest_bytes == 0);
  CHECK(estimate_routes(RouteMeasure{}, LinkModel{}).empty());
}

TEST_CASE("route model: the options' route by its model name") {
  SparseOptions o;
  CHECK(route_model_name(o) == "ps");
  o.route = Route::kAlltoall;
  CHECK(route_model_name(o) == "alltoall-rows");
  o.alltoall_split = Split::kColumns;
  CHECK(route_model_name(o) == "alltoall-columns");
  o.route = Route::kAllgatherv;
  CHECK(route_model_name(o) == "allgatherv");
}

}  // namespace
}  // namespace px
