#include "sharding/request_groups.h"

#include <algorithm>

namespace px {

RequestGroups::RequestGroups(const PartitionMap& map, uint32_t per_node)
    : map_(map),
      per_node_(std::max<uint32_t>(1, per_node)),
      stride_((map.rows() + map.partitions() - 1) / map.partitions()),
      group_of_partition_(map.partitions(), 0),
      groups_on_(static_cast<size_t>(map.nodes()), 0) {
  for (int n = 0; n < map.nodes(); ++n) {
    std::vector<uint32_t> held = map.partitions_of(n);
    uint32_t groups = std::min<uint32_t>(per_node_, static_cast<uint32_t>(held.size()));
    groups_on_[static_cast<size_t>(n)] = groups;
    int first = static_cast<int>(node_.size());
    for (uint32_t j = 0; j < groups; ++j) {
      node_.push_back(n);
      index_.push_back(j);
    }
    for (size_t i = 0; i < held.size(); ++i)
      group_of_partition_[held[i]] = first + static_cast<int>(i % groups);
  }
}

std::vector<uint32_t> partitions_in_group(const std::vector<uint32_t>& held, uint32_t groups,
                                          uint32_t index) {
  std::vector<uint32_t> out;
  for (size_t i = index; groups > 0 && i < held.size(); i += groups) out.push_back(held[i]);
  return out;
}

}  // namespace px
