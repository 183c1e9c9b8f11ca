#include "daemon/sparse/shard_replica.h"

#include <cstring>

namespace px {

ShardReplica::ShardReplica(const PartitionMap& map, int of_node, size_t dim,
                           const SparseOptions& options, size_t journal_steps)
    : of_node_(of_node),
      dim_(dim),
      store_(map, of_node, dim, options),
      held_(map.partitions_of(of_node)),
      unit_of_partition_(map.partitions(), -1) {
  slots_ = store_.state_slots();
  for (size_t i = 0; i < held_.size(); ++i) unit_of_partition_[held_[i]] = static_cast<int32_t>(i);
  applied_.assign(held_.size(), 0);
  journals_.assign(held_.size(), StepJournal(dim_, slots_, journal_steps));
}

bool ShardReplica::check(const ShardRequest& r, std::string* why) const {
  if (r.from_node != of_node_) {
    *why = "a copy of node " + std::to_string(r.from_node) + "'s rows; this node copies node " +
           std::to_string(of_node_) + "'s";
    return false;
  }
  if (r.step == kLoadCopyStep) {
    for (size_t i = 0; i < r.count; ++i)
      if (!store_.owns(r.rows[i])) {
        *why = "a load's row " + std::to_string(r.rows[i]) + ", which node " +
               std::to_string(of_node_) + " does not hold";
        return false;
      }
    return true;
  }
  if (r.partition >= unit_of_partition_.size() || unit_of_partition_[r.partition] < 0) {
    *why = "a copy of partition " + std::to_string(r.partition) + ", which node " +
           std::to_string(of_node_) + " does not hold";
    return false;
  }
  uint64_t next = applied_[static_cast<size_t>(unit_of_partition_[r.partition])];
  if (r.step != next) {
    *why = "a copy of partition " + std::to_string(r.partition) + " after push step " +
           std::to_string(r.step) + ", but step " + std::to_string(next) + " was next";
    return false;
  }
  for (size_t i = 0; i < r.count; ++i)
    if (!store_.owns(r.rows[i]) || store_.partition_of(r.rows[i]) != r.partition) {
      *why = "row " + std::to_string(r.rows[i]) + " is not in partition " +
             std::to_string(r.partition);
      return false;
    }
  return true;
}

void ShardReplica::count(const ShardRequest& r) {
  if (r.step == kLoadCopyStep) return;
  applied_[static_cast<size_t>(unit_of_partition_[r.partition])] = r.step + 1;
}

void ShardReplica::apply(const ShardRequest& r) {
  if (r.step == kLoadCopyStep) {
    // As at the owner: rows changed outside a step, so no journal leads back past them.
    for (StepJournal& journal : journals_) journal.clear();
    const float* state = r.values + r.count * dim_;
    for (size_t i = 0; i < r.count; ++i)
      store_.overwrite(r.rows[i], r.values + i * dim_, state + i * slots_ * dim_);
    return;
  }
  StepJournal& journal = journals_[static_cast<size_t>(unit_of_partition_[r.partition])];
  journal.begin(r.step);
  const float* values = r.values;
  const float* state = r.values + r.count * dim_;
  for (size_t i = 0; i < r.count; ++i) {
    int64_t row = r.rows[i];
    journal.save(row, store_.values_of(row), store_.state_of(row));
    store_.overwrite(row, values + i * dim_, state + i * slots_ * dim_);
  }
}

std::vector<HandoverUnit> ShardReplica::export_units(const std::vector<uint64_t>& applied,
                                                     uint64_t applies_offset) const {
  std::vector<HandoverUnit> units(held_.size());
  for (size_t i = 0; i < held_.size(); ++i) {
    units[i].partition = held_[i];
    units[i].replica = true;
    units[i].applied = applied[i];
    units[i].applies = applies_offset + applied[i];
    store_.export_partition(held_[i], &units[i].rows);
    units[i].journal = journals_[i].records();
  }
  return units;
}

void ShardReplica::continue_from(uint64_t steps) {
  // (The journals start over by themselves: the next step does not follow their last.)
  applied_.assign(held_.size(), steps);
}

}  // namespace px
