// The measuring half of a router that chooses a sparse variable's route (route_model.h): on
// a cluster every pull step's unique rows are counted by the node that would own them under
// the ps map and under alltoall's one partition per node, and every kRouteSampleSteps pull
// steps the route model estimates each route's step from what was measured. The estimate
// is logged when its chosen route changes (the first one always), naming what it measured.
// A table whose route was given stays on it; a PX_ROUTE_AUTO table's estimate is agreed
// between the nodes and the table moves to its choice (route_move.cc).
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>

#include "daemon/sparse/sparse_router.h"
#include "daemon/sparse/sparse_run.h"
#include "sharding/optimizer.h"
#include "sharding/route_model.h"
#include "sharding/wire_values.h"

namespace px {

namespace {

std::string megabytes(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g MB", bytes / 1e6);
  return text;
}

std::string fixed(const char* format, double value) {
  char text[32];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

}  // namespace

void SparseRouter::sample_route(SparseTable& table, const Run& run) {
  RouteSample& s = table.estimates.sample;
  int nodes = table.map.nodes();
  uint64_t rows = table.shape.rows;
  if (!table.estimates.ps_map) {
    bool ps = route_model_name(table.options) == "ps";
    table.estimates.ps_map =
        ps ? table.map : PartitionMap(rows, automatic_partitions(rows, nodes), nodes);
    table.estimates.alltoall_map = PartitionMap(rows, static_cast<uint32_t>(nodes), nodes);
  }
  if (s.pulls == 0) {
    s.first_step = run.step;
    s.unique_rows = 0;
    s.ps_rows.assign(static_cast<size_t>(nodes), 0);
    s.alltoall_rows.assign(static_cast<size_t>(nodes), 0);
  }
  const std::vector<int64_t>& unique = run.plan->rows();
  for (int64_t row : unique) {
    if (row < 0 || static_cast<uint64_t>(row) >= rows) continue;  // refused elsewhere
    ++s.ps_rows[static_cast<size_t>(table.estimates.ps_map->owner(static_cast<uint64_t>(row)))];
    ++s.alltoall_rows[static_cast<size_t>(
        table.estimates.alltoall_map->owner(static_cast<uint64_t>(row)))];
  }
  s.unique_rows += static_cast<double>(unique.size());
  if (++s.pulls < route_estimate_steps_) return;
  RouteSample sample = std::move(s);
  s = RouteSample{};  // the next window starts with the next pull
  if (table.automatic) return agree_route(run.table, sample);
  estimate_route(table, sample);
}

std::string SparseRouter::estimate_route(SparseTable& table, const RouteSample& s) {
  RouteMeasure m;
  m.nodes = table.map.nodes();
  m.rows = table.shape.rows;
  m.dim = table.shape.dim;
  m.wire_value_bytes = static_cast<double>(wire_value_bytes(table.options.wire));
  m.unique_rows = s.unique_rows / static_cast<double>(s.pulls);
  auto shares = [&](const std::vector<double>& counts) {
    std::vector<double> share(counts.size(), 1.0 / m.nodes);
    if (s.unique_rows > 0)
      for (size_t j = 0; j < counts.size(); ++j) share[j] = counts[j] / s.unique_rows;
    return share;
  };
  m.ps_share = shares(s.ps_rows);
  m.rows_share = shares(s.alltoall_rows);
  bool ps = route_model_name(table.options) == "ps";
  // K, the requests to each owner: the search's grouping, or (a count that was given) one
  // per partition the owner holds; a table on another route would start from the search's.
  uint32_t held = (table.estimates.ps_map->partitions() + static_cast<uint32_t>(m.nodes) - 1) /
                  static_cast<uint32_t>(m.nodes);
  m.ps_requests_per_owner = ps ? std::min(table.requests_per_node(table.push_steps), held)
                               : PartitionSearch::kInitialPerNode;
  uint64_t first = s.first_step, last = first + s.pulls - 1;
  std::vector<RouteEstimate> estimates = estimate_routes(m, LinkModel{});
  if (estimates.empty()) return "";
  std::string in_use = route_model_name(table.options);
  // auto offers only the routes the table's options allow (a 16-bit wire dtype or prefetch
  // rule the replicated ones out: SparseOptions::validate).
  if (table.automatic)
    estimates.erase(std::remove_if(estimates.begin(), estimates.end(),
                                   [&](const RouteEstimate& e) {
                                     std::string unused;
                                     return !route_model_options(table.options, e.route,
                                                                 table.declared_partitions)
                                                 .validate(&unused);
                                   }),
                    estimates.end());
  std::string scripted;
  if (table.automatic && !route_sequence_.empty()) {
    scripted = route_sequence_[table.estimates.script_at++ % route_sequence_.size()];
    bool offered = std::any_of(estimates.begin(), estimates.end(),
                               [&](const RouteEstimate& e) { return e.route == scripted; });
    if (!offered) scripted.clear();  // a replicated route for a bf16 or prefetch table
  }
  const RouteEstimate& chosen = choose(estimates, in_use);
  double current = chosen.busiest_bytes;
  std::string each;
  for (const RouteEstimate& e : estimates) {
    if (e.route == in_use) current = e.busiest_bytes;
    each += (each.empty() ? "" : ", ") + e.route + " " + megabytes(e.busiest_bytes);
  }
  // What moving there would cost, in the steps its savings need to repay it.
  std::string payback;
  bool repays = true;
  if (chosen.route != in_use) {
    double cost = move_bytes(table.shape.rows, table.shape.dim,
                             static_cast<uint32_t>(optimizer_state_slots(table.options.optimizer)),
                             table.nodes, table.replicated);
    double steps = payback_steps(cost, current, chosen.busiest_bytes);
    repays = steps <= kMovePaybackSteps;
    payback = "; a move sends each node " + megabytes(cost) + ", repaid in " +
              (std::isfinite(steps) ? fixed("%.0f", steps) : std::string("no")) + " steps" +
              (repays ? "" : " (more than " + fixed("%.0f", kMovePaybackSteps) + ")");
  }
  bool held_back = table.automatic && scripted.empty() && !repays;
  std::string to = !scripted.empty() ? scripted : held_back ? in_use : chosen.route;
  // Logged when the estimate's choice or the verdict on it changes (or a move is due).
  std::string decision = chosen.route + ">" + to;
  if (decision == table.estimates.chosen && (!table.automatic || to == in_use)) return to;
  table.estimates.chosen = decision;
  std::string verdict =
      !scripted.empty()
          ? "chosen: " + scripted + " (--route-auto-sequence; the estimate's: " + chosen.route + ")"
      : chosen.route == in_use
          ? "chosen: " + in_use + ", the route in use (none moves " +
                fixed("%.0f", 100 * kRouteMargin) + "% fewer bytes)"
          : "chosen: " + chosen.route + " (" +
                fixed("%.2f", current > 0 ? chosen.busiest_bytes / current : 0) + "x " + in_use +
                "'s bytes" + payback + ")";
  if (held_back)
    verdict += "; the table stays on " + in_use + " (a move would not repay itself soon enough)";
  else if (to != in_use)
    verdict += table.automatic ? "; the table moves from " + in_use + " to " + to
                               : "; the table stays on " + in_use +
                                     " (its route was given; PX_ROUTE_AUTO moves tables)";
  PX_LOG_INFO_AT(table.log_fields,
                 "%s: route estimate over pull steps %" PRIu64 "-%" PRIu64
                 ": %s unique rows a step of %" PRIu64
                 " (alpha %s), owner skew ps %s, alltoall rows %s; bytes per step on the "
                 "busiest node's link: %s; %s",
                 table.label.c_str(), first, last, fixed("%.0f", m.unique_rows).c_str(), m.rows,
                 fixed("%.3g", m.unique_rows / static_cast<double>(m.rows)).c_str(),
                 fixed("%.2f", share_skew(m.ps_share)).c_str(),
                 fixed("%.2f", share_skew(m.rows_share)).c_str(), each.c_str(), verdict.c_str());
  return to;
}

}  // namespace px
