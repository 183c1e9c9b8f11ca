// What one sparse step would cost on each route, from what a node measures on the route it
// runs: the unique rows its workers pull per step (u, so α = u / rows) and how those rows
// fall on the nodes under the ps map and under alltoall's one-partition-per-node map (the
// skew a route's owners would see). The daemon logs the estimates; a PX_ROUTE_AUTO table
// moves to the route choose() names (daemon/sparse/route_move.cc).
//
// Per step (one pull and one push) every node is assumed to pull as this node does. With
// s_j the share of a node's rows that node j owns, N nodes, d values per row of b bytes
// on the wire and 8-byte indices, the busiest node's link carries max(in, out) of:
//   ps / alltoall rows (point-to-point requests to the owners):
//     out_j = (N-1)·u·s_j·d·b [replies] + u·(1-s_j)·(16 + d·b) [its pull indices, pushes]
//     in_j  = (N-1)·u·s_j·(16 + d·b) [others' indices, pushes] + u·(1-s_j)·d·b [replies]
//   alltoall columns (every node holds w = d/N columns of every row, width rounded up):
//     in = out = (N-1)·u·(16 + 2·w·b), whatever the skew
//   allgatherv (f32; coalesced gradients to every replica, pulls local):
//     in = out = (N-1)·u·(8 + 4·d)
//   allreduce (f32; the densified table, a ring):
//     in = out = 2·(N-1)/N·rows·d·4
// Messages per node are counted (K·(N-1) per kind on ps, K partition groups per owner; N-1 on
// alltoall; a ring's steps on the replicated routes) but not charged: requests to the owners
// run concurrently, and measurement says more of them is faster, not slower (the partition
// search's t(P), px-bench sparse: ps with K = 4..8 beats alltoall by rows with K = 1 by
// 1.07-1.22x at equal bytes). What the bytes leave out (CPU, the replicated routes' exchange
// before apply before pull) is why choose() moves off the route in use only for a route
// that moves at least kRouteMargin fewer bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sharding/sparse_spec.h"

namespace px {

struct RouteMeasure {
  int nodes = 1;
  uint64_t rows = 0;  // the table's
  uint64_t dim = 0;
  double wire_value_bytes = 4;  // pull rows and push gradients on ps and alltoall (2: 16-bit)
  double unique_rows = 0;       // u: this node's unique rows per pull step (mean)
  // Fractions of those rows each node owns (sum 1): under the ps map, under alltoall's.
  std::vector<double> ps_share;
  std::vector<double> rows_share;
  uint32_t ps_requests_per_owner = 1;  // K: the partition groups ps sends each owner
};

// The link the estimate assumes: its payload rate.
struct LinkModel {
  double bytes_per_second = 125e6;  // 1 Gbit/s
};

// A route is chosen over the one in use only when it moves this much fewer bytes.
constexpr double kRouteMargin = 0.10;

// A move between routes (daemon/sparse/route_move.cc) all-gathers every node's rows: each
// node receives about (N-1)/N of the table's values and optimizer state, none when the table
// is replicated (every node holds every row). A PX_ROUTE_AUTO table moves only when the
// bytes the new route saves per step repay that within kMovePaybackSteps steps: the
// estimate sees a window of steps, not how long the job or its pattern of pulls will last,
// and a 410 MB table's move measured 2.5-4.2 s on 1 Gbit/s links (README: Benchmarks).
constexpr double kMovePaybackSteps = 1000;
double move_bytes(uint64_t rows, uint64_t dim, uint32_t state_slots, int nodes, bool replicated);
// The steps after which a move of move_bytes from a route of in_use_bytes a step to one of
// to_bytes a step has saved what it cost (infinite when it saves nothing).
double payback_steps(double move_bytes, double in_use_bytes, double to_bytes);

struct RouteEstimate {
  std::string route;         // "ps", "alltoall-rows", "alltoall-columns", "allgatherv", "allreduce"
  double busiest_bytes = 0;  // per step, max over nodes of max(in, out)
  double messages = 0;       // per node per step (not charged, see above)
  double seconds = 0;        // busiest_bytes / rate
};

// Every route's estimate, in the order above. An empty measure (no nodes or rows) gives none.
std::vector<RouteEstimate> estimate_routes(const RouteMeasure& m, const LinkModel& link);
// The fastest estimate (the first of equals); estimates must not be empty.
const RouteEstimate& fastest(const std::vector<RouteEstimate>& estimates);
// The route to be on: in_use, unless the fastest estimate moves at least kRouteMargin fewer
// bytes than in_use's (in_use not among the estimates: the fastest).
const RouteEstimate& choose(const std::vector<RouteEstimate>& estimates, const std::string& in_use);
// The name estimate_routes uses for the options' route ("ps" for ps and hybrid).
std::string route_model_name(const SparseOptions& options);
// options on the route a name above names; partitions: the count asked for (0: automatic)
// where the route takes one. The inverse of route_model_name.
SparseOptions route_model_options(SparseOptions options, const std::string& route,
                                  uint32_t partitions);
// The busiest node's share over the mean share (1 = even; N = one node owns every row).
double share_skew(const std::vector<double>& share);

}  // namespace px
