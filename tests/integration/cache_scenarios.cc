// The hot-row cache scenario of the test worker (px_sparse_options.cache_rows): one worker
// per node trains a PX_BOUNDED table through every node's cache and checks each pulled row
// against a simulation of the rule (daemon/sparse/hot_row_cache.h).
//
// Every gradient is a distinct power of two: worker r's push step k sends -2^(r * steps + k)
// for each of its rows, plain SGD at learning rate 1 from zeros. A row's value is then the
// sum of the bits of the gradients its owner applied, exact in f32, and it says exactly which
// ones. So each pulled row is checked for
//   * no gradient applied twice, none that never touched the row (the bits are a subset);
//   * staleness: every gradient of push steps <= n - 1 - (s + 2 s_c) is in pull step n's row
//     (s: the table's staleness, s_c: the cache's; docs/sparse.md);
//   * a row the simulated cache serves at pull step n from its copy of pull step c
//     (n - c <= s_c) is bitwise what pull step c returned;
// and, after the last push, the checkpoint's shard files and a read of every row hold every
// gradient exactly once (the held sums were flushed before both).
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "sharding/checkpoint.h"
#include "sharding/partition_map.h"
#include "tests/integration/worker_util.h"

namespace pxt {
namespace {

constexpr uint64_t kRows = 48;
constexpr uint64_t kDim = 2;
constexpr uint64_t kHot = 6;  // rows 0..5: in every worker's every step
constexpr uint32_t kPartitions = 6;

// Worker r's rows in step k: the hot ones and three of the rest, distinct.
std::vector<int64_t> lookups(int rank, uint64_t step) {
  std::vector<int64_t> rows;
  for (uint64_t h = 0; h < kHot; ++h) rows.push_back(int64_t(h));
  uint64_t x = uint64_t(rank) * 1000003u + step * 7919u + 17u;
  while (rows.size() < kHot + 3) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    int64_t r = int64_t(kHot + (x >> 33) % (kRows - kHot));
    bool seen = false;
    for (int64_t have : rows) seen = seen || have == r;
    if (!seen) rows.push_back(r);
  }
  return rows;
}

// cache-train --steps N --cache-staleness S [--dir D]
int scenario_cache_train(px_client* c, const Flags& f) {
  px_world_info w = world_of(c);
  if (w.local_size != 1) die("cache-train runs one worker per node");
  uint64_t steps = f.u64("steps");
  uint32_t s_c = uint32_t(f.u64("cache-staleness"));
  if (uint64_t(w.world_size) * steps > 24) die("more than 24 gradient bits: not exact in f32");

  px_sparse_options o;
  px_sparse_options_init(&o);
  o.learning_rate = 1.0;
  o.consistency = PX_BOUNDED;
  o.staleness = 0;
  o.partitions = kPartitions;
  o.route = PX_ROUTE_PS;

  // Refusals: a cache needs PX_BOUNDED, a staleness, and the ps route.
  px_var* refused = nullptr;
  px_sparse_options bad = o;
  bad.cache_rows = 8;
  bad.cache_staleness = 0;
  expect_status(px_register_sparse(c, "bad-staleness", PX_F32, 10, 4, &bad, &refused),
                PX_ERR_INVALID, "a cache without a staleness");
  expect_contains(px_last_error(), "cache_rows needs cache_staleness >= 1");
  bad.cache_staleness = 2;
  bad.consistency = PX_SYNC;
  bad.staleness = 0;
  expect_status(px_register_sparse(c, "bad-sync", PX_F32, 10, 4, &bad, &refused), PX_ERR_INVALID,
                "a cache on a PX_SYNC table");
  expect_contains(px_last_error(), "needs PX_BOUNDED");
  bad.consistency = PX_BOUNDED;
  bad.route = PX_ROUTE_ALLGATHERV;
  expect_status(px_register_sparse(c, "bad-route", PX_F32, 10, 4, &bad, &refused), PX_ERR_INVALID,
                "a cache on a replicated route");
  expect_contains(px_last_error(), "needs the ps or hybrid route (not allgatherv)");
  bad.route = PX_ROUTE_PS;
  bad.prefetch = 1;
  expect_status(px_register_sparse(c, "bad-prefetch", PX_F32, 10, 4, &bad, &refused),
                PX_ERR_INVALID, "a cache with prefetch");
  expect_contains(px_last_error(), "cannot be combined");
  bad = o;
  bad.cache_staleness = 2;  // a staleness without rows
  expect_status(px_register_sparse(c, "bad-rows", PX_F32, 10, 4, &bad, &refused), PX_ERR_INVALID,
                "cache_staleness without cache_rows");
  expect_contains(px_last_error(), "only meaningful with cache_rows > 0");

  o.cache_rows = 64;
  o.cache_staleness = s_c;
  px_var* var = nullptr;
  check(px_register_sparse(c, "emb", PX_F32, kRows, kDim, &o, &var), "px_register_sparse");

  px::PartitionMap map(kRows, kPartitions, w.node_count);
  auto bit = [&](int rank, uint64_t step) {
    return uint32_t(1) << (uint64_t(rank) * steps + step);
  };
  // Every gradient bit that touched each row.
  std::vector<uint32_t> touched(kRows, 0);
  std::vector<std::vector<uint32_t>> touched_through(steps, std::vector<uint32_t>(kRows, 0));
  for (uint64_t k = 0; k < steps; ++k) {
    for (int r = 0; r < w.world_size; ++r)
      for (int64_t row : lookups(r, k)) touched[size_t(row)] |= bit(r, k);
    touched_through[k] = touched;  // bits of push steps 0..k
  }

  // The simulated cache of this node: the pull step each kept copy was fetched in, what it
  // returned then, and each row's last ask.
  std::map<int64_t, uint64_t> fetched_at, asked_at;
  std::map<int64_t, uint32_t> copy;
  uint64_t bound = 0 + 2 * uint64_t(s_c);  // the table's s (0) + 2 s_c
  uint64_t hits = 0;
  for (uint64_t n = 0; n < steps; ++n) {
    std::vector<int64_t> idx = lookups(w.rank, n);
    std::vector<float> rows(idx.size() * kDim);
    pull_rows_ok(var, idx.data(), idx.size(), rows.data(), "pull step " + std::to_string(n));
    for (size_t j = 0; j < idx.size(); ++j) {
      int64_t row = idx[j];
      float v = rows[j * kDim];
      if (rows[j * kDim + 1] != v) die("row " + std::to_string(row) + ": columns differ");
      auto got = uint32_t(v);
      if (float(got) != v) die("row " + std::to_string(row) + " is not a sum of bits");
      std::string where = "pull step " + std::to_string(n) + " row " + std::to_string(row) +
                          " (value " + std::to_string(got) + ")";
      if ((got & ~touched[size_t(row)]) != 0)
        die(where + ": holds a gradient that never touched it");
      if (n > bound && (got & touched_through[n - 1 - bound][size_t(row)]) !=
                           touched_through[n - 1 - bound][size_t(row)])
        die(where + ": misses a gradient of push step <= " + std::to_string(n - 1 - bound));
      if (map.owner(uint64_t(row)) == w.node_index) continue;  // its own shard: no cache
      auto kept = fetched_at.find(row);
      if (kept != fetched_at.end() && n - kept->second <= s_c) {
        if (got != copy[row])
          die(where + ": served from the cache (copy of pull step " + std::to_string(kept->second) +
              ") but differs from that copy " + std::to_string(copy[row]));
        ++hits;
        continue;
      }
      auto asked = asked_at.find(row);
      bool again = asked != asked_at.end() && n - asked->second <= s_c;
      if (kept != fetched_at.end() || again) {
        fetched_at[row] = n;
        copy[row] = got;
      }
      asked_at[row] = n;
    }
    std::vector<float> grads(idx.size() * kDim, -float(bit(w.rank, n)));
    push_rows_ok(var, idx.data(), idx.size(), grads.data(), "push step " + std::to_string(n));
  }

  // The checkpoint and a read see every gradient once: the held sums are flushed first.
  check(px_barrier(c, 30000), "px_barrier");
  std::string dir = f.str("dir");
  if (w.rank == 0) {
    check(px_checkpoint(c, dir.c_str(), 30000), "px_checkpoint");
    uint64_t seen = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      std::string name = entry.path().filename().string();
      if (name.find(".emb.node") == std::string::npos || name.size() < 6 ||
          name.compare(name.size() - 6, 6, ".shard") != 0)
        continue;
      px::ShardFileData data;
      std::string error;
      if (!px::read_shard_file(entry.path().string(), &data, &error)) die(error);
      for (size_t i = 0; i < data.rows.size(); ++i, ++seen) {
        uint32_t want = touched[size_t(data.rows[i])];
        if (data.values[i * kDim] != float(want))
          die("checkpoint: row " + std::to_string(data.rows[i]) + " is " +
              std::to_string(data.values[i * kDim]) + ", every gradient once is " +
              std::to_string(want));
      }
    }
    if (seen != kRows) die("checkpoint: " + std::to_string(seen) + " rows in the shard files");
  }
  check(px_barrier(c, 30000), "px_barrier");
  std::vector<int64_t> all(kRows);
  for (uint64_t r = 0; r < kRows; ++r) all[r] = int64_t(r);
  std::vector<float> table(kRows * kDim);
  read_rows_ok(var, all.data(), all.size(), table.data(), "read all");
  for (uint64_t r = 0; r < kRows; ++r)
    if (table[r * kDim] != float(touched[r]))
      die("read: row " + std::to_string(r) + " is " + std::to_string(table[r * kDim]) +
          ", every gradient once is " + std::to_string(touched[r]));
  check(px_barrier(c, 30000), "px_barrier");
  px_var_stats stats;
  stats.struct_size = sizeof stats;
  check(px_var_stats_get(var, &stats), "px_var_stats_get");
  if (stats.cache_hits != hits)
    die("the daemon served " + std::to_string(stats.cache_hits) + " rows from its cache, the " +
        "simulation " + std::to_string(hits));
  printf("ok rank %d cache hits=%llu misses=%llu rows=%llu flushed=%llu saved=%llu\n", w.rank,
         (unsigned long long)stats.cache_hits, (unsigned long long)stats.cache_misses,
         (unsigned long long)stats.cache_rows, (unsigned long long)stats.cache_rows_flushed,
         (unsigned long long)stats.cache_bytes_saved);
  return 0;
}

}  // namespace

const std::vector<ScenarioSpec>& cache_scenario_specs() {
  static const std::vector<ScenarioSpec> specs = {
      {"cache-train",
       {"steps:n", "cache-staleness:n", "dir"},
       {},
       "a PX_BOUNDED table through the hot-row cache, every pulled row checked against a "
       "simulation of the rule, the checkpoint and the final table against every gradient once"},
  };
  return specs;
}

int run_cache_scenario(px_client* c, const std::string& scenario, const Flags& flags) {
  if (scenario == "cache-train") return scenario_cache_train(c, flags);
  die("unknown cache scenario " + scenario);
}

}  // namespace pxt
