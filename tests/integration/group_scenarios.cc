// Table-group scenarios of the test worker (px_register_sparse_group, ABI 1.12): several
// tables taking one pull and one push step together, checked against an SGD reference of
// the whole job (every rank's lookups are functions of rank and step), as sparse_scenarios.cc
// checks single tables.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tests/integration/sparse_lookups.h"
#include "tests/integration/worker_util.h"

namespace pxt {
namespace {

constexpr uint64_t kDim = 4;
constexpr double kLr = 0.1;

struct TableSpec {
  const char* name;
  uint64_t rows;
  uint64_t lookups;  // per rank and step
};
// The third table is looked up twice in a step (two features on one table).
const TableSpec kTables[] = {{"user", 300, 6}, {"item", 500, 10}, {"ctx", 200, 4}};
constexpr size_t kTableCount = 3;
// A step's parts: tables[i] with its lookups; "ctx" appears twice.
const size_t kParts[] = {0, 1, 2, 2};
constexpr size_t kPartCount = 4;

uint64_t offset_of(size_t t) {
  uint64_t offset = 0;
  for (size_t i = 0; i < t; ++i) offset += kTables[i].rows;
  return offset;
}

// Part p's table-local lookups of rank's batch at step.
std::vector<int64_t> part_lookups(int rank, uint64_t step, size_t p) {
  const TableSpec& t = kTables[kParts[p]];
  return skewed_lookups(rank * 7 + int(p), step, t.rows, t.lookups, 2);
}

double gradient(int rank, uint64_t step, uint64_t j, uint64_t c, double w) {
  return 0.5 * w + 0.01 * std::sin(double(rank + 5 * step + 3 * j + c));
}

// group-train --steps N [--route R]: STEPS steps of one grouped pull, a gradient, one grouped
// push; every pulled row checked against the reference, each table read back through its
// own handle, the group's counters (one pull and one push step per step), and a push with an
// index past "ctx"'s rows (rank world-1, step 1) failing with a message naming the table.
int scenario_group_train(px_client* c, const Flags& f) {
  px_sparse_options o;
  px_sparse_options_init(&o);
  o.optimizer = PX_OPT_SGD;
  o.learning_rate = kLr;
  o.aggregation = PX_SUM;
  o.initializer = PX_INIT_UNIFORM;
  o.init_seed = 5;
  o.init_low = -0.1;
  o.init_high = 0.1;
  if (f.has("route")) {
    static const int32_t kRoutes[] = {PX_ROUTE_HYBRID, PX_ROUTE_PS, PX_ROUTE_ALLGATHERV,
                                      PX_ROUTE_ALLTOALL};
    o.route = kRoutes[f.choice("route")];
  }
  uint64_t steps = f.u64("steps");
  int world = world_size(c);
  const char* names[kTableCount];
  uint64_t rows[kTableCount];
  uint64_t total_rows = 0;
  for (size_t t = 0; t < kTableCount; ++t) {
    names[t] = kTables[t].name;
    rows[t] = kTables[t].rows;
    total_rows += rows[t];
  }
  px_var* group = nullptr;
  px_var* tables[kTableCount] = {};
  check(px_register_sparse_group(c, "ebc", PX_F32, kTableCount, names, rows, kDim, &o, &group,
                                 tables),
        "px_register_sparse_group");
  std::vector<double> ref = initial_uniform_table(o, total_rows, kDim);

  px_var* part_tables[kPartCount];
  for (size_t p = 0; p < kPartCount; ++p) part_tables[p] = tables[kParts[p]];
  auto bad_push = [&](int rank, uint64_t k) { return k == 1 && rank == world - 1; };
  for (uint64_t k = 0; k < steps; ++k) {
    // This rank's step: the parts' indices one after another.
    std::vector<int64_t> idx, global;
    uint64_t counts[kPartCount];
    for (size_t p = 0; p < kPartCount; ++p) {
      std::vector<int64_t> part = part_lookups(g_rank, k, p);
      counts[p] = part.size();
      for (int64_t r : part) {
        idx.push_back(r);
        global.push_back(int64_t(offset_of(kParts[p])) + r);
      }
    }
    std::vector<float> pulled(idx.size() * kDim);
    px_request* r = nullptr;
    check(
        px_pull_rows_group(part_tables, kPartCount, counts, idx.data(), pulled.data(), nullptr, &r),
        "px_pull_rows_group");
    check_wait(r, "grouped pull step " + std::to_string(k));
    for (size_t j = 0; j < global.size(); ++j)
      for (uint64_t col = 0; col < kDim; ++col) {
        double want = ref[size_t(global[j]) * kDim + col], got = pulled[j * kDim + col];
        if (!(std::fabs(got - want) <= 1e-5 * std::fabs(want) + 1e-7))
          die("grouped pull step " + std::to_string(k) + ": position " + std::to_string(j) +
              " (group row " + std::to_string(global[j]) + ") column " + std::to_string(col) +
              " is " + std::to_string(got) + ", reference " + std::to_string(want));
      }
    std::vector<float> grads(idx.size() * kDim);
    for (size_t j = 0; j < idx.size(); ++j)
      for (uint64_t col = 0; col < kDim; ++col)
        grads[j * kDim + col] = float(gradient(g_rank, k, j, col, pulled[j * kDim + col]));
    if (bad_push(g_rank, k)) {  // the last part's first index past ctx's 200 rows
      idx[idx.size() - counts[kPartCount - 1]] = int64_t(kTables[2].rows);
      check(px_push_rows_group(part_tables, kPartCount, counts, idx.data(), grads.data(), nullptr,
                               &r),
            "px_push_rows_group");
      expect_status(wait_free(r), PX_ERR_INDEX, "a grouped push with index 200 of 'ctx'");
      expect_contains(g_wait_message, "'ebc'");
      expect_contains(g_wait_message, "index 200 of table 'ctx', outside its 200 rows");
    } else {
      check(px_push_rows_group(part_tables, kPartCount, counts, idx.data(), grads.data(), nullptr,
                               &r),
            "px_push_rows_group");
      check_wait(r, "grouped push step " + std::to_string(k));
    }
    // The reference: every rank's gradients of this step, summed, one SGD step.
    std::vector<double> sum(ref.size(), 0.0);
    for (int rank = 0; rank < world; ++rank) {
      if (bad_push(rank, k)) continue;
      size_t j = 0;
      for (size_t p = 0; p < kPartCount; ++p)
        for (int64_t row : part_lookups(rank, k, p)) {
          size_t at = size_t(offset_of(kParts[p]) + uint64_t(row)) * kDim;
          for (uint64_t col = 0; col < kDim; ++col)
            sum[at + col] += float(gradient(rank, k, j, col, float(ref[at + col])));
          ++j;
        }
    }
    for (size_t i = 0; i < ref.size(); ++i) ref[i] -= kLr * sum[i];
  }
  // The next grouped pull step sees every push: every row of every table.
  std::vector<int64_t> every;
  uint64_t every_counts[kTableCount];
  for (size_t t = 0; t < kTableCount; ++t) {
    every_counts[t] = kTables[t].rows;
    for (uint64_t i = 0; i < kTables[t].rows; ++i) every.push_back(int64_t(i));
  }
  std::vector<float> all(every.size() * kDim);
  px_request* r = nullptr;
  check(
      px_pull_rows_group(tables, kTableCount, every_counts, every.data(), all.data(), nullptr, &r),
      "px_pull_rows_group");
  check_wait(r, "grouped pull of every row");
  auto expect_table = [&](size_t t, const float* got, const std::string& what) {
    for (size_t i = 0; i < kTables[t].rows * kDim; ++i) {
      double want = ref[offset_of(t) * kDim + i];
      if (!(std::fabs(got[i] - want) <= 1e-5 * std::fabs(want) + 1e-7))
        die(what + " of table '" + kTables[t].name + "': value " + std::to_string(i) + " is " +
            std::to_string(got[i]) + ", reference " + std::to_string(want));
    }
  };
  for (size_t t = 0; t < kTableCount; ++t)
    expect_table(t, all.data() + offset_of(t) * kDim, "the final grouped pull");
  // Each table through its own handle, with its own row numbers (a read, not a step).
  for (size_t t = 0; t < kTableCount; ++t) {
    std::vector<int64_t> idx(kTables[t].rows);
    for (uint64_t i = 0; i < kTables[t].rows; ++i) idx[i] = int64_t(i);
    std::vector<float> got(idx.size() * kDim);
    read_rows_ok(tables[t], idx.data(), idx.size(), got.data(), "read of a table");
    expect_table(t, got.data(), "a read");
  }
  // A table's index out of its range fails a read too, naming the table; the group's own
  // handle takes group rows.
  int64_t past = int64_t(kTables[0].rows);
  std::vector<float> one(kDim);
  check(px_read_rows(tables[0], &past, 1, one.data(), &r), "px_read_rows");
  expect_status(wait_free(r), PX_ERR_INDEX, "a read of index 300 of 'user'");
  expect_contains(g_wait_message, "table 'user'");
  read_rows_ok(group, &past, 1, one.data(), "read of group row 300 (item's row 0)");
  // One pull step per grouped pull, whichever table is asked.
  px_var_stats stats;
  stats.struct_size = sizeof stats;
  check(px_var_stats_get(tables[1], &stats), "px_var_stats_get");
  if (stats.pull_steps != steps + 1)
    die("the group took " + std::to_string(stats.pull_steps) + " pull steps in " +
        std::to_string(steps + 1) + " grouped pulls");
  // Refusals: a table of another group, a prefetch without the option, a bad registration.
  const char* other_names[] = {"a"};
  uint64_t other_rows[] = {10};
  px_var* other = nullptr;
  check(px_register_sparse_group(c, "other", PX_F32, 1, other_names, other_rows, kDim, &o, nullptr,
                                 &other),
        "px_register_sparse_group(other)");
  px_var* mixed[] = {tables[0], other};
  uint64_t mixed_counts[] = {0, 0};
  expect_status(px_pull_rows_group(mixed, 2, mixed_counts, nullptr, nullptr, nullptr, &r),
                PX_ERR_INVALID, "a grouped pull over two groups");
  expect_contains(px_last_error(), "is not a table of the group of tables[0]");
  uint64_t no_rows[] = {0};
  expect_status(px_prefetch_rows_group(tables, 1, no_rows, nullptr, nullptr, nullptr, &r),
                PX_ERR_INVALID, "a grouped prefetch of a group registered without prefetch");
  expect_contains(px_last_error(), "registered without px_sparse_options.prefetch");
  const char* dup_names[] = {"x", "x"};
  uint64_t dup_rows[] = {5, 5};
  expect_status(px_register_sparse_group(c, "dup", PX_F32, 2, dup_names, dup_rows, kDim, &o,
                                         nullptr, nullptr),
                PX_ERR_INVALID, "a group with two tables named x");
  expect_contains(px_last_error(), "unique in the group");
  printf("ok rank %d group-train steps %llu\n", g_rank, (unsigned long long)steps);
  return 0;
}

// group-mismatch: rank 0 registers tables a:10, b:20 and the others a:20, b:10 (the same
// 30 rows): every worker gets PX_ERR_MISMATCH naming the tables, at registration or at
// its next step.
int scenario_group_mismatch(px_client* c) {
  const char* names[] = {"a", "b"};
  uint64_t rows[] = {g_rank == 0 ? 10u : 20u, g_rank == 0 ? 20u : 10u};
  px_var* tables[2] = {};
  px_status s =
      px_register_sparse_group(c, "mm", PX_F32, 2, names, rows, 4, nullptr, nullptr, tables);
  std::string message = px_last_error();
  if (s == PX_OK) {
    int64_t row = 0;
    float out[4];
    px_request* r = nullptr;
    check(px_pull_rows(tables[0], &row, 1, out, &r), "px_pull_rows");
    s = wait_free(r);
    message = g_wait_message;
  }
  expect_status(s, PX_ERR_MISMATCH, "tables that differ by worker");
  expect_contains(message, "table:a=");
  printf("ok rank %d group-mismatch\n", g_rank);
  return 0;
}

}  // namespace

const std::vector<ScenarioSpec>& group_scenario_specs() {
  static const std::vector<ScenarioSpec> specs = {
      {"group-train",
       {"steps:n", "route?:hybrid|ps|allgatherv|alltoall"},
       {},
       "three tables in one pull and one push step, checked against a reference"},
      {"group-mismatch", {}, {}, "a group whose tables differ by worker"},
  };
  return specs;
}

int run_group_scenario(px_client* c, const std::string& scenario, const Flags& flags) {
  if (scenario == "group-train") return scenario_group_train(c, flags);
  if (scenario == "group-mismatch") return scenario_group_mismatch(c);
  die("unknown group scenario " + scenario);
}

}  // namespace pxt
