// Sparse-variable scenarios of the test worker. Every worker simulates the whole job (all
// ranks' lookups and gradients are functions of rank and step) with a reference optimizer
// written here in double precision, and checks every pulled row against it.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "sharding/initializer.h"  // the table's initial values, to seed the reference
#include "tests/integration/sparse_lookups.h"
#include "tests/integration/worker_util.h"

namespace pxt {
namespace {

constexpr uint64_t kRows = 1000;
constexpr uint64_t kDim = 8;
constexpr uint64_t kLookups = 24;

// Skewed lookups (low rows hot), repeated within and across workers.
std::vector<int64_t> lookups(int rank, uint64_t step) {
  return skewed_lookups(rank, step, kRows, kLookups, 3);
}

// The model's gradient for lookup j: depends on the pulled value, so a stale pull shows.
double gradient(int rank, uint64_t step, uint64_t j, uint64_t c, double w) {
  return 0.5 * w + 0.01 * std::sin(double(rank + 3 * step + 7 * j + c));
}

enum class Optimizer { kSgd, kAdagrad, kAdam };

px_sparse_options training_options(Optimizer opt, bool mean) {
  px_sparse_options o;
  px_sparse_options_init(&o);
  o.initializer = PX_INIT_UNIFORM;
  o.init_seed = 11;
  o.init_low = -0.1;
  o.init_high = 0.1;
  o.aggregation = mean ? PX_MEAN : PX_SUM;
  switch (opt) {
    case Optimizer::kSgd:
      o.optimizer = PX_OPT_SGD;
      o.learning_rate = 0.1;
      break;
    case Optimizer::kAdagrad:
      o.optimizer = PX_OPT_ADAGRAD;
      o.learning_rate = 0.05;
      break;
    case Optimizer::kAdam:
      o.optimizer = PX_OPT_ADAM;
      o.learning_rate = 0.01;
      break;
  }
  return o;
}

// --route: the choices in px_route order.
const char* const kRouteFlag = "route?:hybrid|ps|allgatherv|allreduce|alltoall|auto";
static_assert(PX_ROUTE_HYBRID == 0 && PX_ROUTE_PS == 1 && PX_ROUTE_ALLGATHERV == 2 &&
              PX_ROUTE_ALLREDUCE == 3 && PX_ROUTE_ALLTOALL == 4 && PX_ROUTE_AUTO == 5);
// --split: how the alltoall route divides the table, in px_split order.
const char* const kSplitFlag = "split?:rows|columns";
static_assert(PX_SPLIT_ROWS == 0 && PX_SPLIT_COLUMNS == 1);

// --route when given, else the options' default.
int32_t route_flag(const Flags& f, int32_t fallback) {
  return f.has("route") ? f.choice("route") : fallback;
}
int32_t split_flag(const Flags& f, int32_t fallback) {
  return f.has("split") ? f.choice("split") : fallback;
}

// The reference table: every row's value and optimizer state, in double.
struct Reference {
  px_sparse_options o;
  std::vector<double> w, s1, s2;

  explicit Reference(const px_sparse_options& options)
      : o(options), w(initial_uniform_table(options, kRows, kDim)) {
    s1.assign(kRows * kDim, o.optimizer == PX_OPT_ADAGRAD ? o.initial_accumulator : 0.0);
    s2.assign(kRows * kDim, 0.0);
  }

