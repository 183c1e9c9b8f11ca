// How a node cuts its pulls and pushes of a ps/hybrid table into requests. Each node's
// partitions (ascending) are dealt into K groups, the partition at position i going to group
// i mod K, and one request carries one group. Shards store, count and apply steps per
// partition whatever K is, so K can change from one step to the next without moving a row;
// the automatic partition search (partition_search.h) times steps at several K.
//
// Within a group, rows are ordered by partition, then by row: each partition's rows are
// one contiguous run the owner can hand to that partition without copying.
#pragma once

#include <cstdint>
#include <vector>

#include "sharding/partition_map.h"
#include "sharding/row_plan.h"

namespace px {

class RequestGroups {
 public:
  // per_node: K, the groups a node's partitions are dealt into (fewer where it holds fewer).
  RequestGroups(const PartitionMap& map, uint32_t per_node);

  uint32_t per_node() const { return per_node_; }
  int count() const { return static_cast<int>(node_.size()); }  // requests per step: P in t(P)
  int group_of_row(uint64_t row) const { return group_of_partition_[map_.partition_of(row)]; }
  int node(int group) const { return node_[static_cast<size_t>(group)]; }
  // The group's number among its node's groups, and how many groups that node has: what a
  // request names (the owner finds the partitions with partitions_in_group).
  uint32_t index(int group) const { return index_[static_cast<size_t>(group)]; }
  uint32_t groups_on(int node) const { return groups_on_[static_cast<size_t>(node)]; }
  RowOrder row_order() const { return {map_.partitions(), stride_}; }

 private:
  PartitionMap map_;
  uint32_t per_node_;
  uint64_t stride_;
  std::vector<int> group_of_partition_;
  std::vector<int> node_;
  std::vector<uint32_t> index_;
  std::vector<uint32_t> groups_on_;
};

// The partitions of group `index` when `held` (ascending) is dealt into `groups` groups.
std::vector<uint32_t> partitions_in_group(const std::vector<uint32_t>& held, uint32_t groups,
                                          uint32_t index);

}  // namespace px
