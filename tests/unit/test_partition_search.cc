// Request groups (how a node's partitions are cut into requests), the row order within a
// group, and the automatic partition search's schedule and fit.
#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <vector>

#include "sharding/partition_search.h"
#include "sharding/request_groups.h"
#include "sharding/row_plan.h"

namespace px {
namespace {

TEST_CASE(
    "request groups deal each node's partitions into K groups, rows go partition by partition") {
  PartitionMap map(1000, 16, 4);  // 4 partitions per node
  for (uint32_t k : {1u, 2u, 4u, 8u}) {
    CAPTURE(k);
    RequestGroups groups(map, k);
    uint32_t per_node = std::min(k, 4u);
    CHECK(groups.count() == static_cast<int>(4 * per_node));
    for (int n = 0; n < 4; ++n) CHECK(groups.groups_on(n) == per_node);
    // Every partition is in exactly one group of its node, and the owner finds the same
    // partitions from (index, groups) alone.
    std::set<uint32_t> seen;
    for (int g = 0; g < groups.count(); ++g) {
      int node = groups.node(g);
      std::vector<uint32_t> in =
          partitions_in_group(map.partitions_of(node), groups.groups_on(node), groups.index(g));
      CHECK(in.size() == 4 / per_node);
      for (uint32_t p : in) {
        CHECK(map.node_of_partition(p) == node);
        CHECK(groups.group_of_row(p) == g);  // row p is in partition p
        CHECK(seen.insert(p).second);
      }
    }
    CHECK(seen.size() == 16);
  }

  // A group's rows in a plan: partitions ascending, rows ascending within each.
  RequestGroups two(map, 2);
  std::vector<int64_t> rows;
  for (int64_t r = 999; r >= 0; r -= 7) rows.push_back(r);
  std::vector<RowBatch> batches{{rows.data(), rows.size(), nullptr}};
  RowPlan plan(
      batches, 1, false, two.count(),
      [&](int64_t r) { return two.group_of_row(static_cast<uint64_t>(r)); }, two.row_order());
  CHECK(plan.unique_rows() == rows.size());
  for (int g = 0; g < two.count(); ++g) {
    for (size_t i = plan.group_begin(g) + 1; i < plan.group_begin(g + 1); ++i) {
      int64_t a = plan.rows()[i - 1], b = plan.rows()[i];
      CHECK(two.group_of_row(static_cast<uint64_t>(b)) == g);
      CHECK((a % 16 < b % 16 || (a % 16 == b % 16 && a < b)));
    }
  }
  // Order keys round-trip.
  RowOrder order = two.row_order();
  for (int64_t r : {0, 1, 15, 16, 17, 999}) CHECK(order.row(order.key(r)) == r);
}

TEST_CASE("the step-time fit recovers b, a and c and needs three distinct P") {
  std::vector<double> p{4, 8, 16, 32}, t;
  for (double x : p) t.push_back(0.2 / x + 0.001 * (x - 1) + 0.05);
  StepTimeFit fit = fit_step_time(p, t);
  REQUIRE(fit.usable);
  CHECK(fit.b == doctest::Approx(0.2));
  CHECK(fit.a == doctest::Approx(0.001));
  CHECK(fit.c == doctest::Approx(0.05));
  CHECK_FALSE(fit_step_time({4, 8, 8}, {1, 2, 3}).usable);
}

TEST_CASE("the partition search tries each candidate on its own steps, then keeps the fit's best") {
  PartitionSearch search({1, 2, 4, 8}, 4);
  CHECK(search.search_steps() == 22);
  CHECK(search.per_node_for(0) == 4);  // warm-up steps run at the initial grouping
  CHECK(search.per_node_for(1) == 4);
  CHECK(search.steps_left() == 23);
  std::vector<uint32_t> schedule;
  for (uint64_t s = 2; s < 22; ++s) schedule.push_back(search.per_node_for(s));
  CHECK(schedule ==
        std::vector<uint32_t>{1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 4, 4, 4, 4, 4, 8, 8, 8, 8, 8});
  // Steps whose time follows t(P) = 0.3/P + 0.002(P-1) + 0.05 (minimum near P = 12), each
  // step's start the previous one's plus its time; one outlier per trial is ignored by the
  // median.
  double now = 100;
  bool decided = false;
  for (uint64_t s = 0; s <= 22; ++s) {
    decided = search.push_started(s, now);
    if (decided) break;
    double p = 4.0 * search.per_node_for(s);
    double t = 0.3 / p + 0.002 * (p - 1) + 0.05;
    if (s % 5 == 3) t += 0.5;
    now += t;
  }
  REQUIRE(decided);
  CHECK(search.decided());
  CHECK(search.steps_left() == 0);
  CHECK(search.chosen() == 4);  // P = 16 beats 8 and 32 on that curve
  CHECK(search.per_node_for(23) == 4);
  CHECK(search.report().find("P=4: 0.1310 s") != std::string::npos);
  CHECK(search.report().find("least fitted time at P=16 (4 requests per node)") !=
        std::string::npos);
  CHECK_FALSE(search.push_started(23, now));  // decided once
}

TEST_CASE("a fit with a term <= 0 (noise) gives way to the least measured time") {
  // Measured times whose fit has a < 0, yet P = 16 measured fastest (seen on 4 nodes).
  PartitionSearch search({1, 2, 4, 8}, 4);
  const double trial_seconds[] = {0.0843, 0.0831, 0.0626, 0.0652};
  double now = 0;
  for (uint64_t s = 0; s <= 22; ++s) {
    if (search.push_started(s, now)) break;
    now += s < 2 ? 0.1 : trial_seconds[(s - 2) / 5 < 4 ? (s - 2) / 5 : 3];
  }
  REQUIRE(search.decided());
  CHECK(search.chosen() == 4);
  CHECK(search.report().find("has a term <= 0; least measured time at P=16") != std::string::npos);
}

TEST_CASE("with two candidates there is no fit: the least measured time wins") {
  PartitionSearch search({1, 2}, 2);
  CHECK(search.per_node_for(0) == 2);
  for (uint64_t s = 2; s < 12; ++s) search.push_started(s, s < 7 ? s * 0.2 : 1.2 + (s - 6) * 0.1);
  REQUIRE(search.push_started(12, 1.9));
  CHECK(search.chosen() == 2);
  CHECK(search.report().find("too few trials for a fit; least measured time at P=4") !=
        std::string::npos);
}

}  // namespace
}  // namespace px
