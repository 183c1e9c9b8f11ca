// The wire-dtype scenario of the test worker (px_sparse_options.wire_dtype): every worker
// simulates the whole job in double, rounding to the wire dtype where the daemons do (a
// pull's rows; each node's summed gradients of a push), and checks every pulled row against
// it; every pulled value must also be exactly a wire-dtype value. And the dense wire
// (px_dense_options.wire_dtype): allreduce results against the exact sum, wire values
// bitwise alike on every worker.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "sharding/initializer.h"  // the table's initial values, to seed the reference
#include "sharding/wire_values.h"  // the rounding the reference applies where the daemons do
#include "tests/integration/sparse_lookups.h"
#include "tests/integration/worker_util.h"

namespace pxt {
namespace {

constexpr uint64_t kRows = 600;
constexpr uint64_t kDim = 32;  // wide enough that values, not indices, are most of the bytes
constexpr uint64_t kLookups = 32;
constexpr double kLearningRate = 0.1;

// Skewed lookups (low rows hot), repeated within and across workers.
std::vector<int64_t> lookups(int rank, uint64_t step) {
  return skewed_lookups(rank, step, kRows, kLookups, 2);
}

// Depends on the pulled value, so a stale or wrongly unpacked pull shows.
float gradient(int rank, uint64_t step, uint64_t j, uint64_t c, float w) {
  return float(0.5 * double(w) + 0.01 * std::sin(double(rank + 3 * step + 7 * j + c)));
}

double round_to(px::WireDtype wire, double v) {
  float f = float(v);
  px::round_to_wire(wire, &f, 1);
  return f;
}

// The tolerance of a pulled value: the daemons work in f32 and the reference in double, so
// a value next to a rounding boundary may round to the neighbouring wire value.
double tolerance(px::WireDtype wire, double ref) {
  double ulp = wire == px::WireDtype::kBf16  ? 0x1p-8
               : wire == px::WireDtype::kF16 ? 0x1p-11
                                             : 0x1p-23;
  return 2 * ulp * std::fabs(ref) + 1e-6;
}

// wire-train --wire f32|bf16|f16 --steps N [--partitions P]
//            [--route hybrid|ps|alltoall-rows|alltoall-columns]
int scenario_wire_train(px_client* c, const Flags& f) {
  static const px::WireDtype kWires[] = {px::WireDtype::kF32, px::WireDtype::kBf16,
                                         px::WireDtype::kF16};
  static const int32_t kWireDtypes[] = {PX_F32, PX_BF16, PX_F16};
  px::WireDtype wire = kWires[f.choice("wire")];
  px_world_info w = world_of(c);
  px_sparse_options o = training_options(f, 5, 0.1, kLearningRate);

  // Refusals first: a 16-bit wire on a replicated route, and a dtype that is no wire dtype.
  px_var* refused = nullptr;
  px_sparse_options bad = o;
  bad.wire_dtype = PX_BF16;
  bad.route = PX_ROUTE_ALLGATHERV;
  bad.alltoall_split = PX_SPLIT_ROWS;
  expect_status(px_register_sparse(c, "bad-route", PX_F32, 10, 4, &bad, &refused), PX_ERR_INVALID,
                "bf16 wire on the allgatherv route");
  expect_contains(px_last_error(), "wire_dtype bf16 needs the ps, hybrid or alltoall route");
  bad = o;
  bad.wire_dtype = PX_I32;
  expect_status(px_register_sparse(c, "bad-dtype", PX_F32, 10, 4, &bad, &refused), PX_ERR_INVALID,
                "i32 wire");
  expect_contains(px_last_error(), "wire_dtype must be PX_F32, PX_F16 or PX_BF16");

  o.wire_dtype = kWireDtypes[f.choice("wire")];
  px_var* var = nullptr;
  check(px_register_sparse(c, "emb", PX_F32, kRows, kDim, &o, &var), "px_register_sparse");

  // The reference: the shard values (double), initialised as the daemons do.
  std::vector<double> ref = initial_uniform_table(o, kRows, kDim);
  auto check_pulled = [&](const std::vector<int64_t>& idx, const std::vector<float>& got,
                          const std::string& what) {
    for (size_t j = 0; j < idx.size(); ++j)
      for (uint64_t col = 0; col < kDim; ++col) {
        float g = got[j * kDim + col];
        float exact = g;
        px::round_to_wire(wire, &exact, 1);
        double want = round_to(wire, ref[size_t(idx[j]) * kDim + col]);
        if (std::memcmp(&exact, &g, 4) != 0 || !(std::fabs(g - want) <= tolerance(wire, want))) {
          char text[200];
          snprintf(text, sizeof text, ": row %lld column %llu is %.9g, reference %.9g%s",
                   (long long)idx[j], (unsigned long long)col, double(g), want,
                   std::memcmp(&exact, &g, 4) != 0 ? " (not a wire-dtype value)" : "");
          die(what + text);
        }
      }
  };

  uint64_t steps = f.u64("steps");
  for (uint64_t k = 0; k < steps; ++k) {
    std::vector<int64_t> idx = lookups(g_rank, k);
    std::vector<float> rows(idx.size() * kDim);
    pull_rows_ok(var, idx.data(), idx.size(), rows.data(), "pull");
    check_pulled(idx, rows, "pull step " + std::to_string(k));
    std::vector<float> grads(idx.size() * kDim);
    for (size_t j = 0; j < idx.size(); ++j)
      for (uint64_t col = 0; col < kDim; ++col)
        grads[j * kDim + col] = gradient(g_rank, k, j, col, rows[j * kDim + col]);
    push_rows_ok(var, idx.data(), idx.size(), grads.data(), "push");

    // The reference step: each node's sum of its workers' gradients (from the rows they
    // pulled, rounded), rounded once; the shards add the nodes' sums.
    std::vector<double> total(kRows * kDim, 0.0);
    for (int node = 0; node < w.node_count; ++node) {
      std::vector<double> sum(kRows * kDim, 0.0);
      std::vector<bool> touched(kRows, false);
      for (int rank = node * w.local_size; rank < (node + 1) * w.local_size; ++rank) {
        std::vector<int64_t> ri = lookups(rank, k);
        for (size_t j = 0; j < ri.size(); ++j) {
          touched[size_t(ri[j])] = true;
          for (uint64_t col = 0; col < kDim; ++col) {
            size_t at = size_t(ri[j]) * kDim + col;
            sum[at] += gradient(rank, k, j, col, float(round_to(wire, ref[at])));
          }
        }
      }
      for (uint64_t r = 0; r < kRows; ++r)
        if (touched[r])
          for (uint64_t col = 0; col < kDim; ++col)
            total[r * kDim + col] += round_to(wire, sum[r * kDim + col]);
    }
    for (size_t i = 0; i < ref.size(); ++i) ref[i] -= kLearningRate * total[i];
  }
  std::vector<int64_t> all(kRows);
  for (uint64_t r = 0; r < kRows; ++r) all[r] = int64_t(r);
  std::vector<float> table(kRows * kDim);
  pull_rows_ok(var, all.data(), all.size(), table.data(), "pull all");
  check_pulled(all, table, "final table");
  // Every node's requests of the steps answered (a reply is counted when sent): the counters
  // hold exactly the training's bytes.
  check(px_barrier(c, 30000), "px_barrier");
  px_var_stats stats;
  stats.struct_size = sizeof stats;
  check(px_var_stats_get(var, &stats), "px_var_stats_get");
  check(px_barrier(c, 30000), "px_barrier");  // and no worker's read below counted yet
  // Reads are not steps and stay f32: the shards' own values, which need not be wire values.
  read_rows_ok(var, all.data(), all.size(), table.data(), "read all");
  uint64_t hash = 1469598103934665603ull;
  for (float v : table) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    hash = (hash ^ bits) * 1099511628211ull;
  }
  printf("ok rank %d wire table_hash=%016llx bytes_sent=%llu bytes_received=%llu\n", g_rank,
         (unsigned long long)hash, (unsigned long long)stats.bytes_sent,
         (unsigned long long)stats.bytes_received);
  return 0;
}

// Worker rank's value i of step k of a dense variable: positive, so sums do not cancel and
// the wire's relative error bound holds.
float dense_value(int rank, uint64_t k, size_t i) {
  return float(0.5 + 0.5 * std::fabs(std::sin(double(i) * 0.37 + rank * 1.3 + double(k))));
}

// wire-dense --wire f32|bf16|f16: the refusals, then steps of a ring-sized and a small
// allreduce (sum and mean) against the exact sum. Prints a hash of every result, which
// must be the same on every worker.
int scenario_wire_dense(px_client* c, const Flags& f) {
  static const int32_t kWireDtypes[] = {PX_F32, PX_BF16, PX_F16};
  int32_t wire = kWireDtypes[f.choice("wire")];
  px_world_info w = world_of(c);
  px_dense_options o;
  px_dense_options_init(&o);
  if (o.struct_size != sizeof o || o.wire_dtype != PX_F32) die("px_dense_options_init");
  px_var* refused = nullptr;
  o.wire_dtype = PX_BF16;
  expect_status(px_register_dense_ex(c, "bad-dtype", PX_F64, 8, PX_SUM, &o, &refused),
                PX_ERR_INVALID, "a bf16 wire on an f64 variable");
  expect_contains(px_last_error(), "needs an f32 variable");
  o.wire_dtype = PX_I32;
  expect_status(px_register_dense_ex(c, "bad-wire", PX_F32, 8, PX_SUM, &o, &refused),
                PX_ERR_INVALID, "an i32 wire");
  px_dense_options unsized = o;
  unsized.struct_size = 0;
  expect_status(px_register_dense_ex(c, "bad-size", PX_F32, 8, PX_SUM, &unsized, &refused),
                PX_ERR_INVALID, "struct_size 0");
  expect_contains(px_last_error(), "px_dense_options_init");

  o.wire_dtype = wire;
  // 300k values take the ring (above the 32 KiB of recursive doubling), 1000 do not.
  const size_t kCounts[] = {300000, 1000};
  const px_reduce_op kOps[] = {PX_SUM, PX_MEAN};
  double ulp = wire == PX_BF16 ? 0x1p-8 : wire == PX_F16 ? 0x1p-11 : 0x1p-23;
  bool rounded = wire != PX_F32 && w.node_count > 1;  // one node sends nothing
  uint64_t hash = 1469598103934665603ull;
  for (size_t count : kCounts) {
    for (px_reduce_op op : kOps) {
      std::string name = "dense-" + std::to_string(count) + (op == PX_SUM ? "-sum" : "-mean");
      px_var* var = nullptr;
      check(px_register_dense_ex(c, name.c_str(), PX_F32, count, op, &o, &var),
            ("register " + name).c_str());
      std::vector<float> in(count), out(count);
      for (uint64_t k = 0; k < 3; ++k) {
        for (size_t i = 0; i < count; ++i) in[i] = dense_value(g_rank, k, i);
        px_request* r = nullptr;
        check(px_allreduce(var, in.data(), out.data(), &r), ("px_allreduce " + name).c_str());
        px_status s = px_wait(r, 60000);
        if (s != PX_OK) die(name + ": " + px_status_name(s) + ": " + px_request_error(r));
        px_request_free(r);
        for (size_t i = 0; i < count; ++i) {
          double exact = 0;
          for (int rank = 0; rank < w.world_size; ++rank) exact += dense_value(rank, k, i);
          if (op == PX_MEAN) exact /= w.world_size;
          // Each node's partial sum is rounded once as it leaves (at most node_count
          // roundings of at most the total each), plus f32's own.
          double bound = (w.node_count * ulp + 1e-6) * exact;
          float sum_value = op == PX_MEAN ? out[i] * float(w.world_size) : out[i];
          float again = sum_value;
          px::round_to_wire(wire == PX_BF16 ? px::WireDtype::kBf16 : px::WireDtype::kF16, &again,
                            1);
          if (!(std::fabs(out[i] - exact) <= bound) ||
              (rounded && op == PX_SUM && std::memcmp(&again, &sum_value, 4) != 0)) {
            char text[200];
            snprintf(text, sizeof text, " step %llu value %zu: %.9g, exact %.9g%s",
                     (unsigned long long)k, i, double(out[i]), exact,
                     rounded && again != sum_value ? " (not a wire value)" : "");
            die(name + text);
          }
          uint32_t bits;
          std::memcpy(&bits, &out[i], 4);
          hash = (hash ^ bits) * 1099511628211ull;
        }
      }
    }
  }
  printf("ok rank %d dense_hash=%016llx\n", g_rank, (unsigned long long)hash);
  return 0;
}

}  // namespace

const std::vector<ScenarioSpec>& wire_scenario_specs() {
  static const std::vector<ScenarioSpec> specs = {
      {"wire-train",
       {"wire:f32|bf16|f16", "steps:n", "partitions?:n",
        "route?:hybrid|ps|alltoall-rows|alltoall-columns"},
       {},
       "training with rows and gradients in the wire dtype, against a reference that rounds "
       "where the daemons do"},
      {"wire-dense",
       {"wire:f32|bf16|f16"},
       {},
       "dense allreduce on a 16-bit wire against the exact sum; refusals of bad options"},
  };
  return specs;
}

int run_wire_scenario(px_client* c, const std::string& scenario, const Flags& flags) {
  if (scenario == "wire-train") return scenario_wire_train(c, flags);
  if (scenario == "wire-dense") return scenario_wire_dense(c, flags);
  die("unknown wire scenario " + scenario);
}

}  // namespace pxt
