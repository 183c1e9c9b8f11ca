#include "sharding/route_model.h"

#include <algorithm>
#include <cmath>

namespace px {

std::vector<RouteEstimate> estimate_routes(const RouteMeasure& m, const LinkModel& link) {
  std::vector<RouteEstimate> out;
  if (m.nodes < 1 || m.rows == 0 || m.dim == 0) return out;
  const double n = m.nodes, u = m.unique_rows, d = static_cast<double>(m.dim);
  const double b = m.wire_value_bytes;
  auto add = [&](std::string name, double bytes, double messages) {
    out.push_back({std::move(name), bytes, messages, bytes / link.bytes_per_second});
  };
  // Point-to-point requests to the owners: the busiest owner, or the busiest requester.
  auto owners = [&](const std::vector<double>& share, double requests_per_owner) {
    double busiest = 0;
    for (int j = 0; j < m.nodes; ++j) {
      double s = j < static_cast<int>(share.size()) ? share[static_cast<size_t>(j)] : 1.0 / n;
      double out_j = (n - 1) * u * s * d * b + u * (1 - s) * (16 + d * b);
      double in_j = (n - 1) * u * s * (16 + d * b) + u * (1 - s) * d * b;
      busiest = std::max({busiest, out_j, in_j});
    }
    // Sent and received per node: pull requests, their replies, pushes.
    return std::make_pair(busiest, 6 * requests_per_owner * (n - 1));
  };
  auto [ps_bytes, ps_messages] = owners(m.ps_share, std::max<uint32_t>(1, m.ps_requests_per_owner));
  add("ps", ps_bytes, ps_messages);
  auto [rows_bytes, rows_messages] = owners(m.rows_share, 1);
  add("alltoall-rows", rows_bytes, rows_messages);
  double width = std::ceil(d / n);
  add("alltoall-columns", (n - 1) * u * (16 + 2 * width * b), 6 * (n - 1));
  add("allgatherv", (n - 1) * u * (8 + 4 * d), 2 * (n - 1));
  add("allreduce", 2 * (n - 1) / n * static_cast<double>(m.rows) * d * 4, 4 * (n - 1));
  return out;
}

const RouteEstimate& fastest(const std::vector<RouteEstimate>& estimates) {
  const RouteEstimate* best = &estimates.front();
  for (const RouteEstimate& e : estimates)
    if (e.seconds < best->seconds) best = &e;
  return *best;
}

const RouteEstimate& choose(const std::vector<RouteEstimate>& estimates,
                            const std::string& in_use) {
  const RouteEstimate& best = fastest(estimates);
  for (const RouteEstimate& e : estimates)
    if (e.route == in_use)
      return best.busiest_bytes <= (1 - kRouteMargin) * e.busiest_bytes ? best : e;
  return best;
}

std::string route_model_name(const SparseOptions& options) {
  // Hybrid runs ps for sparse tables.
  return options.route == Route::kHybrid ? "ps" : route_label(options);
}

SparseOptions route_model_options(SparseOptions o, const std::string& route, uint32_t partitions) {
  o.alltoall_split = Split::kRows;
  o.partitions = partitions;
  if (route == "ps") {
    o.route = Route::kPs;
  } else if (route == "alltoall-rows" || route == "alltoall-columns") {
    o.route = Route::kAlltoall;
    o.partitions = 0;  // one slice per node
    if (route == "alltoall-columns") o.alltoall_split = Split::kColumns;
  } else {
    o.route = route == "allgatherv" ? Route::kAllgatherv : Route::kAllreduce;
  }
  return o;
}

double move_bytes(uint64_t rows, uint64_t dim, uint32_t state_slots, int nodes, bool replicated) {
  if (replicated || nodes < 2) return 0;
  double table =
      static_cast<double>(rows) * static_cast<double>(dim) * (1.0 + state_slots) * sizeof(float);
  return table * (nodes - 1) / nodes;
}

double payback_steps(double move_bytes, double in_use_bytes, double to_bytes) {
  double saved = in_use_bytes - to_bytes;
  if (move_bytes <= 0) return 0;
  return saved > 0 ? move_bytes / saved : HUGE_VAL;
}

double share_skew(const std::vector<double>& share) {
  if (share.empty()) return 1;
  double busiest = *std::max_element(share.begin(), share.end());
  return busiest * static_cast<double>(share.size());
}

}  // namespace px
