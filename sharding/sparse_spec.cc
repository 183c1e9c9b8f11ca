#include "sharding/sparse_spec.h"

#include <cmath>
#include <cstdio>

namespace px {
namespace {

std::string num(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.9g", v);
  return buffer;
}

bool finite_positive(double v) {
  return std::isfinite(v) && v > 0;
}

}  // namespace

const char* route_name(Route route) {
  switch (route) {
    case Route::kHybrid:
      return "hybrid";
    case Route::kPs:
      return "ps";
    case Route::kAllgatherv:
      return "allgatherv";
    case Route::kAllreduce:
      return "allreduce";
    case Route::kAlltoall:
      return "alltoall";
    case Route::kAuto:
      return "auto";
  }
  return "?";
}

const char* wire_dtype_name(WireDtype wire) {
  switch (wire) {
    case WireDtype::kF32:
      return "f32";
    case WireDtype::kF16:
      return "f16";
    case WireDtype::kBf16:
      return "bf16";
  }
  return "?";
}

const char* route_label(const SparseOptions& options) {
  if (options.route != Route::kAlltoall) return route_name(options.route);
  return options.alltoall_split == Split::kColumns ? "alltoall-columns" : "alltoall-rows";
}

bool SparseOptions::validate(std::string* error) const {
  auto bad = [error](const std::string& what) {
    *error = what;
    return false;
  };
  if (optimizer > Optimizer::kAdam) return bad("unknown optimizer");
  // 0 is a rate torch takes (a warm-up's first step, a cosine schedule's last).
  if (!std::isfinite(learning_rate) || learning_rate < 0)
    return bad("learning_rate must be finite and >= 0");
  if (optimizer == Optimizer::kAdam) {
    if (!(beta1 >= 0 && beta1 < 1)) return bad("beta1 must be in [0, 1)");
    if (!(beta2 >= 0 && beta2 < 1)) return bad("beta2 must be in [0, 1)");
  }
  if (optimizer != Optimizer::kSgd && !finite_positive(epsilon))
    return bad("epsilon must be finite and > 0");
  if (optimizer == Optimizer::kAdagrad &&
      !(std::isfinite(initial_accumulator) && initial_accumulator >= 0))
    return bad("initial_accumulator must be finite and >= 0");
  if (initializer > Initializer::kNormal) return bad("unknown initializer");
  if (initializer == Initializer::kUniform &&
      !(std::isfinite(init_low) && std::isfinite(init_high) && init_low < init_high))
    return bad("init_low must be < init_high");
  if (initializer == Initializer::kNormal && !(std::isfinite(init_std) && init_std >= 0))
    return bad("init_std must be finite and >= 0");
  if (consistency > Consistency::kBounded) return bad("unknown consistency");
  if (consistency != Consistency::kBounded && staleness != 0)
    return bad("staleness is only meaningful with PX_BOUNDED");
  if (route > Route::kAuto) return bad("unknown route");
  // A move cuts the table between two steps every node finished: pulls and pushes in step.
  if (route == Route::kAuto && consistency != Consistency::kSync)
    return bad(
        "PX_ROUTE_AUTO needs PX_SYNC (a table moves between two steps every node "
        "finished)");
  if (alltoall_split > Split::kColumns) return bad("unknown alltoall_split");
  if (route != Route::kAlltoall && alltoall_split != Split::kRows)
    return bad("alltoall_split is only meaningful with PX_ROUTE_ALLTOALL");
  // The alltoall route divides the table by node count: one partition per node.
  if (route == Route::kAlltoall && partitions != 0)
    return bad("partitions must be 0 with PX_ROUTE_ALLTOALL (one slice per node)");
  if (nonfinite > NonFinite::kSkip) return bad("unknown nonfinite policy");
  if (partitions > 65536) return bad("partitions must be at most 65536");
  if (wire != WireDtype::kF32 && wire != WireDtype::kF16 && wire != WireDtype::kBf16)
    return bad("wire_dtype must be PX_F32, PX_F16 or PX_BF16");
  // auto then moves only between the routes that can carry it.
  if (wire != WireDtype::kF32 && route != Route::kHybrid && route != Route::kPs &&
      route != Route::kAlltoall && route != Route::kAuto)
    return bad(std::string("wire_dtype ") + wire_dtype_name(wire) +
               " needs the ps, hybrid or alltoall route (the " + route_name(route) +
               " route sends f32 only)");
  // A replica serves its pulls locally, so no owner sees every node's pulls.
  if (prefetch && route != Route::kHybrid && route != Route::kPs && route != Route::kAlltoall &&
      route != Route::kAuto)
    return bad(std::string("prefetch needs the ps, hybrid or alltoall route (the ") +
               route_name(route) + " route serves pulls from each node's replica)");
  // The cache lets pulls lag and pushes wait: only a table that allows lag may have one, and
  // only the ps routes have owners to keep rows of.
  if (cache_rows == 0 && cache_staleness != 0)
    return bad("cache_staleness is only meaningful with cache_rows > 0");
  if (cache_rows > 0) {
    if (consistency != Consistency::kBounded)
      return bad(
          "a hot-row cache (cache_rows) needs PX_BOUNDED (PX_SYNC pulls see every earlier "
          "push step, PX_ASYNC ones promise no bound)");
    if (cache_staleness == 0) return bad("cache_rows needs cache_staleness >= 1");
    if (route != Route::kHybrid && route != Route::kPs)
      return bad(std::string("a hot-row cache needs the ps or hybrid route (not ") +
                 route_name(route) + ")");
    if (prefetch) return bad("a hot-row cache and prefetch cannot be combined");
  }
  if (replicas < 1 || replicas > 2) return bad("replicas must be 1 or 2");
  // Copies follow a partition step by step: only a synchronous table has such steps, and
  // only the partitioned routes have partitions (the replicated ones hold every row on
  // every node already).
  if (replicas > 1) {
    if (consistency != Consistency::kSync) return bad("replicas need PX_SYNC");
    if (route != Route::kHybrid && route != Route::kPs && route != Route::kAuto &&
        !(route == Route::kAlltoall && alltoall_split == Split::kRows))
      return bad(std::string("replicas need the ps, hybrid, auto or alltoall (rows) route (not ") +
                 route_name(route) + (route == Route::kAlltoall ? " by columns)" : ")"));
    if (cache_rows > 0) return bad("replicas and a hot-row cache cannot be combined");
  }
  return true;
}

std::string SparseOptions::canonical() const {
  std::string s;
  switch (optimizer) {
    case Optimizer::kSgd:
      s = "sgd(lr=" + num(learning_rate) + ")";
      break;
    case Optimizer::kAdagrad:
      s = "adagrad(lr=" + num(learning_rate) + ",eps=" + num(epsilon) +
          ",acc0=" + num(initial_accumulator) + ")";
      break;
    case Optimizer::kAdam:
      s = "adam(lr=" + num(learning_rate) + ",b1=" + num(beta1) + ",b2=" + num(beta2) +
          ",eps=" + num(epsilon) + ")";
      break;
  }
  switch (initializer) {
    case Initializer::kZeros:
      s += " init=zeros";
      break;
    case Initializer::kUniform:
      s += " init=uniform(seed=" + std::to_string(init_seed) + "," + num(init_low) + "," +
           num(init_high) + ")";
      break;
    case Initializer::kNormal:
      s += " init=normal(seed=" + std::to_string(init_seed) + ",std=" + num(init_std) + ")";
      break;
  }
  s += mean ? " mean" : " sum";
  switch (consistency) {
    case Consistency::kSync:
      s += " sync";
      break;
    case Consistency::kAsync:
      s += " async";
      break;
    case Consistency::kBounded:
      s += " bounded(" + std::to_string(staleness) + ")";
      break;
  }
  s += partitions == 0 ? " partitions=auto" : " partitions=" + std::to_string(partitions);
  s += std::string(" route=") + route_name(route);
  if (route == Route::kAlltoall) s += alltoall_split == Split::kRows ? "(rows)" : "(columns)";
  s += nonfinite == NonFinite::kReject ? " nonfinite=reject" : " nonfinite=skip";
  if (wire != WireDtype::kF32) s += std::string(" wire=") + wire_dtype_name(wire);
  if (prefetch) s += " prefetch";
  if (cache_rows > 0)
    s += " cache(rows=" + std::to_string(cache_rows) +
         ",staleness=" + std::to_string(cache_staleness) + ")";
  if (replicas > 1) s += " replicas=" + std::to_string(replicas);
  return s;
}

}  // namespace px
