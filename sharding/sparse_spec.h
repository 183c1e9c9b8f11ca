// What defines a sparse variable: its shape and its options (optimizer, initializer,
// aggregation, consistency, partitioning, route). Every registrant on every node must agree
// on all of it; canonical() is the string they compare.
#pragma once

#include <cstdint>
#include <string>

namespace px {

enum class Optimizer : uint32_t { kSgd = 0, kAdagrad = 1, kAdam = 2 };
enum class Initializer : uint32_t { kZeros = 0, kUniform = 1, kNormal = 2 };
enum class Consistency : uint32_t { kSync = 0, kAsync = 1, kBounded = 2 };
enum class Route : uint32_t {
  kHybrid = 0,
  kPs = 1,
  kAllgatherv = 2,
  kAllreduce = 3,
  kAlltoall = 4,
  // Starts on ps; on a cluster the router moves the table between the others
  // (daemon/sparse/route_move.cc). A table's SparseTable::options name the route it is on.
  kAuto = 5
};
// How the alltoall route divides the table: rows striped over the nodes, or columns.
enum class Split : uint32_t { kRows = 0, kColumns = 1 };
enum class NonFinite : uint32_t { kReject = 0, kSkip = 1 };
// The values of pulled rows and pushed gradients between nodes (px_dtype's numbers).
enum class WireDtype : uint32_t { kF32 = 0, kF16 = 2, kBf16 = 3 };

struct SparseOptions {
  Optimizer optimizer = Optimizer::kSgd;
  double learning_rate = 0.01;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;
  double initial_accumulator = 0.1;
  Initializer initializer = Initializer::kZeros;
  uint64_t init_seed = 0;
  double init_low = -0.05;
  double init_high = 0.05;
  double init_std = 0.05;
  bool mean = false;  // aggregation: divide the summed gradient by the world size
  Consistency consistency = Consistency::kSync;
  uint32_t staleness = 0;
  uint32_t partitions = 0;  // 0: automatic
  Route route = Route::kHybrid;
  NonFinite nonfinite = NonFinite::kReject;
  Split alltoall_split = Split::kRows;  // kAlltoall only
  WireDtype wire = WireDtype::kF32;     // lossy when not f32 (wire_values.h)
  // Relaxed dependency (px_sparse_options.prefetch): a pull step may be served ahead of
  // the previous push step for the rows no node pulled in that step.
  bool prefetch = false;
  // The hot-row cache (px_sparse_options.cache_rows, daemon/sparse/hot_row_cache.h): rows
  // of other nodes kept per node (0: none), and how many pull steps a kept copy serves.
  uint32_t cache_rows = 0;
  uint32_t cache_staleness = 0;
  // Copies of each row kept (px_sparse_options.replicas): 2 keeps a copy of each node's
  // partitions on the next node (daemon/sparse/shard_replica.h).
  uint32_t replicas = 1;

  bool column_split() const {
    return route == Route::kAlltoall && alltoall_split == Split::kColumns;
  }
  // The router chooses the route (PX_ROUTE_AUTO): asked for, or the default hybrid of a
  // PX_SYNC table (a move needs a cut every node finished; async and bounded tables of
  // the hybrid route stay on ps).
  bool route_chosen_by_router() const {
    return route == Route::kAuto || (route == Route::kHybrid && consistency == Consistency::kSync);
  }

  // False with a message naming the bad option.
  bool validate(std::string* error) const;
  // Every option that matters, in a fixed order, e.g.
  // "adam(lr=0.001,b1=0.9,b2=0.999,eps=1e-08) init=zeros sum sync partitions=auto ps reject"
  // (" wire=bf16" follows when the wire dtype is not f32, so older strings stay as they were).
  std::string canonical() const;
};

struct SparseShape {
  uint64_t rows = 0;
  uint64_t dim = 0;
};

const char* route_name(Route route);
const char* wire_dtype_name(WireDtype wire);
// The route as pxctl and the metrics name it: route_name, but "alltoall-rows" or
// "alltoall-columns" for the alltoall route.
const char* route_label(const SparseOptions& options);

}  // namespace px
