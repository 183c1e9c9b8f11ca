// Deterministic, skewed row lookups for the sparse scenarios of the test worker: every
// worker can recompute every rank's batch of every step, which the references need.
#pragma once

#include <cstdint>
#include <vector>

#include "parallax_c.h"
#include "sharding/initializer.h"

namespace pxt {

// splitmix64's finaliser: a well-mixed 64-bit value of x.
inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// `count` rows of rank's batch at step, row = rows * t^power for t uniform in [0, 1): low
// rows are hot (the more so the higher the power), so batches repeat rows within and across
// workers, as Zipf-skewed lookups do.
inline std::vector<int64_t> skewed_lookups(int rank, uint64_t step, uint64_t rows, uint64_t count,
                                           int power) {
  std::vector<int64_t> idx(count);
  for (uint64_t j = 0; j < count; ++j) {
    double t = double(mix(uint64_t(rank) * 1000003 + step * 7919 + j) % 100000) / 100000.0;
    double skewed = 1;
    for (int p = 0; p < power; ++p) skewed *= t;
    idx[j] = int64_t(double(rows) * skewed);
  }
  return idx;
}

// The table a uniform initializer of o (seed, low, high) gives rows x dim, as the daemons
// compute it, in double: where the scenarios' references start.
inline std::vector<double> initial_uniform_table(const px_sparse_options& o, uint64_t rows,
                                                 uint64_t dim) {
  px::SparseOptions init;
  init.initializer = px::Initializer::kUniform;
  init.init_seed = o.init_seed;
  init.init_low = o.init_low;
  init.init_high = o.init_high;
  std::vector<double> table;
  table.reserve(rows * dim);
  std::vector<float> row(dim);
  for (uint64_t r = 0; r < rows; ++r) {
    px::initial_row(init, r, dim, row.data());
    table.insert(table.end(), row.begin(), row.end());
  }
  return table;
}

}  // namespace pxt
