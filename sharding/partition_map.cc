#include "sharding/partition_map.h"

#include <algorithm>
#include <numeric>

namespace px {

PartitionMap::PartitionMap(uint64_t rows, uint32_t partitions, int nodes)
    : rows_(rows),
      partitions_(
          static_cast<uint32_t>(std::max<uint64_t>(1, std::min<uint64_t>(partitions, rows)))),
      nodes_(std::max(1, nodes)),
      owner_(partitions_, 0) {
  std::vector<uint32_t> order(partitions_);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [this](uint32_t a, uint32_t b) { return rows_in(a) > rows_in(b); });
  std::vector<uint64_t> load(static_cast<size_t>(nodes_), 0);
  for (uint32_t p : order) {
    int least = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner_[p] = least;
    load[static_cast<size_t>(least)] += rows_in(p);
  }
}

std::vector<uint32_t> PartitionMap::partitions_of(int node) const {
  std::vector<uint32_t> out;
  for (uint32_t p = 0; p < partitions_; ++p)
    if (owner_[p] == node) out.push_back(p);
  return out;
}

uint32_t automatic_partitions(uint64_t rows, int nodes) {
  // Storage only: how many of these a step's requests carry together is timed per table
  // (partition_search.h), so the count is the finest grain that search may pick
  // (measured steps got slower beyond; README, "Partitioning"). A multiple of N keeps
  // striped rows even across nodes.
  uint64_t wanted =
      uint64_t{kAutomaticPartitionsPerNode} * static_cast<uint64_t>(std::max(1, nodes));
  return static_cast<uint32_t>(std::max<uint64_t>(1, std::min<uint64_t>(rows, wanted)));
}

}  // namespace px
