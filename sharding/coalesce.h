// Sparse gradient bookkeeping: index checks and coalescing (sort, unique, segment-sum;
// row_plan.h does the grouped kind a node's router needs). Order is fixed, so sums do not depend on
// timing: equal rows are summed in batch order, then position order within a batch; callers pass
// batches by worker (within a node) or by node (at a shard's owner).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace px {

struct RowBatch {
  const int64_t* rows = nullptr;
  size_t n = 0;
  const float* values = nullptr;  // n x dim, row-major; null where only rows are read
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

// Visits the union of batches whose rows are each strictly ascending, in row order, with
// each row's values summed in batch order (exactly what coalesce computes); sum may be
// modified by visit. Returns false and visits nothing if a batch is not strictly ascending.
// ahead, if set, hears of rows a few entries before they are visited (to prefetch them).
bool merge_sorted(const std::vector<RowBatch>& batches, size_t dim,
                  const std::function<void(int64_t row, float* sum)>& visit,
                  const std::function<void(int64_t row)>& ahead = nullptr);

// Position of the first index outside [0, limit), or -1.
int64_t find_bad_index(const int64_t* rows, size_t n, uint64_t limit);

// Position of the first row (of n x dim values) holding a NaN or Inf, or -1.
int64_t find_nonfinite_row(const float* values, size_t n, size_t dim);

}  // namespace px
