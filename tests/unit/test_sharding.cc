// sharding/: partition maps, initialisation, coalescing and the optimizers against
// references written here in double precision.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "sharding/coalesce.h"
#include "sharding/column_split.h"
#include "sharding/initializer.h"
#include "sharding/optimizer.h"
#include "sharding/partition_map.h"
#include "sharding/row_plan.h"
#include "sharding/shard_store.h"

namespace px {
namespace {

TEST_CASE("partition map stripes rows and balances partitions across nodes by bytes") {
  PartitionMap map(1001, 6, 4);
  CHECK(map.partitions() == 6);
  uint64_t total = 0;
  for (uint32_t p = 0; p < 6; ++p) total += map.rows_in(p);
  CHECK(total == 1001);
  CHECK(map.rows_in(0) == 167);  // 1001 = 6 * 166 + 5
  CHECK(map.rows_in(5) == 166);
  for (uint64_t row : {0ull, 1ull, 5ull, 6ull, 1000ull}) {
    CHECK(map.partition_of(row) == row % 6);
    CHECK(map.local_index(row) == row / 6);
  }
  // Greedy by bytes: the four largest partitions on four different nodes, then the rest on
  // the least loaded.
  std::map<int, uint64_t> load;
  for (uint32_t p = 0; p < 6; ++p) load[map.node_of_partition(p)] += map.rows_in(p);
  CHECK(load.size() == 4);
  uint64_t most = 0, least = ~0ull;
  for (auto& [node, rows] : load) {
    most = std::max(most, rows);
    least = std::min(least, rows);
  }
  CHECK(most - least <= 167);
  // Every node computes the same map.
  PartitionMap again(1001, 6, 4);
  for (uint32_t p = 0; p < 6; ++p) CHECK(again.node_of_partition(p) == map.node_of_partition(p));
  // More partitions than rows are clamped.
  CHECK(PartitionMap(3, 10, 2).partitions() == 3);
}

TEST_CASE("the Zipf head spreads over every partition") {
  PartitionMap map(800000, 8, 4);
  std::set<uint32_t> head;
  for (uint64_t row = 0; row < 8; ++row) head.insert(map.partition_of(row));
  CHECK(head.size() == 8);
}

TEST_CASE("initial values depend on seed, row and column only") {
  SparseOptions options;
  options.initializer = Initializer::kUniform;
  options.init_seed = 7;
  options.init_low = -1;
  options.init_high = 2;
  ShardStore one(PartitionMap(100, 1, 1), 0, 4, options);
  PartitionMap striped(100, 3, 2);
  ShardStore a(striped, 0, 4, options), b(striped, 1, 4, options);
  double sum = 0;
  for (int64_t row = 0; row < 100; ++row) {
    float expect[4], got[4];
    one.gather(&row, 1, expect);
    (a.owns(row) ? a : b).gather(&row, 1, got);
    for (int c = 0; c < 4; ++c) {
      CHECK(got[c] == expect[c]);
      CHECK(expect[c] >= -1.0f);
      CHECK(expect[c] < 2.0f);
      sum += expect[c];
    }
  }
  CHECK(std::fabs(sum / 400 - 0.5) < 0.15);
  options.initializer = Initializer::kNormal;
  options.init_std = 0.5;
  double sq = 0;
  std::vector<float> row(1000);
  initial_row(options, 3, 1000, row.data());
  for (float v : row) sq += double(v) * v;
  CHECK(std::sqrt(sq / 1000) == doctest::Approx(0.5).epsilon(0.1));
}

TEST_CASE("column ranges split dim as evenly as possible, nodes past dim hold nothing") {
  auto widths = [](uint64_t dim, int nodes) {
    std::vector<uint64_t> w;
    uint64_t next = 0;
    for (const ColumnRange& r : column_ranges(dim, nodes)) {
      CHECK(r.begin == next);  // contiguous, in node order
      next = r.end;
      w.push_back(r.width());
    }
    CHECK(next == dim);
    return w;
  };
  CHECK(widths(8, 3) == std::vector<uint64_t>{3, 3, 2});
  CHECK(widths(8, 2) == std::vector<uint64_t>{4, 4});
  CHECK(widths(128, 4) == std::vector<uint64_t>{32, 32, 32, 32});
  CHECK(widths(2, 4) == std::vector<uint64_t>{1, 1, 0, 0});
  CHECK(widths(5, 1) == std::vector<uint64_t>{5});
}

TEST_CASE("column stores initialise their columns and restore cells from any slicing") {
  SparseOptions options;
  options.optimizer = Optimizer::kAdam;
  options.initializer = Initializer::kNormal;
  options.init_seed = 3;
  const uint64_t rows = 50, dim = 8;
  ShardStore whole(PartitionMap(rows, 1, 1), 0, dim, options);
  // Three column slices (3, 3, 2 columns): each value is the whole table's.
  std::vector<ShardStore> slices;
  for (int n = 0; n < 3; ++n)
    slices.emplace_back(PartitionMap(rows, 1, 1), 0, dim, options, column_range(dim, 3, n));
  // Train them alike: one Adam step on every row (the column-wise route's elementwise apply).
  std::vector<int64_t> all(rows);
  for (uint64_t r = 0; r < rows; ++r) all[r] = int64_t(r);
  std::vector<float> grads(rows * dim);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.01f * float(i % 13) - 0.05f;
  whole.apply(all.data(), rows, grads.data(), 1, options.learning_rate);
  for (int n = 0; n < 3; ++n) {
    ColumnRange c = column_range(dim, 3, n);
    std::vector<float> part(rows * c.width());
    for (uint64_t r = 0; r < rows; ++r)
      for (uint64_t k = 0; k < c.width(); ++k)
        part[r * c.width() + k] = grads[r * dim + c.begin + k];
    slices[size_t(n)].apply(all.data(), rows, part.data(), 1, options.learning_rate);
  }
  ShardFileData whole_file;
  whole.export_rows(&whole_file);
  CHECK_FALSE(whole_file.column_slice);
  std::vector<ShardFileData> files(3);
  for (int n = 0; n < 3; ++n) {
    slices[size_t(n)].export_rows(&files[size_t(n)]);
    CHECK(files[size_t(n)].column_slice);
    CHECK(files[size_t(n)].column_begin == column_range(dim, 3, n).begin);
  }
  // Onto 2 column slices (4 + 4: each from two files) and onto whole rows of 2 nodes' ps
  // partitions: every cell comes back, values and Adam's moments bit for bit.
  for (int n = 0; n < 2; ++n) {
    ShardStore target(PartitionMap(rows, 1, 1), 0, dim, options, column_range(dim, 2, n));
    uint64_t taken = 0;
    for (const ShardFileData& f : files) taken += target.import_rows(view_of(f));
    CHECK(taken == rows * 4);
    ShardFileData back;
    target.export_rows(&back);
    ColumnRange c = column_range(dim, 2, n);
    for (uint64_t r = 0; r < rows; ++r)
      for (uint64_t k = 0; k < c.width(); ++k) {
        CHECK(back.values[r * 4 + k] == whole_file.values[r * dim + c.begin + k]);
        for (size_t s = 0; s < 2; ++s)
          CHECK(back.state[(r * 2 + s) * 4 + k] ==
                whole_file.state[(r * 2 + s) * dim + c.begin + k]);
      }
  }
  PartitionMap striped(rows, 4, 2);
  for (int node = 0; node < 2; ++node) {
    ShardStore target(striped, node, dim, options);
    uint64_t taken = 0;
    for (const ShardFileData& f : files) taken += target.import_rows(view_of(f));
    CHECK(taken == target.owned_rows() * dim);
    for (int64_t row = 0; row < int64_t(rows); ++row) {
      if (!target.owns(row)) continue;
      float got[dim], want[dim];
      target.gather(&row, 1, got);
      whole.gather(&row, 1, want);
      CHECK(std::memcmp(got, want, sizeof got) == 0);
    }
  }
  // A node past dim holds no columns: an empty slice.
  ShardStore none(PartitionMap(rows, 1, 1), 0, 2, options, column_range(2, 4, 3));
  ShardFileData empty;
  none.export_rows(&empty);
  CHECK(empty.dim == 0);
  CHECK(empty.rows.empty());
}

TEST_CASE("coalesce sums duplicates within and across batches in a fixed order") {
  std::vector<int64_t> r0 = {5, 2, 5}, r1 = {2, 9};
  std::vector<float> v0 = {1, 10, 2, 20, 3, 30}, v1 = {4, 40, 5, 50};
  CoalescedRows out;
  coalesce({{r0.data(), 3, v0.data()}, {r1.data(), 2, v1.data()}}, 2, false, &out);
  CHECK(out.rows == std::vector<int64_t>{2, 5, 9});
  CHECK(out.values == std::vector<float>{2 + 4, 20 + 40, 1 + 3, 10 + 30, 5, 50});
  CHECK(RowPlan({{r0.data(), 3, nullptr}, {r1.data(), 2, nullptr}}, 2, false, 1, nullptr).rows() ==
        std::vector<int64_t>{2, 5, 9});

  std::vector<float> bad = {1, NAN, 2, 3, INFINITY, 0};
  std::vector<int64_t> rb = {1, 1, 4};
  CHECK(find_nonfinite_row(bad.data(), 3, 2) == 0);
  coalesce({{rb.data(), 3, bad.data()}}, 2, true, &out);
  CHECK(out.skipped == 2);
  CHECK(out.rows == std::vector<int64_t>{1});
  CHECK(out.values == std::vector<float>{2, 3});
  std::vector<int64_t> idx = {0, 3, -1, 4};
  CHECK(find_bad_index(idx.data(), 4, 4) == 2);
  CHECK(find_bad_index(idx.data(), 2, 4) == -1);
}

// Reference optimizers in double precision.
struct RefRow {
  std::vector<double> w, s1, s2;
};

void ref_apply(const SparseOptions& o, RefRow& r, const std::vector<double>& g, uint64_t t) {
  for (size_t c = 0; c < g.size(); ++c) {
    switch (o.optimizer) {
      case Optimizer::kSgd:
        r.w[c] -= o.learning_rate * g[c];
        break;
      case Optimizer::kAdagrad:
        r.s1[c] += g[c] * g[c];
        r.w[c] -= o.learning_rate * g[c] / (std::sqrt(r.s1[c]) + o.epsilon);
        break;
      case Optimizer::kAdam: {
        r.s1[c] = o.beta1 * r.s1[c] + (1 - o.beta1) * g[c];
        r.s2[c] = o.beta2 * r.s2[c] + (1 - o.beta2) * g[c] * g[c];
        double lr_t = o.learning_rate * std::sqrt(1 - std::pow(o.beta2, double(t))) /
                      (1 - std::pow(o.beta1, double(t)));
        r.w[c] -= lr_t * r.s1[c] / (std::sqrt(r.s2[c]) + o.epsilon);
        break;
      }
    }
  }
}

TEST_CASE(
    "row plans and sorted merges give coalesce's sums, bit for bit, plans scatter rows back") {
  // Random batches with many duplicates; values whose sum depends on the order.
  std::mt19937_64 rng(7);
  const size_t dim = 3;
  std::vector<std::vector<int64_t>> rows(4);
  std::vector<std::vector<float>> values(4);
  std::vector<RowBatch> batches;
  for (size_t b = 0; b < rows.size(); ++b) {
    for (int i = 0; i < 500; ++i) {
      rows[b].push_back(static_cast<int64_t>(rng() % 97));
      for (size_t c = 0; c < dim; ++c)
        values[b].push_back(
            std::ldexp(static_cast<float>(rng() % 1000) + 0.1f, static_cast<int>(rng() % 30) - 15));
    }
    batches.push_back({rows[b].data(), rows[b].size(), values[b].data()});
  }
  CoalescedRows whole;
  coalesce(batches, dim, false, &whole);

  // Grouped by row mod 3: each group holds its rows ascending, with the same sums.
  RowPlan plan(batches, dim, false, 3, [](int64_t r) { return static_cast<int>(r % 3); });
  REQUIRE(plan.unique_rows() == whole.rows.size());
  const std::vector<int64_t>& g_rows = plan.rows();
  std::vector<float> g_values(plan.unique_rows() * dim);
  for (int g : {2, 0, 1}) plan.sum_group(g, batches, g_values.data());
  for (int g = 0; g < 3; ++g) {
    for (size_t i = plan.group_begin(g); i < plan.group_begin(g + 1); ++i) {
      CHECK(g_rows[i] % 3 == g);
      if (i > plan.group_begin(g)) CHECK(g_rows[i] > g_rows[i - 1]);
      size_t at = static_cast<size_t>(
          std::lower_bound(whole.rows.begin(), whole.rows.end(), g_rows[i]) - whole.rows.begin());
      REQUIRE(at < whole.rows.size());
      for (size_t c = 0; c < dim; ++c) CHECK(g_values[i * dim + c] == whole.values[at * dim + c]);
    }
  }

  // The same plan sums other gradients for the same indices (a push after its pull), and
  // scatters rows back to every position that asked for them.
  CHECK(plan.matches(batches));
  std::vector<std::vector<float>> doubled(values);
  std::vector<RowBatch> doubled_batches = batches;
  for (size_t b = 0; b < batches.size(); ++b) {
    for (float& v : doubled[b]) v *= 2;
    doubled_batches[b].values = doubled[b].data();
  }
  std::vector<float> d_values(plan.unique_rows() * dim);
  for (int g = 0; g < 3; ++g) plan.sum_group(g, doubled_batches, d_values.data());
  for (size_t i = 0; i < d_values.size(); ++i) CHECK(d_values[i] == 2 * g_values[i]);
  std::vector<std::vector<float>> scattered(batches.size());
  std::vector<float*> outs;
  for (size_t b = 0; b < batches.size(); ++b) {
    scattered[b].assign(rows[b].size() * dim, -1);
    outs.push_back(scattered[b].data());
  }
  for (int g = 0; g < 3; ++g)
    plan.scatter_group(g, g_values.data() + plan.group_begin(g) * dim, outs.data());
  for (size_t b = 0; b < batches.size(); ++b) {
    for (size_t i = 0; i < rows[b].size(); ++i) {
      size_t at = static_cast<size_t>(
          std::lower_bound(g_rows.begin() + static_cast<std::ptrdiff_t>(
                                                plan.group_begin(static_cast<int>(rows[b][i] % 3))),
                           g_rows.begin() + static_cast<std::ptrdiff_t>(plan.group_begin(
                                                static_cast<int>(rows[b][i] % 3) + 1)),
                           rows[b][i]) -
          g_rows.begin());
      for (size_t c = 0; c < dim; ++c) CHECK(scattered[b][i * dim + c] == g_values[at * dim + c]);
    }
  }
  std::vector<int64_t> changed = rows[1];
  changed[7] = (changed[7] + 1) % 97;
  std::vector<RowBatch> other = batches;
  other[1].rows = changed.data();
  CHECK_FALSE(plan.matches(other));
  other.pop_back();
  CHECK_FALSE(plan.matches(other));

  // Merging each batch's own coalesced rows in batch order equals coalescing all of them.
  std::vector<CoalescedRows> each(batches.size());
  std::vector<RowBatch> sorted;
  for (size_t b = 0; b < batches.size(); ++b) {
    coalesce({batches[b]}, dim, false, &each[b]);
    sorted.push_back({each[b].rows.data(), each[b].rows.size(), each[b].values.data()});
  }
  CoalescedRows of_each;
  coalesce(sorted, dim, false, &of_each);
  std::vector<int64_t> merged_rows;
  std::vector<float> merged_values;
  CHECK(merge_sorted(sorted, dim, [&](int64_t row, float* sum) {
    merged_rows.push_back(row);
    merged_values.insert(merged_values.end(), sum, sum + dim);
  }));
  CHECK(merged_rows == of_each.rows);
  CHECK(merged_values == of_each.values);
  // Unsorted input is refused before anything is visited.
  int visited = 0;
  CHECK_FALSE(merge_sorted(batches, dim, [&](int64_t, float*) { ++visited; }));
  CHECK(visited == 0);
}

TEST_CASE("optimizers match the reference over steps that touch different rows") {
  for (Optimizer opt : {Optimizer::kSgd, Optimizer::kAdagrad, Optimizer::kAdam}) {
    CAPTURE(static_cast<int>(opt));
    SparseOptions o;
    o.optimizer = opt;
    o.learning_rate = opt == Optimizer::kSgd ? 0.1 : 0.01;
    o.initializer = Initializer::kUniform;
    o.init_seed = 3;
    const size_t dim = 3, rows = 10;
    ShardStore store(PartitionMap(rows, 2, 1), 0, dim, o);
    std::vector<RefRow> ref(rows);
    for (uint64_t r = 0; r < rows; ++r) {
      std::vector<float> init(dim);
      initial_row(o, r, dim, init.data());
      ref[r].w.assign(init.begin(), init.end());
      ref[r].s1.assign(dim, opt == Optimizer::kAdagrad ? o.initial_accumulator : 0.0);
      ref[r].s2.assign(dim, 0.0);
    }
    for (uint64_t step = 1; step <= 20; ++step) {
      std::vector<int64_t> touched = {int64_t(step % rows), int64_t((step * 3) % rows)};
      if (touched[0] == touched[1]) touched.pop_back();
      std::vector<float> grads;
      for (int64_t r : touched) {
        std::vector<double> g(dim);
        for (size_t c = 0; c < dim; ++c) {
          g[c] = std::sin(double(step * 7 + r * 3 + c));
          grads.push_back(float(g[c]));
        }
        ref_apply(o, ref[size_t(r)], g, step);
      }
      store.apply(touched.data(), touched.size(), grads.data(), step, o.learning_rate);
    }
    for (int64_t r = 0; r < int64_t(rows); ++r) {
      float got[dim];
      store.gather(&r, 1, got);
      for (size_t c = 0; c < dim; ++c)
        CHECK(got[c] == doctest::Approx(ref[size_t(r)].w[c]).epsilon(1e-5));
    }
  }
}

TEST_CASE("options validate and describe themselves") {
  SparseOptions o;
  std::string error;
  CHECK(o.validate(&error));
  CHECK(o.canonical() ==
        "sgd(lr=0.01) init=zeros sum sync partitions=auto route=hybrid "
        "nonfinite=reject");
  o.learning_rate = -1;
  CHECK_FALSE(o.validate(&error));
  CHECK(error.find("learning_rate") != std::string::npos);
  o.learning_rate = 0.1;
  o.staleness = 2;
  CHECK_FALSE(o.validate(&error));
  o.consistency = Consistency::kBounded;
  CHECK(o.validate(&error));
  // The alltoall route: its split is part of what workers must agree on; partitions are
  // one per node, and a split means nothing on the other routes.
  o.alltoall_split = Split::kColumns;
  CHECK_FALSE(o.validate(&error));
  CHECK(error.find("alltoall_split") != std::string::npos);
  o.route = Route::kAlltoall;
  CHECK(o.validate(&error));
  CHECK(o.canonical().find("route=alltoall(columns)") != std::string::npos);
  o.partitions = 4;
  CHECK_FALSE(o.validate(&error));
  CHECK(error.find("partitions") != std::string::npos);
  o.partitions = 0;
  o.alltoall_split = static_cast<Split>(2);
  CHECK_FALSE(o.validate(&error));
  // PX_ROUTE_AUTO: a move cuts the table between two synchronous steps; a 16-bit wire and
  // prefetch are accepted (the table then stays off the replicated routes).
  o.alltoall_split = Split::kRows;
  o.route = Route::kAuto;
  CHECK_FALSE(o.validate(&error));  // bounded, from above
  CHECK(error.find("PX_ROUTE_AUTO needs PX_SYNC") != std::string::npos);
  o.consistency = Consistency::kSync;
  o.staleness = 0;
  o.wire = WireDtype::kBf16;
  o.prefetch = true;
  CHECK(o.validate(&error));
  CHECK(o.canonical().find(" route=auto ") != std::string::npos);
}

}  // namespace
}  // namespace px
