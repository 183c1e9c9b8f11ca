// One request to a node's shards of a sparse variable (from this node's router, or from
// another node through the SparseChannel), and a batch of rows inside the owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "daemon/common/status_join.h"
#include "sharding/checkpoint.h"
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
  // Pulls from other nodes (the channel sets it): called once, before done, with the
  // positions of the rows not yet in out (empty: every row comes by done). With prefetch
  // the rows no node pulled in the previous step are served ahead of its push (its
  // reply can leave at once), the others by done.
  std::function<void(std::vector<size_t> pending)> early;
  // The owner's own: served ahead, these positions are still to be gathered.
  bool served_ahead = false;
  std::vector<size_t> pending;
  std::shared_ptr<void> keep_alive;  // owns rows / values / out
  // A checkpoint made in memory (ShardOwner::export_at): the rows go here, not to a file.
  std::shared_ptr<ShardFileData> exported;
};

}  // namespace px