  // Applies one step: grads summed per row over every contribution.
  void apply(const std::vector<std::pair<int64_t, std::vector<double>>>& contributions, int world,
             uint64_t t) {
    std::vector<double> sum(kRows * kDim, 0.0);
    std::vector<bool> touched(kRows, false);
    for (auto& [row, g] : contributions) {
      touched[size_t(row)] = true;
      for (uint64_t c = 0; c < kDim; ++c) sum[size_t(row) * kDim + c] += g[c];
    }
    for (uint64_t r = 0; r < kRows; ++r) {
      if (!touched[r]) continue;
      for (uint64_t c = 0; c < kDim; ++c) {
        size_t i = r * kDim + c;
        double g = o.aggregation == PX_MEAN ? sum[i] / world : sum[i];
        switch (o.optimizer) {
          case PX_OPT_SGD:
            w[i] -= o.learning_rate * g;
            break;
          case PX_OPT_ADAGRAD:
            s1[i] += g * g;
            w[i] -= o.learning_rate * g / (std::sqrt(s1[i]) + o.epsilon);
            break;
          default: {
            s1[i] = o.beta1 * s1[i] + (1 - o.beta1) * g;
            s2[i] = o.beta2 * s2[i] + (1 - o.beta2) * g * g;
            double lr = o.learning_rate * std::sqrt(1 - std::pow(o.beta2, double(t))) /
                        (1 - std::pow(o.beta1, double(t)));
            w[i] -= lr * s1[i] / (std::sqrt(s2[i]) + o.epsilon);
          }
        }
      }
    }
  }
};

void expect_rows(const std::vector<int64_t>& idx, const std::vector<float>& got,
                 const std::vector<double>& want, const std::string& what) {
  for (size_t j = 0; j < idx.size(); ++j) {
    for (uint64_t c = 0; c < kDim; ++c) {
      double ref = want[size_t(idx[j]) * kDim + c];
      double g = got[j * kDim + c];
      if (!(std::fabs(g - ref) <= 1e-5 * std::fabs(ref) + 1e-7)) {
        char text[160];
        snprintf(text, sizeof text, ": row %lld column %llu is %.9g, reference %.9g",
                 (long long)idx[j], (unsigned long long)c, g, ref);
        die(what + text);
      }
    }
  }
}

// FNV-1a over the values' bits, rows in order (tests/integration/test_sparse.cc hashes a
// checkpoint's shard files the same way).
uint64_t table_hash(const std::vector<float>& table) {
  uint64_t hash = 1469598103934665603ull;
  for (float v : table) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    hash = (hash ^ bits) * 1099511628211ull;
  }
  return hash;
}

std::vector<int64_t> all_rows() {
  std::vector<int64_t> idx(kRows);
  for (uint64_t r = 0; r < kRows; ++r) idx[r] = int64_t(r);
  return idx;
}

// sparse-train --optimizer sgd|adagrad|adam --aggregation sum|mean --steps N
// [--partitions N] [--route R] [--split rows|columns] [--bad-pushes] [--read-mid-step]: STEPS
// synchronous steps of pull -> gradient -> push; every pull checked against the reference,
// then the whole table. --partitions 0 (or none) lets the daemon choose. --bad-pushes: the
// last rank pushes an out-of-range index at step 2 and rank 0 a NaN at step 4; both pushes
// must fail and leave no trace. --read-mid-step: each rank reads its rows again between its
// pull and its push. --every-row: each step pulls and pushes every row.
int scenario_train(px_client* c, const Flags& f) {
  px_sparse_options o =
      training_options(static_cast<Optimizer>(f.choice("optimizer")), f.choice("aggregation") == 1);
  uint64_t steps = f.u64("steps");
  o.partitions = uint32_t(f.u64("partitions", o.partitions));
  o.route = route_flag(f, o.route);
  o.alltoall_split = split_flag(f, o.alltoall_split);
  bool bad = f.on("bad-pushes");
  bool read_mid_step = f.on("read-mid-step");
  // --every-row: every rank pulls and pushes every row at every step.
  auto step_rows = [every = f.on("every-row")](int rank, uint64_t k) {
    return every ? all_rows() : lookups(rank, k);
  };
  int world = world_size(c);
  px_var* var = nullptr;
  check(px_register_sparse(c, "emb", PX_F32, kRows, kDim, &o, &var), "px_register_sparse");
  Reference ref(o);
  auto bad_index_step = [&](int rank, uint64_t k) { return bad && k == 2 && rank == world - 1; };
  auto nan_step = [&](int rank, uint64_t k) { return bad && k == 4 && rank == 0; };
  auto daemon_step = [&](uint64_t k) {
    std::vector<int64_t> idx = step_rows(g_rank, k);
    std::vector<float> rows(idx.size() * kDim);
    pull_rows_ok(var, idx.data(), idx.size(), rows.data(), "pull");
    expect_rows(idx, rows, ref.w, "pull step " + std::to_string(k));
    // Between its pull and its push a worker reads the rows again: the same values (no
    // push of step k can be applied before this worker's).
    if (read_mid_step) {
      std::vector<float> again(idx.size() * kDim);
      read_rows_ok(var, idx.data(), idx.size(), again.data(), "read mid-step");
      expect_rows(idx, again, ref.w, "read in step " + std::to_string(k));
    }

    std::vector<float> grads(idx.size() * kDim);
    for (size_t j = 0; j < idx.size(); ++j)
      for (uint64_t col = 0; col < kDim; ++col)
        grads[j * kDim + col] = float(gradient(g_rank, k, j, col, rows[j * kDim + col]));
    std::vector<int64_t> push_idx = idx;
    if (bad_index_step(g_rank, k)) {
      push_idx.push_back(int64_t(kRows));
      grads.resize(push_idx.size() * kDim, 1.0f);
    }
    if (nan_step(g_rank, k)) grads[3] = NAN;
    px_request* r = nullptr;
    check(px_push_rows(var, push_idx.data(), push_idx.size(), grads.data(), &r), "px_push_rows");
    px_status s = px_wait(r, 30000);
    std::string message = px_last_error();
    px_request_free(r);
    if (bad_index_step(g_rank, k)) {
      expect_status(s, PX_ERR_INDEX, "push with index 1000");
      expect_contains(message, "index 1000 at position 24");
      expect_contains(message, "'emb'");
    } else if (nan_step(g_rank, k)) {
      expect_status(s, PX_ERR_INVALID, "push with a NaN");
      expect_contains(message, "NaN");
    } else {
      check(s, "push");
    }
  };
  // PX_TEST_START_STEP: the table was restored after that many steps; they are replayed in
  // the reference only. PX_TEST_CHECKPOINT_DIR: checkpoint after the last step.
  uint64_t start =
      getenv("PX_TEST_START_STEP") ? strtoull(getenv("PX_TEST_START_STEP"), nullptr, 10) : 0;
  // PX_TEST_RESUME: the step to resume from is the one the daemon restored the table to.
  if (getenv("PX_TEST_RESUME")) {
    px_var_stats restored;
    restored.struct_size = sizeof restored;
    check(px_var_stats_get(var, &restored), "px_var_stats_get");
    start = restored.restored_steps;
    if (start == 0) die("PX_TEST_RESUME: the table was not restored");
    printf("resumed at step %llu\n", (unsigned long long)start);
  }
  // The restored table, bitwise, before any step (compared with the checkpoint's files).
  if (start > 0 && g_rank == 0) {
    std::vector<int64_t> idx = all_rows();
    std::vector<float> table(kRows * kDim);
    px_request* r = nullptr;
    check(px_read_rows(var, idx.data(), idx.size(), table.data(), &r), "px_read_rows");
    px_status s = px_wait(r, 30000);
    px_request_free(r);
    check(s, "read of the restored table");
    printf("start_hash=%016llx\n", (unsigned long long)table_hash(table));
  }
  // PX_TEST_STEP_SLEEP_MS: a pause after each step (a run periodic checkpoints overtake).
  int sleep_ms = getenv("PX_TEST_STEP_SLEEP_MS") ? atoi(getenv("PX_TEST_STEP_SLEEP_MS")) : 0;
  for (uint64_t k = 0; k < steps; ++k) {
    if (k >= start) daemon_step(k);
    if (k >= start && sleep_ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    // The reference step: every rank's contribution (from reference values).
    std::vector<std::pair<int64_t, std::vector<double>>> contributions;
    for (int rank = 0; rank < world; ++rank) {
      if (bad_index_step(rank, k) || nan_step(rank, k)) continue;
      std::vector<int64_t> ri = step_rows(rank, k);
      for (size_t j = 0; j < ri.size(); ++j) {
        std::vector<double> g(kDim);
        for (uint64_t col = 0; col < kDim; ++col)
          g[col] = float(gradient(rank, k, j, col, float(ref.w[size_t(ri[j]) * kDim + col])));
        contributions.emplace_back(ri[j], std::move(g));
      }
    }
    ref.apply(contributions, world, k + 1);
  }
  if (const char* dir = getenv("PX_TEST_CHECKPOINT_DIR")) {
    check(px_barrier(c, 30000), "px_barrier");
    if (g_rank == 0) check(px_checkpoint(c, dir, 60000), "px_checkpoint");
    check(px_barrier(c, 30000), "px_barrier");
  }
  // The next pull step sees every push: the whole table.
  std::vector<int64_t> idx = all_rows();
  std::vector<float> table(kRows * kDim);
  pull_rows_ok(var, idx.data(), idx.size(), table.data(), "pull all");
  expect_rows(idx, table, ref.w, "final table");
  // The requests a step makes: one per partition when the count was given; with automatic
  // partitions 1, 2, 4 or 8 per node (a trial's, or the choice after 23 push steps); none on
  // the replicated routes; one per node on alltoall (by columns: per node holding columns).
  px_world_info w = world_of(c);
  px_var_stats stats;
  stats.struct_size = sizeof stats;
  check(px_var_stats_get(var, &stats), "px_var_stats_get");
  bool replicated = o.route == PX_ROUTE_ALLGATHERV || o.route == PX_ROUTE_ALLREDUCE;
  uint64_t p = stats.request_partitions, n = uint64_t(w.node_count);
  bool alltoall = o.route == PX_ROUTE_ALLTOALL;
  bool searched = p == n || p == 2 * n || p == 4 * n || p == 8 * n;
  // auto: whichever route the table is on now (one per node holding columns on alltoall).
  // So for sync hybrid (auto too) touching every row: allreduce moves fewer bytes than ps.
  // Hybrid tables pulling fewer rows stay on ps and are checked as ps.
  bool chosen = o.route == PX_ROUTE_AUTO ||
                (o.route == PX_ROUTE_HYBRID && o.consistency == PX_SYNC && f.on("every-row"));
  bool any_route = p == 0 || searched || p == std::min<uint64_t>(n, kDim);
  bool wrong = chosen         ? !any_route
               : replicated   ? p != 0
               : alltoall     ? p != std::min<uint64_t>(n, kDim)
               : o.partitions ? p != std::min<uint64_t>(o.partitions, kRows)
                              : !searched;
  if (wrong) die("request_partitions " + std::to_string(p) + " on " + std::to_string(n) + " nodes");
  // The step it resumed from is what the daemon says it restored (0: not restored).
  if (stats.restored_steps != start)
    die("restored_steps " + std::to_string(stats.restored_steps) + ", resumed at step " +
        std::to_string(start));
  uint64_t pushed = stats.push_steps;
  bool searches = !replicated && !alltoall && !o.partitions && !chosen;
  if (!chosen && stats.search_steps_left != (searches && pushed < 23 ? 23 - pushed : 0))
    die("search_steps_left " + std::to_string(stats.search_steps_left) + " after " +
        std::to_string(pushed) + " push steps");
  printf("ok rank %d steps %llu table_hash=%016llx\n", g_rank, (unsigned long long)steps,
         (unsigned long long)table_hash(table));
  return 0;
}

// sparse-bounded --consistency sync|bounded|async --staleness N --steps N: SGD with
// positive, value-independent gradients, so every value only falls; a pull's values must lie
// between the reference after the steps it must see and the reference after every step that can
// exist by then. Rank 0 is slow, so others run ahead as far as the staleness lets them.
int scenario_bounded(px_client* c, const Flags& f) {
  std::string mode = f.str("consistency");
  int consistency = f.choice("consistency");
  uint32_t staleness = uint32_t(f.u64("staleness"));
  uint64_t steps = f.u64("steps");
  px_sparse_options o = training_options(Optimizer::kSgd, false);
  o.consistency = consistency == 2 ? PX_ASYNC : consistency == 1 ? PX_BOUNDED : PX_SYNC;
  if (o.consistency == PX_BOUNDED) o.staleness = staleness;
  o.route = route_flag(f, o.route);
  o.alltoall_split = split_flag(f, o.alltoall_split);
  int world = world_size(c);
  px_var* var = nullptr;
  check(px_register_sparse(c, "emb", PX_F32, kRows, kDim, &o, &var), "px_register_sparse");
  auto grad = [](int rank, uint64_t k, uint64_t j) { return 0.01 * (1 + (rank + k + j) % 3); };
  // after[k]: the reference once push steps 0..k-1 of every rank are applied.
  std::vector<std::vector<double>> after;
  Reference ref(o);
  after.push_back(ref.w);
  for (uint64_t k = 0; k < steps; ++k) {
    std::vector<std::pair<int64_t, std::vector<double>>> contributions;
    for (int rank = 0; rank < world; ++rank) {
      std::vector<int64_t> ri = lookups(rank, k);
      for (size_t j = 0; j < ri.size(); ++j)
        contributions.emplace_back(ri[j], std::vector<double>(kDim, float(grad(rank, k, j))));
    }
    ref.apply(contributions, world, k + 1);
    after.push_back(ref.w);
  }
  bool async = o.consistency == PX_ASYNC;
  for (uint64_t k = 0; k < steps; ++k) {
    if (g_rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
    std::vector<int64_t> idx = lookups(g_rank, k);
    std::vector<float> rows(idx.size() * kDim);
    pull_rows_ok(var, idx.data(), idx.size(), rows.data(), "pull");
    const std::vector<double>& upper = after[async || k < staleness ? 0 : k - staleness];
    const std::vector<double>& lower = after[std::min<uint64_t>(steps, k + staleness + 1)];
    for (size_t j = 0; j < idx.size(); ++j) {
      for (uint64_t col = 0; col < kDim; ++col) {
        size_t i = size_t(idx[j]) * kDim + col;
        double g = rows[j * kDim + col];
        if (g > upper[i] + 1e-6 || (!async && g < lower[i] - 1e-6))
          die("pull step " + std::to_string(k) + ": row " + std::to_string(idx[j]) +
              " is outside what staleness " + std::to_string(staleness) + " allows");
      }
    }
    std::vector<float> grads(idx.size() * kDim);
    for (size_t j = 0; j < idx.size(); ++j)
      for (uint64_t col = 0; col < kDim; ++col) grads[j * kDim + col] = float(grad(g_rank, k, j));
    push_rows_ok(var, idx.data(), idx.size(), grads.data(), "push");
  }
  std::vector<int64_t> idx = all_rows();
  std::vector<float> table(kRows * kDim);
  if (async) {
    // Eventually every push is applied.
    for (int attempt = 0;; ++attempt) {
      read_rows_ok(var, idx.data(), idx.size(), table.data(), "read");
      bool equal = true;
      for (size_t i = 0; i < table.size() && equal; ++i)
        equal = std::fabs(table[i] - after[steps][i]) <= 1e-5 * std::fabs(after[steps][i]) + 1e-7;
      if (equal) break;
      if (attempt == 500) die("the async table never reached the reference");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } else {
    // Empty push steps carry the pull past the staleness window: it sees every real push.
    for (uint32_t e = 0; e < staleness; ++e) {
      push_rows_ok(var, nullptr, 0, nullptr, "empty push");
      pull_rows_ok(var, nullptr, 0, nullptr, "empty pull");
    }
    pull_rows_ok(var, idx.data(), idx.size(), table.data(), "pull all");
  }
  expect_rows(idx, table, after[steps], "final table");
  printf("ok rank %d %s\n", g_rank, mode.c_str());
  return 0;
}

px_status register_with(px_client* c, const char* name, px_dtype dtype, uint64_t rows,
                        const px_sparse_options& o, px_var** var) {
  return px_register_sparse(c, name, dtype, rows, 4, &o, var);
}

// sparse-errors: every refusal the ABI promises, with what the message must name.
int scenario_errors(px_client* c) {
  px_sparse_options o;
  px_sparse_options_init(&o);
  px_var* v = nullptr;
  px_sparse_options bad = o;
  bad.route = 7;
  expect_status(register_with(c, "route", PX_F32, 10, bad, &v), PX_ERR_INVALID, "route 7");
  expect_contains(last_message(), "route");
  expect_status(register_with(c, "f64", PX_F64, 10, o, &v), PX_ERR_NOT_IMPLEMENTED, "f64 table");
  expect_status(register_with(c, "empty", PX_F32, 0, o, &v), PX_ERR_INVALID, "0 rows");
  bad = o;
  bad.learning_rate = -1;
  expect_status(register_with(c, "lr", PX_F32, 10, bad, &v), PX_ERR_INVALID, "negative lr");
  expect_contains(last_message(), "learning_rate");
  bad = o;
  bad.struct_size = 0;
  expect_status(register_with(c, "size", PX_F32, 10, bad, &v), PX_ERR_INVALID, "struct_size 0");
  // Copies (1.16): 1 or 2, on a synchronous ps table, with membership on etcd (this daemon
  // has none).
  bad = o;
  bad.replicas = 3;
  expect_status(register_with(c, "replicas3", PX_F32, 10, bad, &v), PX_ERR_INVALID, "replicas 3");
  expect_contains(last_message(), "replicas must be 1 or 2");
  bad.replicas = 2;
  bad.consistency = PX_ASYNC;
  expect_status(register_with(c, "replicas-async", PX_F32, 10, bad, &v), PX_ERR_INVALID,
                "replicas of an async table");
  expect_contains(last_message(), "replicas need PX_SYNC");
  bad.consistency = PX_SYNC;
  bad.route = PX_ROUTE_ALLGATHERV;
  expect_status(register_with(c, "replicas-ag", PX_F32, 10, bad, &v), PX_ERR_INVALID,
                "replicas on allgatherv");
  expect_contains(last_message(), "(not allgatherv)");
  bad.route = PX_ROUTE_PS;
  expect_status(register_with(c, "replicas-static", PX_F32, 10, bad, &v), PX_ERR_INVALID,
                "replicas without membership");
  expect_contains(last_message(), "replicas need membership on etcd");

  // Options that differ across workers.
  px_sparse_options mine = o;
  mine.learning_rate = g_rank == 0 ? 0.1 : 0.2;
  px_var* mm = nullptr;
  px_status s = register_with(c, "mm", PX_F32, 100, mine, &mm);
  bool registered_mm = s == PX_OK;
  // On a cluster a node whose own workers agree may complete a few operations before the
  // other node's late registration is known; then it must fail too.
  for (int attempt = 0; s == PX_OK && attempt < 500; ++attempt) {
    px_request* r = nullptr;
    int64_t row = attempt % 100;
    float out[4];
    check(px_pull_rows(mm, &row, 1, out, &r), "pull of mm");
    s = wait_free(r);
    if (s == PX_OK) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  expect_status(s, PX_ERR_MISMATCH, "options differ across workers");
  expect_contains(last_message(), "lr=0.2");
  expect_contains(last_message(), "lr=0.1");

  // A checkpoint of a poisoned variable fails with the poison (and only one reply comes:
  // the next control call, a registration, still gets its own answer).
  std::string dir = "/tmp/pxt-ckpt-errors-" + std::to_string(getpid());
  px_status ck = px_checkpoint(c, dir.c_str(), 30000);
  if (registered_mm) {
    expect_status(ck, PX_ERR_MISMATCH, "checkpoint of a poisoned variable");
  } else {
    check(ck, "checkpoint with no sparse variable registered");
  }
  rmdir(dir.c_str());

  // Wrong kind of operation for the variable.
  px_var* e = nullptr;
  check(register_with(c, "e", PX_F32, 100, o, &e), "register e");
  px_var* d = nullptr;
  check(px_register_dense(c, "d", PX_F32, 4, PX_SUM, &d), "register d");
  float buffer[16] = {0};
  px_request* r = nullptr;
  expect_status(px_allreduce(e, buffer, buffer, &r), PX_ERR_INVALID, "allreduce of sparse");
  expect_contains(last_message(), "sparse");
  int64_t index = 1;
  expect_status(px_pull_rows(d, &index, 1, buffer, &r), PX_ERR_INVALID, "pull of dense");
  expect_contains(last_message(), "not a sparse variable");
  expect_status(px_pull_rows(e, nullptr, 1, buffer, &r), PX_ERR_INVALID, "NULL indices");

  // Reads and loads are checked like pushes: nothing of a bad one is applied.
  int64_t out_of_range[2] = {3, 100};
  check(px_read_rows(e, out_of_range, 2, buffer, &r), "px_read_rows");
  expect_status(wait_free(r), PX_ERR_INDEX, "read of row 100");
  expect_contains(last_message(), "index 100 at position 1");
  expect_contains(last_message(), "[0, 100)");
  float nan_rows[8] = {1, 2, 3, 4, 5, NAN, 7, 8};
  int64_t two[2] = {3, 4};
  check(px_load_rows(e, two, 2, nan_rows, &r), "px_load_rows");
  expect_status(wait_free(r), PX_ERR_INVALID, "load with NaN");
  expect_contains(last_message(), "row 4");
  read_rows_ok(e, two, 2, buffer, "read after the refused load");
  for (int i = 0; i < 8; ++i)
    if (buffer[i] != 0.0f) die("the refused load left a trace");

  // NaN gradients skipped by option: the other rows and workers still count.
  px_sparse_options skip = o;
  skip.nonfinite = PX_NONFINITE_SKIP;
  skip.learning_rate = 1;
  px_var* sk = nullptr;
  check(register_with(c, "skip", PX_F32, 10, skip, &sk), "register skip");
  int64_t rows0[2] = {1, 2};
  float grads0[8] = {NAN, 1, 1, 1, 2, 2, 2, 2};
  int64_t rows1[1] = {1};
  float grads1[4] = {3, 3, 3, 3};
  pull_rows_ok(sk, nullptr, 0, nullptr, "pull step 0 (skip)");
  if (g_rank == 0)
    push_rows_ok(sk, rows0, 2, grads0, "push with NaN (skip)");
  else
    push_rows_ok(sk, rows1, g_rank == 1 ? 1 : 0, grads1, "push (skip)");
  pull_rows_ok(sk, rows0, 2, buffer, "pull step 1 (skip)");
  if (buffer[0] != -3.0f || buffer[4] != -2.0f)
    die("NaN-skipped push gave " + std::to_string(buffer[0]) + ", " + std::to_string(buffer[4]));
  printf("ok rank %d errors\n", g_rank);
  return 0;
}

// Requests too large for one message: one partition of 20,000 rows, so every other node's
// load, read, pull and push carries more indices than fit beside the request header and
// gets a reply of several chunks.
void check_large_requests(px_client* c, px_route route, int32_t split, uint64_t dim = 4) {
  constexpr uint64_t rows = 20000;
  px_sparse_options o;
  px_sparse_options_init(&o);
  o.learning_rate = 1;
  o.partitions = route == PX_ROUTE_ALLTOALL ? 0 : 1;  // alltoall: one slice per node
  o.route = route;
  o.alltoall_split = split;
  px_var* var = nullptr;
  std::string name = "large" + std::to_string(dim);
  check(px_register_sparse(c, name.c_str(), PX_F32, rows, dim, &o, &var), "register large");
  std::vector<int64_t> idx(rows);
  std::vector<float> values(rows * dim);
  for (uint64_t i = 0; i < rows * dim; ++i) values[i] = float(i);
  for (uint64_t r = 0; r < rows; ++r) idx[r] = int64_t(rows - 1 - r);  // not in row order
  auto value = [&](uint64_t j, uint64_t col) { return float((rows - 1 - j) * dim + col); };
  if (g_rank == 0) {
    std::vector<float> by_index(rows * dim);
    for (uint64_t j = 0; j < rows; ++j)
      for (uint64_t col = 0; col < dim; ++col) by_index[j * dim + col] = value(j, col);
    load_rows_ok(var, idx.data(), rows, by_index.data(), "load large");
  }
  check(px_barrier(c, 30000), "px_barrier");
  std::vector<float> got(rows * dim, -1.0f);
  auto expect = [&](const char* what, float minus) {
    for (uint64_t j = 0; j < rows; ++j)
      for (uint64_t col = 0; col < dim; ++col)
        if (got[j * dim + col] != value(j, col) - minus)
          die(std::string(what) + ": row " + std::to_string(idx[j]) + " column " +
              std::to_string(col) + " is " + std::to_string(got[j * dim + col]));
  };
  read_rows_ok(var, idx.data(), rows, got.data(), "read large");
  expect("read large", 0);
  pull_rows_ok(var, idx.data(), rows, got.data(), "pull large 0");
  expect("pull large 0", 0);
  std::vector<float> ones(rows * dim, 1.0f);
  push_rows_ok(var, idx.data(), rows, ones.data(), "push large 0");
  pull_rows_ok(var, idx.data(), rows, got.data(), "pull large 1");
  expect("pull large 1", float(world_size(c)));
}

// sparse-load [--route R] [--split rows|columns]: rank 0 loads a table (ordinary memory), everyone
// reads it back (arena memory, duplicates), then a training step starts from the loaded values;
// then the same for requests too large for one message.
int scenario_load(px_client* c, const Flags& f) {
  px_sparse_options o;
  px_sparse_options_init(&o);
  o.learning_rate = 0.5;
  o.route = route_flag(f, o.route);
  o.alltoall_split = split_flag(f, o.alltoall_split);
  px_var* var = nullptr;
  check(px_register_sparse(c, "tbl", PX_F32, kRows, kDim, &o, &var), "register");
  auto value = [](int64_t row, uint64_t col) { return float(row) + float(col) / 10.0f; };
  if (g_rank == 0) {
    std::vector<int64_t> idx = all_rows();
    std::vector<float> rows(kRows * kDim);
    for (uint64_t i = 0; i < kRows * kDim; ++i) rows[i] = value(int64_t(i / kDim), i % kDim);
    idx.push_back(5);  // duplicates: the last one wins
    rows.resize(rows.size() + kDim, -1.0f);
    load_rows_ok(var, idx.data(), idx.size(), rows.data(), "load");
  }
  check(px_barrier(c, 30000), "px_barrier");
  void* arena_idx = nullptr;
  void* arena_rows = nullptr;
  check(px_alloc(c, 64 * sizeof(int64_t), &arena_idx), "px_alloc");
  check(px_alloc(c, 64 * kDim * sizeof(float), &arena_rows), "px_alloc");
  auto* idx = static_cast<int64_t*>(arena_idx);
  auto* rows = static_cast<float*>(arena_rows);
  for (int j = 0; j < 64; ++j) idx[j] = int64_t(mix(uint64_t(g_rank * 100 + j)) % 50) * 20;
  read_rows_ok(var, idx, 64, rows, "read");
  for (int j = 0; j < 64; ++j)
    for (uint64_t col = 0; col < kDim; ++col) {
      float want = idx[j] == 5 ? -1.0f : value(idx[j], col);
      if (rows[j * kDim + col] != want)
        die("read row " + std::to_string(idx[j]) + " gave " + std::to_string(rows[j * kDim + col]));
    }
  int64_t row = 7;
  float got[kDim];
  pull_rows_ok(var, &row, 1, got, "pull 0");
  float grad[kDim];
  for (uint64_t col = 0; col < kDim; ++col) grad[col] = 1.0f;
  push_rows_ok(var, &row, 1, grad, "push 0");
  pull_rows_ok(var, &row, 1, got, "pull 1");
  int world = world_size(c);
  for (uint64_t col = 0; col < kDim; ++col)
    if (got[col] != value(7, col) - 0.5f * float(world))
      die("after one step row 7 is " + std::to_string(got[col]));
  px_free(c, arena_idx);
  px_free(c, arena_rows);
  check_large_requests(c, static_cast<px_route>(o.route), o.alltoall_split);
  // By columns, a table narrower than the node count: the nodes past its dim hold nothing
  // and get no requests; a checkpoint still counts them.
  if (o.alltoall_split == PX_SPLIT_COLUMNS) {
    check_large_requests(c, static_cast<px_route>(o.route), o.alltoall_split, 1);
    if (const char* dir = getenv("PX_TEST_CHECKPOINT_DIR")) {
      check(px_barrier(c, 30000), "px_barrier");
      if (g_rank == 0) check(px_checkpoint(c, dir, 60000), "px_checkpoint of a narrow table");
      check(px_barrier(c, 30000), "px_barrier");
    }
  }
  printf("ok rank %d load\n", g_rank);
  return 0;
}

// sparse-restore-mismatch: 'emb' registered with another dim than its checkpoint.
int scenario_restore_mismatch(px_client* c) {
  px_var* var = nullptr;
  px_sparse_options o;
  px_sparse_options_init(&o);
  px_status s = px_register_sparse(c, "emb", PX_F32, kRows, kDim * 2, &o, &var);
  expect_status(s, PX_ERR_INVALID, "registration against a checkpoint of another shape");
  expect_contains(last_message(), "cannot be restored");
  printf("ok rank %d restore-mismatch\n", g_rank);
  return 0;
}

// sparse-node-mismatch: the learning rate differs by node: PX_ERR_MISMATCH everywhere.
int scenario_node_mismatch(px_client* c) {
  px_world_info w = world_of(c);
  px_sparse_options o;
  px_sparse_options_init(&o);
  o.learning_rate = w.node_index == 1 ? 0.5 : 0.25;
  px_var* var = nullptr;
  // From the registration itself if the nodes' verdict came first, else from the pull.
  px_status s = px_register_sparse(c, "emb", PX_F32, 100, 4, &o, &var);
  if (s == PX_OK) {
    int64_t row = 1;
    float out[4];
    px_request* r = nullptr;
    check(px_pull_rows(var, &row, 1, out, &r), "pull");
    s = wait_free(r);
  }
  expect_status(s, PX_ERR_MISMATCH, "a variable the nodes disagree on");
  expect_contains(last_message(), "lr=0.5");
  expect_contains(last_message(), "node 1");
  printf("ok rank %d node-mismatch\n", g_rank);
  return 0;
}

// sparse-checkpoint-timeout --dir DIR (2 nodes x 1 worker): node 1 pushes its second step late,
// so node 0's checkpoint after its own second push cannot complete in time:
// PX_ERR_TIMEOUT at its deadline, and the connection still answers the next control call
// correctly. Once both pushed, a checkpoint succeeds and its manifest is there.
int scenario_checkpoint_timeout(px_client* c, const char* dir) {
  px_world_info w = world_of(c);
  px_var* var = nullptr;
  check(px_register_sparse(c, "emb", PX_F32, 100, 4, nullptr, &var), "register");
  int64_t row = 1;
  float grad[4] = {1, 1, 1, 1};
  auto push = [&] { push_rows_ok(var, &row, 1, grad, "push"); };
  push();
  if (w.node_index == 0) {
    push();
    auto t0 = std::chrono::steady_clock::now();
    px_status s = px_checkpoint(c, dir, 1500);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    expect_status(s, PX_ERR_TIMEOUT, "a checkpoint another node holds up");
    expect_contains(last_message(), "1500 ms");
    if (seconds < 1.4 || seconds > 5)
      die("the checkpoint gave up after " + std::to_string(seconds) + " s");
    px_var_stats stats;
    stats.struct_size = sizeof stats;
    check(px_var_stats_get(var, &stats), "px_var_stats_get after a timed-out checkpoint");
    if (stats.push_steps != 2) die("push_steps " + std::to_string(stats.push_steps));
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(3000));
    push();
  }
  check(px_barrier(c, 30000), "px_barrier");
  if (w.node_index == 0) {
    check(px_checkpoint(c, dir, 20000), "px_checkpoint once every node pushed");
    std::string manifest = std::string(dir) + "/checkpoint-timeout.emb.manifest";
    if (access(manifest.c_str(), F_OK) != 0) die("no " + manifest);
  }
  printf("ok rank %d checkpoint-timeout\n", g_rank);
  return 0;
}

}  // namespace

const std::vector<ScenarioSpec>& sparse_scenario_specs() {
  static const std::vector<ScenarioSpec> specs = {
      // --optimizer in Optimizer order.
      {"sparse-train",
       {"optimizer:sgd|adagrad|adam", "aggregation:sum|mean", "steps:n", "partitions?:n",
        kRouteFlag, kSplitFlag},
       {"bad-pushes", "read-mid-step", "every-row"},
       "training checked against a reference optimizer (--partitions 0: the daemon chooses)"},
      {"sparse-bounded",
       {"consistency:sync|bounded|async", "staleness:n", "steps:n", kRouteFlag, kSplitFlag},
       {},
       "every pull within what the consistency and staleness allow"},
      {"sparse-errors", {}, {}, "every refusal the ABI promises"},
      {"sparse-load", {kRouteFlag, kSplitFlag}, {}, "load, read back, train from loaded values"},
      {"sparse-node-mismatch", {}, {}, "options that differ by node"},
      {"sparse-checkpoint-timeout", {"dir"}, {}, "a checkpoint past its deadline (2 nodes)"},
      {"sparse-restore-mismatch", {}, {}, "a registration against a checkpoint of another shape"},
  };
  return specs;
}

int run_sparse_scenario(px_client* c, const std::string& scenario, const Flags& flags) {
  if (scenario == "sparse-train") return scenario_train(c, flags);
  if (scenario == "sparse-bounded") return scenario_bounded(c, flags);
  if (scenario == "sparse-errors") return scenario_errors(c);
  if (scenario == "sparse-load") return scenario_load(c, flags);
  if (scenario == "sparse-node-mismatch") return scenario_node_mismatch(c);
  if (scenario == "sparse-checkpoint-timeout")
    return scenario_checkpoint_timeout(c, flags.str("dir").c_str());
  if (scenario == "sparse-restore-mismatch") return scenario_restore_mismatch(c);
  die("unknown sparse scenario " + scenario);
}

}  // namespace pxt
