// Where the rows of a node's workers go: the union of their indices grouped by the request
// that carries each row (ordered within a group as RowOrder says), and for every index its group,
// slot and (worker batch, position). A pull sends each group's rows to its owner and scatters the
// reply through the plan; a push sums its gradients through it. A training step pulls and then
// pushes the same indices, so the push reuses the pull's plan when its indices match (matches())
// instead of sorting them again.
//
// Sums follow coalesce's fixed order: equal rows in batch order, then position order, so
// results do not depend on timing or on which plan summed them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "sharding/coalesce.h"

namespace px {

// The order of rows within a group: by row % stripes, then by row / stripes. With stripes =
// P (partition = row mod P) each partition's rows sit together; stripes = 1 is ascending.
struct RowOrder {
  uint64_t stripes = 1;
  uint64_t stride = 0;  // > the largest row / stripes
  int64_t key(int64_t row) const {
    if (stripes <= 1) return row;
    auto r = static_cast<uint64_t>(row);
    return static_cast<int64_t>(r % stripes * stride + r / stripes);
  }
  int64_t row(int64_t key) const {
    if (stripes <= 1) return key;
    auto k = static_cast<uint64_t>(key);
    return static_cast<int64_t>(k % stride * stripes + k / stride);
  }
};

class RowPlan {
 public:
  // Reads the batches' rows (and, with skip_nonfinite, their values: entries holding a NaN
  // or Inf are left out and counted). group_of is called once per entry; rows within a
  // group follow order.
  RowPlan(const std::vector<RowBatch>& batches, size_t dim, bool skip_nonfinite, int groups,
          const std::function<int(int64_t row)>& group_of, RowOrder order = {});

  size_t unique_rows() const { return rows_.size(); }
  size_t group_count() const { return group_begin_.size() - 1; }
  // Group g's rows sit at [group_begin(g), group_begin(g + 1)) of rows() and of the
  // values a pull receives or a push sends.
  size_t group_begin(int g) const { return group_begin_[static_cast<size_t>(g)]; }
  // Indices (duplicates counted) that fall in group g.
  size_t group_entries(int g) const {
    return key_begin_[static_cast<size_t>(g) + 1] - key_begin_[static_cast<size_t>(g)];
  }
  const std::vector<int64_t>& rows() const { return rows_; }
  uint64_t skipped() const { return skipped_; }

  // True when batches hold exactly the indices the plan was made from, nothing skipped.
  bool matches(const std::vector<RowBatch>& batches) const;

  // Push: group g's sums of batches[b].values into values (unique_rows() x dim, whole).
  // Groups may be summed from different threads at once.
  void sum_group(int g, const std::vector<RowBatch>& batches, float* values) const;
  // Pull: copies group g's rows from group_rows (that group's rows only, in plan order) to
  // every position that asked for them; outs[b] holds batch b's n x dim values.
  void scatter_group(int g, const float* group_rows, float* const* outs) const;

 private:
  size_t dim_;
  uint64_t skipped_ = 0;
  // (order key of the row, batch << 32 | position), group-major, sorted within each group.
  std::vector<std::pair<int64_t, uint64_t>> keys_;
  std::vector<size_t> key_begin_;    // by group, into keys_
  std::vector<size_t> group_begin_;  // by group, into rows_
  std::vector<int64_t> rows_;
  std::vector<std::vector<int64_t>> indices_;  // the batches' rows, for matches()
};

}  // namespace px
