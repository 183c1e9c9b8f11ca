// The owner side of a sparse variable on one node: its shard store, the consistency rules
// (when a pushed step is applied, when a pull may be served) and the order of shard work.
// Requests come from this node's router directly or from other nodes through the
// SparseChannel. Loop thread only; shard work runs through a SerialQueue.
//
// Routes: ps/hybrid hold this node's partitions and receive every node's pushes. The
// replicated routes hold the whole table on every node; a push step is exchanged with the
// other nodes by a collective (replicated_exchange.h), then every replica applies the
// identical update, in step order. alltoall by rows is ps with one partition per node;
// alltoall by columns holds every row's slice of columns (column_split.h): its pulls and
// pushes carry that many values per row, and the whole slice is one unit of steps.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/common/serial_queue.h"
#include "daemon/common/status_join.h"
#include "daemon/sparse/learning_rates.h"
#include "daemon/sparse/replicated_exchange.h"
#include "daemon/sparse/shard_replica.h"
#include "daemon/sparse/shard_request.h"
#include "parallax_c.h"
#include "sharding/checkpoint.h"
#include "sharding/handover.h"
#include "sharding/shard_store.h"
#include "sharding/step_journal.h"
#include "transport/collectives/collective_transport.h"
#include "transport/fabric/sparse_wire.h"

namespace px {

class ShardOwner {
 public:
  // map: the variable's partitioning (ps); replicated routes hold every row regardless.
  // initialise false: the rows are left for import_rows (ShardStore).
  ShardOwner(std::string label, const PartitionMap& map, int node, size_t dim,
             const SparseOptions& options, int world_size, ThreadPool& pool, PostToLoop post,
             bool initialise = true);

  // Cluster: the transport and cluster-wide id the replicated routes' collectives use.
  void attach(CollectiveTransport* fabric, uint32_t global_id, size_t chunk_bytes);

  void handle(ShardRequest request);

  // The job's state here is freed: drops the requests this owner keeps until a step
  // completes (waiting pulls, pushes waiting for other nodes', exchanged steps) without
  // answering them. Their callbacks refer back to the table (a remote request's to the
  // channel, which holds this owner; a local one's to its run, which holds the table), so
  // a job ended with steps unfinished would otherwise keep its shards allocated for good.
  void abandon();

  // Checkpoint files are <dir>/<job>.<variable>.node<i>.shard.
  // The names also go into its log lines' fields.
  void set_names(std::string job, std::string variable);
  // Takes this node's rows from a checkpoint (any node count or partitioning).
  bool restore(const std::string& dir, const ManifestData& manifest, std::string* error);

  // Moving the table to another route (route_move.cc). export_at: once every push step
  // before `steps` is applied here, this node's rows, values and optimizer state, as a
  // checkpoint's shard file holds them (done on the loop thread). import_rows: takes what
  // this owner holds from another owner's export; held_values: what it must take in all.
  // continue_from: a new owner goes on from the old one's cut: `steps` push (and pull) steps
  // counted from every node, `applies` optimizer applications (Adam's bias correction).
  void export_at(uint64_t steps, std::function<void(std::shared_ptr<ShardFileData>)> done);
  uint64_t import_rows(const ShardView& data) { return store_.import_rows(data); }
  uint64_t held_values() const { return store_.owned_rows() * dim_; }
  uint64_t applies() const;
  void continue_from(uint64_t steps, uint64_t applies);

  // A table handed to the job's next run at an epoch's end (sharding/handover.h). keep_journal:
  // from now on each partition keeps the pre-images of its last `depth` push steps (set
  // before the first step; not on the column-wise route). hand_over: this node's partitions
  // (a replicated route's: the whole table as partition 0 of 1), their rows once the work
  // queued before is done, with their push steps and journals (done on the loop).
  void keep_journal(size_t depth);
  void hand_over(std::function<void(std::vector<HandoverUnit>)> done);
  // Copies (px_sparse_options.replicas 2, shard_replica.h). keep_copy_of: this node keeps a
  // copy of `node`'s partitions under map (ps and hybrid; before the first step), which
  // restores, route moves and hand_over include. send_copies: after each push step, the
  // rows it changed go to send (on the loop), for the next node's copy.
  void keep_copy_of(const PartitionMap& map, int node, size_t journal_steps);
  using SendCopy =
      std::function<void(uint32_t partition, uint64_t step, std::shared_ptr<ReplicaRows> rows)>;
  void send_copies(SendCopy send) { send_copy_ = std::move(send); }
  ShardReplica* replica() { return replica_.get(); }

