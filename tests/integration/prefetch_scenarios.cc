// The prefetch scenario of the test worker (px_sparse_options.prefetch, px_prefetch_rows):
// every worker issues pull step k+1 before push step k, after a pause that lets it reach
// the owners first, and checks every pulled row bitwise against a reference of the whole
// job: a stale row (one served before the push that changes it) shows as a mismatch.
// Gradients are small dyadic numbers and the learning rate a power of two, so every sum is
// exact in any order and the reference is bitwise the daemons' f32 table.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "sharding/wire_values.h"  // a bf16 wire: the reference rounds pulled rows alike
#include "tests/integration/sparse_lookups.h"
#include "tests/integration/worker_util.h"

namespace pxt {
namespace {

constexpr uint64_t kRows = 300;
constexpr uint64_t kDim = 8;
constexpr uint64_t kLookups = 24;
constexpr float kLearningRate = 0.5f;

// Skewed: hot rows are in consecutive steps' batches (pending, served after the push), cold
// ones mostly not (served ahead).
std::vector<int64_t> lookups(int rank, uint64_t step) {
  return skewed_lookups(rank, step, kRows, kLookups, 2);
}

float gradient(int rank, uint64_t step, uint64_t j, uint64_t c) {
  return float(int((rank + 3 * step + 5 * j + c) % 7) - 3) * 0.125f;
}

// prefetch-train --steps N [--route hybrid|ps|alltoall-rows|alltoall-columns]
//                [--partitions P] [--wire f32|bf16] [--late-push-ms M]
int scenario_prefetch_train(px_client* c, const Flags& f) {
  px_world_info w = world_of(c);
  px_sparse_options o = training_options(f, 11, 0.5, kLearningRate);
  px::WireDtype wire =
      f.has("wire") && f.choice("wire") == 1 ? px::WireDtype::kBf16 : px::WireDtype::kF32;
  o.wire_dtype = wire == px::WireDtype::kBf16 ? PX_BF16 : PX_F32;

  // Refusals: prefetch on a replicated route, px_prefetch_rows without the option.
  px_var* refused = nullptr;
  px_sparse_options bad = o;
  bad.route = PX_ROUTE_ALLGATHERV;
  bad.alltoall_split = PX_SPLIT_ROWS;
  bad.wire_dtype = PX_F32;
  bad.prefetch = 1;
  expect_status(px_register_sparse(c, "bad-route", PX_F32, 10, 4, &bad, &refused), PX_ERR_INVALID,
                "prefetch on the allgatherv route");
  expect_contains(px_last_error(), "prefetch needs the ps, hybrid or alltoall route");
  px_var* plain = nullptr;
  check(px_register_sparse(c, "plain", PX_F32, 10, 4, nullptr, &plain), "register plain");
  {
    int64_t one = 1;
    float row[4];
    px_request* r = nullptr;
    expect_status(px_prefetch_rows(plain, &one, 1, row, &r), PX_ERR_INVALID,
                  "px_prefetch_rows without prefetch");
    expect_contains(px_last_error(), "registered without px_sparse_options.prefetch");
  }

  o.prefetch = 1;
  px_var* var = nullptr;
  check(px_register_sparse(c, "emb", PX_F32, kRows, kDim, &o, &var), "px_register_sparse");
  std::vector<float> ref;  // the shards' f32 values
  for (double v : initial_uniform_table(o, kRows, kDim)) ref.push_back(float(v));

  auto check_pulled = [&](const std::vector<int64_t>& idx, const std::vector<float>& got,
                          const std::string& what) {
    for (size_t j = 0; j < idx.size(); ++j)
      for (uint64_t col = 0; col < kDim; ++col) {
        float want = ref[size_t(idx[j]) * kDim + col];
        px::round_to_wire(wire, &want, 1);
        float g = got[j * kDim + col];
        if (std::memcmp(&want, &g, 4) != 0) {
          char text[200];
          snprintf(text, sizeof text, ": row %lld column %llu is %.9g, reference %.9g",
                   (long long)idx[j], (unsigned long long)col, double(g), double(want));
          die(what + text);
        }
      }
  };

  uint64_t steps = f.u64("steps");
  int late_ms = int(f.u64("late-push-ms", 100));
  std::vector<int64_t> idx = lookups(g_rank, 0);
  std::vector<float> rows(idx.size() * kDim);
  pull_rows_ok(var, idx.data(), idx.size(), rows.data(), "pull step 0");
  check_pulled(idx, rows, "pull step 0");

  // A push of a row its pull step did not pull is refused whole (the step is not used up).
  int64_t stranger = 0;
  while (std::find(idx.begin(), idx.end(), stranger) != idx.end()) ++stranger;
  {
    std::vector<float> g(kDim, 1.0f);
    px_request* r = nullptr;
    expect_status(px_push_rows(var, &stranger, 1, g.data(), &r), PX_ERR_INVALID,
                  "a push of a row not pulled");
    expect_contains(px_last_error(), "row " + std::to_string(stranger) + " at position 0");
    expect_contains(px_last_error(), "was not pulled in pull step 0");
  }

  for (uint64_t k = 0; k < steps; ++k) {
    bool more = k + 1 < steps;
    std::vector<int64_t> next;
    std::vector<float> next_rows;
    px_request* prefetch = nullptr;
    if (more) {
      next = lookups(g_rank, k + 1);
      next_rows.assign(next.size() * kDim, 0.0f);
      check(px_prefetch_rows(var, next.data(), next.size(), next_rows.data(), &prefetch),
            "px_prefetch_rows");
    }
    // The pause lets the prefetch reach every owner before any node's push: its rows that
    // no node pulled in step k are served ahead, the others must wait for the push.
    std::this_thread::sleep_for(std::chrono::milliseconds(late_ms));
    std::vector<float> grads(idx.size() * kDim);
    for (size_t j = 0; j < idx.size(); ++j)
      for (uint64_t col = 0; col < kDim; ++col) grads[j * kDim + col] = gradient(g_rank, k, j, col);
    push_rows_ok(var, idx.data(), idx.size(), grads.data(), "push step " + std::to_string(k));

    // The reference step: every rank's gradients, summed exactly, then one f32 update.
    std::vector<float> total(kRows * kDim, 0.0f);
    for (int rank = 0; rank < w.world_size; ++rank) {
      std::vector<int64_t> ri = lookups(rank, k);
      for (size_t j = 0; j < ri.size(); ++j)
        for (uint64_t col = 0; col < kDim; ++col)
          total[size_t(ri[j]) * kDim + col] += gradient(rank, k, j, col);
    }
    for (size_t i = 0; i < ref.size(); ++i) ref[i] -= kLearningRate * total[i];

    if (!more) break;
    check_wait(prefetch, "prefetch of step " + std::to_string(k + 1));
    check_pulled(next, next_rows, "pull step " + std::to_string(k + 1) + " (prefetched)");
    idx = std::move(next);
    rows = std::move(next_rows);
  }

  // The whole table as a pull step (a read could reach an owner before the last push
  // step is applied: pushes complete once taken).
  std::vector<int64_t> all(kRows);
  for (uint64_t r = 0; r < kRows; ++r) all[r] = int64_t(r);
  std::vector<float> table(kRows * kDim);
  pull_rows_ok(var, all.data(), all.size(), table.data(), "pull all");
  check_pulled(all, table, "the final table");
  check(px_barrier(c, 30000), "px_barrier");
  px_var_stats stats;
  stats.struct_size = sizeof stats;
  check(px_var_stats_get(var, &stats), "px_var_stats_get");
  // Reads are f32 whatever the wire (the shards' own values): the reference itself.
  read_rows_ok(var, all.data(), all.size(), table.data(), "read all");
  uint64_t hash = 1469598103934665603ull;
  for (size_t i = 0; i < table.size(); ++i) {
    if (std::memcmp(&table[i], &ref[i], 4) != 0)
      die("final table: value " + std::to_string(i) + " differs from the reference");
    uint32_t bits;
    std::memcpy(&bits, &table[i], 4);
    hash = (hash ^ bits) * 1099511628211ull;
  }
  printf("ok rank %d prefetch table_hash=%016llx rows_served_ahead=%llu\n", g_rank,
         (unsigned long long)hash, (unsigned long long)stats.rows_served_ahead);
  return 0;
}

}  // namespace

const std::vector<ScenarioSpec>& prefetch_scenario_specs() {
  static const std::vector<ScenarioSpec> specs = {
      {"prefetch-train",
       {"steps:n", "route?:hybrid|ps|alltoall-rows|alltoall-columns", "partitions?:n",
        "wire?:f32|bf16", "late-push-ms?:n"},
       {},
       "each step's pull issued before the previous push (px_prefetch_rows), every row checked "
       "bitwise against the reference"},
  };
  return specs;
}

int run_prefetch_scenario(px_client* c, const std::string& scenario, const Flags& flags) {
  if (scenario == "prefetch-train") return scenario_prefetch_train(c, flags);
  die("unknown prefetch scenario " + scenario);
}

}  // namespace pxt
