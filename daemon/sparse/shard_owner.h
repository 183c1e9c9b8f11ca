// The owner side of a sparse variable on one node: its shard store, the consistency rules
// (when a pushed step is applied, when a pull may be served) and the order of shard work.
// Requests come from this node's router directly or from other nodes through the
// SparseChannel. Loop thread only; shard work runs through a SerialQueue.
//
// Routes: ps/hybrid hold this node's partitions and receive every node's pushes. The
// replicated routes hold the whole table on every node; a push step is exchanged with the
// other nodes by a collective (allgatherv: the nodes' coalesced rows; allreduce: the
// gradient densified to rows x (dim + 1), the extra column counting who touched a row),
// then every replica applies the identical update.
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
#include "parallax_c.h"
#include "sharding/checkpoint.h"
#include "sharding/shard_store.h"
#include "transport/collectives/collective_transport.h"
#include "transport/fabric/sparse_wire.h"

namespace px {

struct ShardRequest {
  int from_node = 0;
  SparseOp op = SparseOp::kPull;
  // ps/hybrid pulls and pushes: with groups = 0 the partition they cover; otherwise group
  // `partition` of the `groups` this node's partitions are dealt into (request_groups.h),
  // which handle() splits into one request per partition.
  uint32_t partition = kAllPartitions;
  uint32_t groups = 0;
  uint64_t step = 0;
  size_t count = 0;
  const int64_t* rows = nullptr;
  const float* values = nullptr;  // push, load: count x dim
  float* out = nullptr;           // pull, read: count x dim
  size_t whole_count = 0;         // split from a group request of this many rows (0: not)
  // Called on the loop thread once done (not for pushes from other nodes: they get none).
  StatusCallback done;
  std::shared_ptr<void> keep_alive;  // owns rows / values / out
};

class ShardOwner {
 public:
  // map: the variable's partitioning (ps); replicated routes hold every row regardless.
  ShardOwner(std::string label, const PartitionMap& map, int node, size_t dim,
             const SparseOptions& options, int world_size, ThreadPool& pool, PostToLoop post);

  // Cluster: the transport and cluster-wide id the replicated routes' collectives use.
  void attach(CollectiveTransport* fabric, uint32_t global_id, size_t chunk_bytes);

  void handle(ShardRequest request);

  // Checkpoint files are <dir>/<job>.<variable>.node<i>.shard.
  void set_names(std::string job, std::string variable) {
    job_ = std::move(job);
    variable_ = std::move(variable);
  }
  // Takes this node's rows from a checkpoint (any node count or partitioning).
  bool restore(const std::string& dir, const ManifestData& manifest, std::string* error);

  bool replicated() const { return replicated_; }
  uint64_t store_bytes() const { return store_.bytes(); }
  uint64_t owned_rows() const { return store_.owned_rows(); }
  uint64_t rows_applied() const { return rows_applied_; }
  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t bytes_received() const { return bytes_received_; }

 private:
  // The step bookkeeping of one partition (ps/hybrid: pushes and pulls go per partition,
  // so each is applied as soon as every node's push of it is in) or, on the replicated
  // routes, of the whole table.
  struct Unit {
    uint64_t applied_steps = 0;            // sync: push steps applied (counted when queued)
    std::vector<uint64_t> pushes_by_node;  // push steps received (and queued) per node
    uint64_t applies = 0;                  // optimizer applications so far (Adam's step)
    std::map<uint64_t, std::vector<std::optional<ShardRequest>>> sync_pushes;
  };
  Unit* unit_of(const ShardRequest& r);
  bool split(ShardRequest& r, std::vector<ShardRequest>* parts, std::string* why);
  void handle_valid(ShardRequest r);
  bool valid(const ShardRequest& r, std::string* why);
  bool pull_ready(const Unit& unit, uint64_t step) const;
  bool applied_through(uint64_t step) const;  // every push step < step applied (or queued)
  bool ready(const ShardRequest& r);
  void write_checkpoint(ShardRequest r);
  void serve(ShardRequest r);
  void push(ShardRequest r);
  void apply_sync_steps(Unit& unit);
  void apply(Unit& unit, std::vector<ShardRequest> batches);
  void serve_ready_pulls();
  // Replicated routes.
  struct Exchange;
  void exchange(ShardRequest mine);
  void exchange_allgatherv(const std::shared_ptr<Exchange>& ex);
  void exchange_allreduce(const std::shared_ptr<Exchange>& ex);
  void exchanged(const std::shared_ptr<Exchange>& ex);

  std::string label_;
  std::string job_, variable_;
  bool replicated_;
  int node_;
  int node_count_;
  ThreadPool& pool_;
  PostToLoop post_;
  CollectiveTransport* fabric_ = nullptr;
  uint32_t global_id_ = 0;
  size_t chunk_bytes_ = 256 * 1024;
  size_t dim_;
  SparseOptions options_;
  int world_size_;
  ShardStore store_;
  std::shared_ptr<SerialQueue> queue_;
  // Queue order makes later work see what was counted when it was queued.
  std::vector<Unit> units_;
  std::vector<int32_t> unit_of_partition_;  // ps/hybrid: -1 where not owned
  std::vector<uint32_t> held_;              // ps/hybrid: the partitions held, ascending
  std::deque<ShardRequest> waiting_pulls_;
  std::map<uint64_t, std::shared_ptr<Exchange>> exchanged_;  // replicated: done, by step
  uint64_t rows_applied_ = 0;
  uint64_t bytes_sent_ = 0;
  uint64_t bytes_received_ = 0;
};

}  // namespace px
