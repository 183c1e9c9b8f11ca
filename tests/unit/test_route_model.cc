// The route estimates of a measuring router (route_model.h): the byte counts of each route
// against hand-computed ones, and the choice as α, skew and node count change.
#include <doctest/doctest.h>

#include <cmath>
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
  // Time: bytes at 125 MB/s; messages are counted (6 per owner on ps), not charged.
  CHECK(named(all, "ps").seconds == doctest::Approx(3960000 / 125e6));
  CHECK(named(all, "ps").messages == 18);
  // Equal bytes, or within the margin: the route in use stays.
  CHECK(choose(all, "alltoall-rows").route == "alltoall-rows");
  CHECK(choose(all, "alltoall-columns").route == "alltoall-columns");  // ps only 8% fewer
  CHECK(choose(all, "allgatherv").route == "ps");
  CHECK(choose(all, "allreduce").route == "ps");
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
  CHECK(choose(all, "ps").route == "alltoall-columns");
  m.wire_value_bytes = 2;
  auto half = estimate_routes(m, LinkModel{});
  CHECK(named(half, "alltoall-columns").busiest_bytes == doctest::Approx(3.0 * 10000 * (16 + 64)));
  // The replicated routes send f32 whatever the wire.
  CHECK(named(half, "allgatherv").busiest_bytes == named(all, "allgatherv").busiest_bytes);
}

TEST_CASE("route model: narrow rows touched whole each step go to allreduce; one node moves none") {
  // 2,000 rows of 4 values, every node touching all of them each step: ps pays 16 bytes of
  // indices per row against 16 of values, the dense ring none.
  auto dense = estimate_routes(measure(4, 2000, 4, 2000), LinkModel{});
  CHECK(fastest(dense).route == "allreduce");
  CHECK(choose(dense, "ps").route == "allreduce");
  // Wide rows, the same lookups: ps's indices are noise, allreduce within the margin.
  auto wide = estimate_routes(measure(4, 2000, 64, 2000), LinkModel{});
  CHECK(named(wide, "allreduce").busiest_bytes < named(wide, "ps").busiest_bytes);
  CHECK(choose(wide, "ps").route == "ps");
  // One node: nothing crosses a link.
  auto alone = estimate_routes(measure(1, 1000, 8, 100), LinkModel{});
  for (const RouteEstimate& e : alone) CHECK(e.busiest_bytes == 0);
  CHECK(choose(alone, "ps").route == "ps");
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
  // And back: every name to options on that route (the inverse, a count kept where it fits).
  SparseOptions base;
  base.optimizer = Optimizer::kAdam;
  for (const char* name : {"ps", "alltoall-rows", "alltoall-columns", "allgatherv", "allreduce"}) {
    CAPTURE(name);
    SparseOptions there = route_model_options(base, name, 8);
    CHECK(route_model_name(there) == name);
    CHECK(there.optimizer == Optimizer::kAdam);
    std::string error;
    CHECK_MESSAGE(there.validate(&error), error);
    CHECK(there.partitions == (there.route == Route::kAlltoall ? 0u : 8u));
  }
}

TEST_CASE("route model: a move's bytes, and what repays them") {
  // 1,000 x 8 f32 with Adam (two state slots): 96,000 bytes; each of 4 nodes receives 3/4.
  CHECK(move_bytes(1000, 8, 2, 4, false) == doctest::Approx(72000));
  CHECK(move_bytes(1000, 8, 0, 2, false) == doctest::Approx(16000));
  CHECK(move_bytes(1000, 8, 2, 4, true) == 0);   // replicated: every node holds every row
  CHECK(move_bytes(1000, 8, 2, 1, false) == 0);  // one node: nothing to send
  // The LM1B table (800,000 x 128, SGD) at N = 2: 205 MB a node, so a route must save more
  // than 205 kB a step to repay it within kMovePaybackSteps.
  double lm1b = move_bytes(800000, 128, 0, 2, false);
  CHECK(lm1b == doctest::Approx(204.8e6));
  CHECK(lm1b / kMovePaybackSteps == doctest::Approx(204.8e3));
  CHECK(payback_steps(lm1b, 5e6, 4.5e6) == doctest::Approx(409.6));  // 10% of 5 MB a step
  CHECK(payback_steps(lm1b, 5e6, 4.9e6) > kMovePaybackSteps);        // 2%: 2,048 steps
  CHECK(std::isinf(payback_steps(lm1b, 5e6, 5e6)));                  // saves nothing
  CHECK(payback_steps(0, 5e6, 6e6) == 0);  // from a replicated route: nothing to send
}

}  // namespace
}  // namespace px