  // The table's learning rates by push step (px_set_sparse_lr); without, the registered one.
  void set_learning_rates(std::shared_ptr<const LearningRates> rates) { rates_ = std::move(rates); }
  // A hot-row cache (hot_row_cache.h): a read or checkpoint reaching this owner asks its
  // node to flush (hook(push steps), on the loop), and waits until every node's flush of
  // them is in. Set by the router where the table has caches (a cluster).
  void set_flush_hook(std::function<void(uint64_t)> hook) { flush_hook_ = std::move(hook); }
  bool replicated() const { return replicated_; }
  bool column_slice() const { return columns_; }
  uint64_t store_bytes() const { return store_.bytes(); }
  uint64_t owned_rows() const { return store_.owned_rows(); }
  uint64_t rows_applied() const { return rows_applied_; }
  uint64_t rows_served_ahead() const { return rows_served_ahead_; }
  uint64_t bytes_sent() const { return exchange_ ? exchange_->bytes_sent() : 0; }
  uint64_t bytes_received() const { return exchange_ ? exchange_->bytes_received() : 0; }

 private:
  // The step bookkeeping of one partition (ps/hybrid: pushes and pulls go per partition,
  // so each is applied as soon as every node's push of it is in) or, on the replicated
  // routes, of the whole table.
  struct Unit {
    uint64_t applied_steps = 0;            // sync: push steps applied (counted when queued)
    std::vector<uint64_t> pushes_by_node;  // push steps received (and queued) per node
    uint64_t applies = 0;                  // optimizer applications so far (Adam's step)
    std::map<uint64_t, std::vector<std::optional<ShardRequest>>> sync_pushes;
    // Prefetch (sync): pull steps received per node, and the rows every node pulled in
    // each step not yet applied (sorted and made unique when first needed).
    std::vector<uint64_t> pulls_by_node;
    std::map<uint64_t, std::vector<int64_t>> pulled;
    std::map<uint64_t, bool> pulled_sorted;
  };
  Unit* unit_of(const ShardRequest& r);
  bool split(ShardRequest& r, std::vector<ShardRequest>* parts, std::string* why);
  void handle_valid(ShardRequest r);
  void take_copy(ShardRequest r);  // a replicate request from the node this one copies
  // The rows (owned here) as a copy sends them: their values and state now (queue).
  void copy_rows(const int64_t* rows, size_t n, ReplicaRows* copy) const;
  bool valid(const ShardRequest& r, std::string* why);
  bool pull_ready(const Unit& unit, uint64_t step) const;
  // Prefetch: notes a pull's rows; whether pull `step` may be served ahead of push step-1.
  bool note_pull(Unit& unit, const ShardRequest& r);
  bool ahead_ready(const Unit& unit, uint64_t step) const;
  void serve_ahead(Unit& unit, ShardRequest r);
  bool applied_through(uint64_t step) const;  // every push step < step applied (or queued)
  bool ready(const ShardRequest& r);
  void write_checkpoint(ShardRequest r);
  // A node's held gradient sums (SparseOp::kFlush): applied now, not a step.
  void flush(ShardRequest r);
  bool flushed_through(uint64_t steps) const;
  void serve(ShardRequest r);
  void push(ShardRequest r);
  void apply_sync_steps(Unit& unit);
  // push_step: the push step the batches are (its learning rate, learning_rates.h).
  void apply(Unit& unit, std::vector<ShardRequest> batches, uint64_t push_step);
  void serve_ready_pulls();
  // Replicated routes: a push step's batches, every node's rows in.
  void exchanged(uint64_t step, std::vector<ShardRequest> batches);

  std::string label_;
  std::string job_, variable_;
  bool replicated_;
  bool columns_;  // column-wise alltoall: every row, some columns
  int node_;
  int node_count_;
  size_t table_dim_;
  size_t dim_;  // values per row held here (table_dim_ but on the column-wise route)
  SparseOptions options_;
  int world_size_;
  ShardStore store_;
  std::shared_ptr<SerialQueue> queue_;
  // Queue order makes later work see what was counted when it was queued.
  std::vector<Unit> units_;
  std::vector<StepJournal> journals_;  // by unit, with keep_journal; used on the queue only
  std::unique_ptr<ShardReplica> replica_;
  SendCopy send_copy_;
  std::vector<int32_t> unit_of_partition_;  // ps/hybrid: -1 where not owned
  std::vector<uint32_t> held_;              // ps/hybrid: the partitions held, ascending
  std::deque<ShardRequest> waiting_pulls_;
  std::unique_ptr<ReplicatedExchange> exchange_;             // replicated routes only
  std::map<uint64_t, std::vector<ShardRequest>> exchanged_;  // replicated: done, by step
  uint64_t rows_applied_ = 0;
  uint64_t rows_served_ahead_ = 0;
  std::shared_ptr<const LearningRates> rates_;
  PostToLoop post_;
  std::function<void(uint64_t)> flush_hook_;
  std::vector<uint64_t> flushed_by_node_;  // the push steps each node's flushes cover
};

}  // namespace px
