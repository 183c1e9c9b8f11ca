// A copy of the previous node's partitions of a ps table (px_sparse_options.replicas = 2),
// kept so that the table survives that node's loss: its next run is handed the copy in
// place of the lost partitions (table_handover.cc, sharding/handover.h).
//
// The copy follows by state, not by operation: after a push step changes a partition, its
// owner sends the rows the step changed, values and optimizer state as they now are (a
// replicate request, sparse_wire.h), and the copy overwrites its rows with them. No
// optimizer runs twice, so the copy is the owner's bit for bit at each step it received;
// a copy is a step or so behind its owner while the rows are on the way, and the
// handover takes every partition back to a step all of them reached.
//
// Loop thread: check() and count(); the owner's queue: apply(), import and export (the
// owner runs them in order with its own work, so an export sees every copy counted).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/sparse/shard_request.h"
#include "sharding/handover.h"
#include "sharding/shard_store.h"
#include "sharding/step_journal.h"

namespace px {

// A replicate request's step that is not one: rows a load set (any of the owner's
// partitions; partition kAllPartitions), which the copy takes outside its steps.
constexpr uint64_t kLoadCopyStep = UINT64_MAX;

// The rows a push step changed, as its owner sends them to the copy: rows[n], then their
// values (n x dim), then their optimizer state (n x slots x dim).
struct ReplicaRows {
  std::vector<int64_t> rows;
  std::vector<float> values;
};

class ShardReplica {
 public:
  // The partitions `of_node` holds under map; journal_steps: the steps each keeps.
  ShardReplica(const PartitionMap& map, int of_node, size_t dim, const SparseOptions& options,
               size_t journal_steps);

  int of_node() const { return of_node_; }
  // A replicate request: from the node copied, a partition it holds, rows of it, the next
  // step of that partition (each step once, in order); or a load's rows of any partition
  // it holds (kLoadCopyStep). False with why otherwise.
  bool check(const ShardRequest& r, std::string* why) const;
  // Counts a checked request's step (loop), then apply() overwrites the rows (queue).
  void count(const ShardRequest& r);
  void apply(const ShardRequest& r);

  // A restore or a route move's rows (queue): the copy starts from them.
  uint64_t import_rows(const ShardView& data) { return store_.import_rows(data); }
  uint64_t held_values() const { return store_.owned_rows() * store_.dim(); }
  // The copied partitions as a handover's units (replica), their steps as counted when
  // the export was queued (counted()), on the queue. applies_offset: the optimizer
  // applications before the run's first step (its restore), as the owner counts them.
  std::vector<uint64_t> counted() const { return applied_; }
  std::vector<HandoverUnit> export_units(const std::vector<uint64_t>& applied,
                                         uint64_t applies_offset) const;
  // The run goes on from push step `steps` (a route move, the rows imported).
  void continue_from(uint64_t steps);

 private:
  int of_node_;
  size_t dim_, slots_;
  ShardStore store_;
  std::vector<uint32_t> held_;              // the partitions copied, ascending
  std::vector<int32_t> unit_of_partition_;  // -1 where not copied
  std::vector<uint64_t> applied_;           // by unit: steps counted (loop)
  std::vector<StepJournal> journals_;       // by unit (queue)
};

}  // namespace px
