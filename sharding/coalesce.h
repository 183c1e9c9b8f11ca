// Sparse gradient bookkeeping: index checks, coalescing (sort, unique, segment-sum) and
// index unions. Order is fixed, so sums do not depend on timing: equal rows are summed in
// batch order, then position order within a batch; callers pass batches by worker (within
// a node) or by node (at a shard's owner).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
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

// Coalescing split in two, so that a caller can send one group's sums (a group: the rows
// one node owns) while the next group is summed. The constructor sorts the entries by
// (group, row, batch, position) and counts unique rows; sum_group does the arithmetic.
// Output is group-major, rows ascending within a group. The batches' memory must outlive
// the object.
class GroupedCoalescer {
 public:
  GroupedCoalescer(const std::vector<RowBatch>& batches, size_t dim, bool skip_nonfinite,
                   int groups, const std::function<int(int64_t row)>& group_of);

  size_t unique_rows() const { return group_begin_.back(); }
  // Group g's rows sit at [group_begin(g), group_begin(g + 1)) of the output.
  size_t group_begin(int g) const { return group_begin_[static_cast<size_t>(g)]; }
  uint64_t skipped() const { return skipped_; }
  // Writes group g's unique rows and their sums at its place in rows and values (which
  // hold unique_rows() rows and unique_rows() x dim values). Groups may be summed from
  // different threads at once.
  void sum_group(int g, int64_t* rows, float* values) const;

 private:
  size_t dim_;
  uint64_t skipped_ = 0;
  std::vector<const float*> source_;              // by entry: its values
  std::vector<std::pair<int64_t, size_t>> keys_;  // (row, entry), group-major, sorted
  std::vector<size_t> key_begin_;                 // by group, into keys_
  std::vector<size_t> group_begin_;               // by group, into the output (unique rows)
};

// Visits the union of batches whose rows are each strictly ascending, in row order, with
// each row's values summed in batch order (exactly what coalesce computes); sum may be
// modified by visit. Returns false and visits nothing if a batch is not strictly ascending.
bool merge_sorted(const std::vector<RowBatch>& batches, size_t dim,
                  const std::function<void(int64_t row, float* sum)>& visit);

// The sorted, unique union of the batches' rows.
std::vector<int64_t> unique_rows(const std::vector<RowBatch>& batches);

// Position of the first index outside [0, limit), or -1.
int64_t find_bad_index(const int64_t* rows, size_t n, uint64_t limit);

// Position of the first row (of n x dim values) holding a NaN or Inf, or -1.
int64_t find_nonfinite_row(const float* values, size_t n, size_t dim);

}  // namespace px
