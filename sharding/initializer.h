// Initial values of a sparse table. Each value is a pure function of (seed, row, column),
// so a table initialises identically on any number of nodes and partitions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "sharding/sparse_spec.h"

namespace px {

// Fills out[0..dim) with row's initial values.
void initial_row(const SparseOptions& options, uint64_t row, size_t dim, float* out);
// Fills out[0..width) with the row's columns [begin, begin + width) of a dim-wide table.
void initial_row_columns(const SparseOptions& options, uint64_t row, size_t dim, size_t begin,
                         size_t width, float* out);

}  // namespace px
