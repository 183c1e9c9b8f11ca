// Row -> partition -> node.
//
// Rows are striped cyclically (partition = row % P): vocabularies are usually numbered by
// frequency, so under Zipf-skewed lookups the hot head is rows 0..k; contiguous ranges
// would put the whole head on one partition (and one node's link), striping spreads it
// evenly. A hash would spread it too, but striping is as even on the head, keeps each
// partition's rows in one dense array indexed by row / P, and costs a division.
//
// Partitions go to nodes greedily by bytes, largest first, each to the node with the fewest
// bytes so far (ties: lower index), as Parallax does. The map depends only on (rows, P,
// nodes), so every node computes the same one.
#pragma once

#include <cstdint>
#include <vector>

namespace px {

class PartitionMap {
 public:
  PartitionMap() = default;
  PartitionMap(uint64_t rows, uint32_t partitions, int nodes);

  uint64_t rows() const { return rows_; }
  uint32_t partitions() const { return partitions_; }
  int nodes() const { return nodes_; }

  uint32_t partition_of(uint64_t row) const { return static_cast<uint32_t>(row % partitions_); }
  uint64_t local_index(uint64_t row) const { return row / partitions_; }
  uint64_t rows_in(uint32_t partition) const {
    return partition < rows_ % partitions_ ? rows_ / partitions_ + 1 : rows_ / partitions_;
  }
  int node_of_partition(uint32_t partition) const { return owner_[partition]; }
  int owner(uint64_t row) const { return owner_[partition_of(row)]; }
  // The partitions a node owns, in increasing order.
  std::vector<uint32_t> partitions_of(int node) const;

 private:
  uint64_t rows_ = 0;
  uint32_t partitions_ = 1;
  int nodes_ = 1;
  std::vector<int> owner_;
};

// The partition count used when the options say 0 (automatic): kAutomaticPartitionsPerNode
// per node, fewer for tables of fewer rows.
constexpr uint32_t kAutomaticPartitionsPerNode = 8;
uint32_t automatic_partitions(uint64_t rows, int nodes);

}  // namespace px
