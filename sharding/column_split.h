// The columns of a sparse table each node holds under the column-wise alltoall route
// (PX_SPLIT_COLUMNS): every row's columns [begin, end). Node i of N gets dim / N columns,
// one more on the first dim % N nodes, so widths differ by at most one; with dim < N the
// nodes from dim on hold nothing. Every node computes the same ranges from (dim, N).
#pragma once

#include <cstdint>
#include <vector>

namespace px {

struct ColumnRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t width() const { return end - begin; }
};

inline ColumnRange column_range(uint64_t dim, int nodes, int node) {
  uint64_t n = static_cast<uint64_t>(nodes < 1 ? 1 : nodes), i = static_cast<uint64_t>(node);
  uint64_t base = dim / n, extra = dim % n;
  uint64_t begin = i * base + (i < extra ? i : extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

inline std::vector<ColumnRange> column_ranges(uint64_t dim, int nodes) {
  std::vector<ColumnRange> out;
  for (int i = 0; i < nodes; ++i) out.push_back(column_range(dim, nodes, i));
  return out;
}

}  // namespace px
