// Sparse-variable scenarios of the test worker. Every worker simulates the whole job (all
// ranks' lookups and gradients are functions of rank and step) with a reference optimizer
// written here in double precision, and checks every pulled row against it.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "initializer.h"  // the table's initial values, to seed the reference
#include "worker_util.h"

namespace pxt {
namespace {

constexpr uint64_t kRows = 1000;
constexpr uint64_t kDim = 8;
constexpr uint64_t kLookups = 24;

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Zipf-like skew: low rows are hot, so batches repeat rows within and across workers.
std::vector<int64_t> lookups(int rank, uint64_t step) {
  std::vector<int64_t> idx(kLookups);
  for (uint64_t j = 0; j < kLookups; ++j) {
    double t = double(mix(uint64_t(rank) * 1000003 + step * 7919 + j) % 100000) / 100000.0;
    idx[j] = int64_t(double(kRows) * t * t * t);
  }
  return idx;
}

// The model's gradient for lookup j: depends on the pulled value, so a stale pull shows.
double gradient(int rank, uint64_t step, uint64_t j, uint64_t c, double w) {
  return 0.5 * w + 0.01 * std::sin(double(rank + 3 * step + 7 * j + c));
}

struct Options {
  px_sparse_options c;
  std::string optimizer = "sgd";
};

px_sparse_options parse_options(const std::string& opt, const std::string& agg) {
  px_sparse_options o;
  px_sparse_options_init(&o);
  o.initializer = PX_INIT_UNIFORM;
  o.init_seed = 11;
  o.init_low = -0.1;
  o.init_high = 0.1;
  o.aggregation = agg == "mean" ? PX_MEAN : PX_SUM;
  if (opt == "sgd") {
    o.optimizer = PX_OPT_SGD;
    o.learning_rate = 0.1;
  } else if (opt == "adagrad") {
    o.optimizer = PX_OPT_ADAGRAD;
    o.learning_rate = 0.05;
  } else if (opt == "adam") {
    o.optimizer = PX_OPT_ADAM;
    o.learning_rate = 0.01;
  } else {
    die("unknown optimizer " + opt);
  }
  return o;
}

// The reference table: every row's value and optimizer state, in double.
struct Reference {
  px_sparse_options o;
  std::vector<double> w, s1, s2;

  explicit Reference(const px_sparse_options& options) : o(options) {
    px::SparseOptions init;
    init.initializer = px::Initializer::kUniform;
    init.init_seed = o.init_seed;
    init.init_low = o.init_low;
    init.init_high = o.init_high;
    std::vector<float> row(kDim);
    for (uint64_t r = 0; r < kRows; ++r) {
      px::initial_row(init, r, kDim, row.data());
      w.insert(w.end(), row.begin(), row.end());
    }
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

std::vector<int64_t> all_rows() {
  std::vector<int64_t> idx(kRows);
  for (uint64_t r = 0; r < kRows; ++r) idx[r] = int64_t(r);
  return idx;
}

// sparse-train OPT AGG STEPS [PARTITIONS [ROUTE [BAD]]]: STEPS synchronous steps of
// pull -> gradient -> push; every pull checked against the reference, then the whole table.
// BAD=1: the last rank pushes an out-of-range index at step 2 and rank 0 a NaN at step 4;
// both pushes must fail and leave no trace.
int scenario_train(px_client* c, int argc, char** argv) {
  px_sparse_options o = parse_options(argv[0], argv[1]);
  uint64_t steps = strtoull(argv[2], nullptr, 10);
  if (argc > 3) o.partitions = uint32_t(atoi(argv[3]));
  if (argc > 4) o.route = std::string(argv[4]) == "ps" ? PX_ROUTE_PS : PX_ROUTE_HYBRID;
  bool bad = argc > 5 && std::string(argv[5]) == "1";
  int world = world_size(c);
  px_var* var = nullptr;
  check(px_register_sparse(c, "emb", PX_F32, kRows, kDim, &o, &var), "px_register_sparse");
  Reference ref(o);
  auto bad_index_step = [&](int rank, uint64_t k) { return bad && k == 2 && rank == world - 1; };
  auto nan_step = [&](int rank, uint64_t k) { return bad && k == 4 && rank == 0; };
  for (uint64_t k = 0; k < steps; ++k) {
    std::vector<int64_t> idx = lookups(g_rank, k);
    std::vector<float> rows(idx.size() * kDim);
    px_request* r = nullptr;
    check(px_pull_rows(var, idx.data(), idx.size(), rows.data(), &r), "px_pull_rows");
    check(px_wait(r, 30000), "pull");
    px_request_free(r);
    expect_rows(idx, rows, ref.w, "pull step " + std::to_string(k));

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

    // The reference step: every rank's contribution (from reference values).
    std::vector<std::pair<int64_t, std::vector<double>>> contributions;
    for (int rank = 0; rank < world; ++rank) {
      if (bad_index_step(rank, k) || nan_step(rank, k)) continue;
      std::vector<int64_t> ri = lookups(rank, k);
      for (size_t j = 0; j < ri.size(); ++j) {
        std::vector<double> g(kDim);
        for (uint64_t col = 0; col < kDim; ++col)
          g[col] = float(gradient(rank, k, j, col, float(ref.w[size_t(ri[j]) * kDim + col])));
        contributions.emplace_back(ri[j], std::move(g));
      }
    }
    ref.apply(contributions, world, k + 1);
  }
  // Pull step `steps` sees every push: the whole table.
  std::vector<int64_t> idx = all_rows();
  std::vector<float> table(kRows * kDim);
  px_request* r = nullptr;
  check(px_pull_rows(var, idx.data(), idx.size(), table.data(), &r), "px_pull_rows(all)");
  check(px_wait(r, 30000), "pull all");
  px_request_free(r);
  expect_rows(idx, table, ref.w, "final table");
  uint64_t hash = 1469598103934665603ull;
  for (float v : table) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    hash = (hash ^ bits) * 1099511628211ull;
  }
  printf("ok rank %d steps %llu table_hash=%016llx\n", g_rank, (unsigned long long)steps,
         (unsigned long long)hash);
  return 0;
}

}  // namespace

int run_sparse_scenario(px_client* c, const std::string& scenario, int argc, char** argv) {
  if (scenario == "sparse-train" && argc >= 3) return scenario_train(c, argc, argv);
  die("unknown sparse scenario or missing arguments: " + scenario);
}

}  // namespace pxt
