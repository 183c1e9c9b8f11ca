// The owner side of a sparse variable on one node: its shard store, the consistency rules
// (when a pushed step is applied, when a pull may be served) and the order of shard work.
// Requests come from this node's router directly or from other nodes through the
// SparseChannel. Loop thread only; shard work runs through a SerialQueue.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallax_c.h"
#include "serial_queue.h"
#include "shard_store.h"
#include "sparse_wire.h"

namespace px {

struct ShardRequest {
  int from_node = 0;
  SparseOp op = SparseOp::kPull;
  uint64_t step = 0;
  size_t count = 0;
  const int64_t* rows = nullptr;
  const float* values = nullptr;  // push, load: count x dim
  float* out = nullptr;           // pull, read: count x dim
  // Called on the loop thread once done (not for pushes from other nodes: they get none).
  std::function<void(px_status status, const std::string& error)> done;
  std::shared_ptr<void> keep_alive;  // owns rows / values / out
};

class ShardOwner {
 public:
  ShardOwner(std::string label, const PartitionMap& map, int node, size_t dim,
             const SparseOptions& options, int world_size, ThreadPool& pool,
             SerialQueue::PostToLoop post);

  void handle(ShardRequest request);

  uint64_t applied_steps() const { return applied_steps_; }
  uint64_t store_bytes() const { return store_.bytes(); }
  uint64_t owned_rows() const { return store_.owned_rows(); }

 private:
  bool valid(const ShardRequest& r, std::string* why) const;
  bool pull_ready(uint64_t step) const;
  void serve(ShardRequest r);
  void push(ShardRequest r);
  void apply_sync_steps();
  void apply(std::vector<ShardRequest> batches);
  void serve_ready_pulls();

  std::string label_;
  int node_count_;
  size_t dim_;
  SparseOptions options_;
  int world_size_;
  ShardStore store_;
  std::shared_ptr<SerialQueue> queue_;
  // sync: push steps applied (counted when queued: queue order makes later work see them)
  uint64_t applied_steps_ = 0;
  std::vector<uint64_t> pushes_by_node_;  // push steps received (and queued) per node
  uint64_t applies_ = 0;                  // optimizer applications so far (Adam's step)
  std::map<uint64_t, std::vector<std::optional<ShardRequest>>> sync_pushes_;
  std::deque<ShardRequest> waiting_pulls_;
};

}  // namespace px
