// Sparse gradient bookkeeping: index checks, coalescing (sort, unique, segment-sum) and
// index unions. Order is fixed, so sums do not depend on timing: equal rows are summed in
// batch order, then position order within a batch; callers pass batches by worker (within
// a node) or by node (at a shard's owner).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace px {

struct RowBatch {
  const int64_t* rows = nullptr;
  size_t n = 0;
  const float* values = nullptr;  // n x dim, row-major; may be null for unique_rows
};

struct CoalescedRows {
  std::vector<int64_t> rows;  // sorted, unique
  std::vector<float> values;  // rows.size() x dim
  uint64_t skipped = 0;       // entries dropped for a NaN/Inf value (skip_nonfinite)
};

// Sums the values of equal rows across all batches. With skip_nonfinite, entries whose
// values contain a NaN or Inf are dropped first (and counted).
void coalesce(const std::vector<RowBatch>& batches, size_t dim, bool skip_nonfinite,
              CoalescedRows* out);

// The sorted, unique union of the batches' rows.
std::vector<int64_t> unique_rows(const std::vector<RowBatch>& batches);

// Position of the first index outside [0, limit), or -1.
int64_t find_bad_index(const int64_t* rows, size_t n, uint64_t limit);

// Position of the first row (of n x dim values) holding a NaN or Inf, or -1.
int64_t find_nonfinite_row(const float* values, size_t n, size_t dim);

}  // namespace px
