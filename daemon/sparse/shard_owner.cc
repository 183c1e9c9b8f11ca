#include "daemon/sparse/shard_owner.h"

#include <algorithm>
#include <cstring>

#include "daemon/common/log.h"
#include "daemon/common/loop_thread.h"
#include "daemon/common/status_join.h"
#include "sharding/coalesce.h"
#include "sharding/request_groups.h"
#include "transport/collectives/ring_allgatherv.h"
#include "transport/collectives/ring_allreduce.h"

namespace px {
namespace {

// Shard work above this many values goes to the pool.
constexpr size_t kInlineValues = 32 * 1024;

}  // namespace

ShardOwner::ShardOwner(std::string label, const PartitionMap& map, int node, size_t dim,
                       const SparseOptions& options, int world_size, ThreadPool& pool,
                       PostToLoop post)
    : label_(std::move(label)),
      replicated_(options.route == Route::kAllgatherv || options.route == Route::kAllreduce),
      node_(node),
      node_count_(map.nodes()),
      pool_(pool),
      post_(post),
      dim_(dim),
      options_(options),
      world_size_(world_size),
      store_(replicated_ ? PartitionMap(map.rows(), 1, 1) : map, replicated_ ? 0 : node, dim,
             options),
      queue_(std::make_shared<SerialQueue>(pool, std::move(post))) {
  if (replicated_) {
    units_.resize(1);
  } else {
    unit_of_partition_.assign(map.partitions(), -1);
    held_ = map.partitions_of(node);
    for (uint32_t p : held_) {
      unit_of_partition_[p] = static_cast<int32_t>(units_.size());
      units_.emplace_back();
    }
  }
  for (Unit& u : units_) u.pushes_by_node.assign(static_cast<size_t>(node_count_), 0);
}

ShardOwner::Unit* ShardOwner::unit_of(const ShardRequest& r) {
  if (replicated_) return &units_[0];
  if (r.partition >= unit_of_partition_.size() || unit_of_partition_[r.partition] < 0)
    return nullptr;
  return &units_[static_cast<size_t>(unit_of_partition_[r.partition])];
}

void ShardOwner::attach(CollectiveTransport* fabric, uint32_t global_id, size_t chunk_bytes) {
  PX_ASSERT_LOOP_THREAD();
  fabric_ = fabric;
  global_id_ = global_id;
  chunk_bytes_ = chunk_bytes;
}

bool ShardOwner::valid(const ShardRequest& r, std::string* why) {
  if (r.from_node < 0 || r.from_node >= node_count_) {
    *why = "unknown node " + std::to_string(r.from_node);
    return false;
  }
  bool step = r.op == SparseOp::kPull || r.op == SparseOp::kPush;
  Unit* unit = step ? unit_of(r) : nullptr;
  if (step && !unit) {
    *why = r.partition == kAllPartitions
               ? std::string("a step that names no partition")
               : "partition " + std::to_string(r.partition) + " is not held by this node";
    return false;
  }
  bool one_partition = !replicated_ && r.partition != kAllPartitions;
  for (size_t i = 0; i < r.count && r.op != SparseOp::kCheckpoint; ++i) {
    if (r.rows[i] < 0 || !store_.owns(r.rows[i]) ||
        (one_partition && store_.partition_of(r.rows[i]) != r.partition)) {
      *why = "row " + std::to_string(r.rows[i]) + " is not held by this node" +
             (one_partition ? " in partition " + std::to_string(r.partition) : "");
      return false;
    }
  }
  if (r.op == SparseOp::kPush && r.step != unit->pushes_by_node[static_cast<size_t>(r.from_node)]) {
    *why = "push step " + std::to_string(r.step) + " arrived but step " +
           std::to_string(unit->pushes_by_node[static_cast<size_t>(r.from_node)]) + " was next";
    return false;
  }
  return true;
}

void ShardOwner::handle(ShardRequest r) {
  PX_ASSERT_LOOP_THREAD();
  std::string why;
  std::vector<ShardRequest> parts;
  bool ok = true;
  if (r.groups > 0 && !replicated_) {
    ok = split(r, &parts, &why);
    for (size_t i = 0; ok && i < parts.size(); ++i) ok = valid(parts[i], &why);
  } else {
    ok = valid(r, &why);
  }
  if (!ok) {
    PX_LOG_ERROR("%s: refusing a %s request from node %d: %s", label_.c_str(), sparse_op_name(r.op),
                 r.from_node, why.c_str());
    if (r.done) r.done(PX_ERR_PROTOCOL, why);
    return;
  }
  if (parts.empty()) return handle_valid(std::move(r));
  if (r.op == SparseOp::kPush) {
    for (auto& part : parts) handle_valid(std::move(part));
    if (r.done) r.done(PX_OK, "");
    return;
  }
  // A pull of a group is answered once every partition of it served its part.
  StatusCallback answered = join_statuses(parts.size(), std::move(r.done));
  for (auto& part : parts) {
    part.done = answered;
    handle_valid(std::move(part));
  }
}

// A group's rows come partition by partition (ascending, as partitions_in_group lists them),
// so each partition's part is a contiguous run of the request: no copy.
bool ShardOwner::split(ShardRequest& r, std::vector<ShardRequest>* parts, std::string* why) {
  if (r.op != SparseOp::kPull && r.op != SparseOp::kPush) {
    *why = std::string("a ") + sparse_op_name(r.op) + " request names a partition group";
    return false;
  }
  if (r.groups > held_.size() || r.partition >= r.groups) {
    *why = "group " + std::to_string(r.partition) + " of " + std::to_string(r.groups) +
           " named, this node holds " + std::to_string(held_.size()) + " partitions";
    return false;
  }
  size_t i = 0;
  for (uint32_t p : partitions_in_group(held_, r.groups, r.partition)) {
    size_t begin = i;
    while (i < r.count && r.rows[i] >= 0 && store_.partition_of(r.rows[i]) == p) ++i;
    ShardRequest part;
    part.from_node = r.from_node;
    part.op = r.op;
    part.partition = p;
    part.step = r.step;
    part.count = i - begin;
    part.rows = r.rows + begin;
    if (r.values) part.values = r.values + begin * dim_;
    if (r.out) part.out = r.out + begin * dim_;
    part.whole_count = r.count;
    part.keep_alive = r.keep_alive;
    parts->push_back(std::move(part));
  }
  if (i < r.count) {
    *why = "row " + std::to_string(r.rows[i]) + " at position " + std::to_string(i) +
           " is not in order in group " + std::to_string(r.partition) + " of " +
           std::to_string(r.groups) + " of this node's partitions";
    return false;
  }
  return true;
}

void ShardOwner::handle_valid(ShardRequest r) {
  switch (r.op) {
    case SparseOp::kPull:
      if (!pull_ready(*unit_of(r), r.step)) {
        waiting_pulls_.push_back(std::move(r));
        return;
      }
      return serve(std::move(r));
    case SparseOp::kRead:
      return serve(std::move(r));
    case SparseOp::kCheckpoint:
      if (!ready(r)) {
        waiting_pulls_.push_back(std::move(r));
        return;
      }
      return write_checkpoint(std::move(r));
    case SparseOp::kPush:
      return push(std::move(r));
    case SparseOp::kLoad: {
      auto shared = std::make_shared<ShardRequest>(std::move(r));
      queue_->push(
          shared->count * dim_ > kInlineValues,
          [this, shared] { store_.load(shared->rows, shared->count, shared->values); },
          [shared] { shared->done(PX_OK, ""); });
      return;
    }
  }
}

bool ShardOwner::pull_ready(const Unit& unit, uint64_t step) const {
  switch (options_.consistency) {
    case Consistency::kSync:
      return unit.applied_steps >= step;
    case Consistency::kAsync:
      return true;
    case Consistency::kBounded: {
      if (step <= options_.staleness) return true;
      uint64_t slowest = *std::min_element(unit.pushes_by_node.begin(), unit.pushes_by_node.end());
      return slowest >= step - options_.staleness;
    }
  }
  return true;
}

bool ShardOwner::applied_through(uint64_t step) const {
  for (const Unit& u : units_) {
    if (replicated_ || options_.consistency == Consistency::kSync) {
      if (u.applied_steps < step) return false;
    } else if (*std::min_element(u.pushes_by_node.begin(), u.pushes_by_node.end()) < step) {
      return false;
    }
  }
  return true;
}

bool ShardOwner::ready(const ShardRequest& r) {
  return r.op == SparseOp::kCheckpoint ? applied_through(r.step) : pull_ready(*unit_of(r), r.step);
}

// Runs after every push the requester made (and the work queued before it): a consistent cut.
void ShardOwner::write_checkpoint(ShardRequest r) {
  auto shared = std::make_shared<ShardRequest>(std::move(r));
  std::string dir(reinterpret_cast<const char*>(shared->rows), shared->count * sizeof(int64_t));
  dir.resize(strnlen(dir.c_str(), dir.size()));
  std::string path =
      checkpoint_stem(dir, job_, variable_) + ".node" + std::to_string(node_) + ".shard";
  auto status = std::make_shared<px_status>(PX_OK);
  queue_->push(
      true,
      [this, path, status] {
        ShardFileData data;
        store_.export_rows(&data);
        std::string error;
        if (!write_shard_file(path, data, &error)) {
          PX_LOG_ERROR("%s: checkpoint: %s", label_.c_str(), error.c_str());
          *status = PX_ERR_INVALID;
        }
      },
      [this, shared, status, path] {
        if (*status == PX_OK)
          PX_LOG_INFO("%s: checkpoint written to %s", label_.c_str(), path.c_str());
        shared->done(*status, "");
      });
}

bool ShardOwner::restore(const std::string& dir, const ManifestData& manifest, std::string* error) {
  if (manifest.dim != dim_ || manifest.state_slots != store_.state_slots()) {
    *error = "the checkpoint has dim " + std::to_string(manifest.dim) + " and " +
             std::to_string(manifest.state_slots) + " optimizer state slots, the variable " +
             std::to_string(dim_) + " and " + std::to_string(store_.state_slots());
    return false;
  }
  uint64_t taken = 0;
  for (const std::string& file : manifest.shard_files) {
    ShardFileData data;
    if (!read_shard_file(dir + "/" + file, &data, error)) return false;
    if (data.dim != dim_ || data.slots != store_.state_slots()) {
      *error = dir + "/" + file + " does not match its manifest";
      return false;
    }
    taken += store_.import_rows(data);
  }
  if (taken != store_.owned_rows()) {
    *error = "the checkpoint holds " + std::to_string(taken) + " of the " +
             std::to_string(store_.owned_rows()) + " rows this node owns";
    return false;
  }
  for (Unit& u : units_) u.applies = manifest.optimizer_steps;
  return true;
}

void ShardOwner::serve(ShardRequest r) {
  auto shared = std::make_shared<ShardRequest>(std::move(r));
  queue_->push(
      std::max(shared->count, shared->whole_count) * dim_ > kInlineValues,
      [this, shared] { store_.gather(shared->rows, shared->count, shared->out); },
      [shared] { shared->done(PX_OK, ""); });
}

// A push is done once taken (its memory is kept alive until applied), as for other nodes'
// pushes, which get no reply: waiting for the apply would make every push wait for the
// slowest node.
void ShardOwner::push(ShardRequest r) {
  auto done = std::move(r.done);
  r.done = nullptr;
  Unit& unit = *unit_of(r);
  ++unit.pushes_by_node[static_cast<size_t>(r.from_node)];
  if (replicated_) {
    exchange(std::move(r));
  } else if (options_.consistency != Consistency::kSync) {
    // Applied on arrival, each node's push on its own.
    std::vector<ShardRequest> one;
    one.push_back(std::move(r));
    apply(unit, std::move(one));
    serve_ready_pulls();
  } else {
    uint64_t step = r.step;
    auto& slots = unit.sync_pushes[step];
    if (slots.empty()) slots.resize(static_cast<size_t>(node_count_));
    slots[static_cast<size_t>(r.from_node)] = std::move(r);
    apply_sync_steps(unit);
  }
  if (done) done(PX_OK, "");
}

void ShardOwner::apply_sync_steps(Unit& unit) {
  for (;;) {
    auto it = unit.sync_pushes.find(unit.applied_steps);
    if (it == unit.sync_pushes.end()) return;
    for (auto& slot : it->second)
      if (!slot) return;
    std::vector<ShardRequest> by_node;
    for (auto& slot : it->second) by_node.push_back(std::move(*slot));
    unit.sync_pushes.erase(it);
    apply(unit, std::move(by_node));
    ++unit.applied_steps;
    serve_ready_pulls();
  }
}

// Sums the nodes' gradients (in node order, each already summed over its workers), scales
// for mean aggregation and runs the optimizer on the touched rows. Nodes send their rows
// ascending, so the sum is a merge applied row by row; anything else is coalesced first.
void ShardOwner::apply(Unit& unit, std::vector<ShardRequest> batches) {
  uint64_t step = ++unit.applies;
  size_t values = 0;
  for (auto& b : batches) values += b.count * dim_;
  auto shared = std::make_shared<std::vector<ShardRequest>>(std::move(batches));
  auto touched = std::make_shared<uint64_t>(0);
  queue_->push(
      values > kInlineValues,
      [this, shared, step, touched] {
        std::vector<RowBatch> parts;
        for (auto& b : *shared) parts.push_back({b.rows, b.count, b.values});
        float divisor = options_.mean ? static_cast<float>(world_size_) : 1.0f;
        auto apply_row = [&](int64_t row, float* sum) {
          if (options_.mean)
            for (size_t c = 0; c < dim_; ++c) sum[c] /= divisor;
          store_.apply(&row, 1, sum, step);
          ++*touched;
        };
        if (merge_sorted(parts, dim_, apply_row, [this](int64_t row) { store_.prefetch(row); }))
          return;
        CoalescedRows sum;
        coalesce(parts, dim_, false, &sum);
        for (size_t i = 0; i < sum.rows.size(); ++i)
          apply_row(sum.rows[i], sum.values.data() + i * dim_);
      },
      [this, shared, touched] { rows_applied_ += *touched; });
}

// Other nodes' pulls are served before this node's own: their replies still have the
// network to cross.
void ShardOwner::serve_ready_pulls() {
  std::deque<ShardRequest> still_waiting, local;
  while (!waiting_pulls_.empty()) {
    ShardRequest r = std::move(waiting_pulls_.front());
    waiting_pulls_.pop_front();
    if (!ready(r)) {
      still_waiting.push_back(std::move(r));
    } else if (r.op == SparseOp::kCheckpoint) {
      write_checkpoint(std::move(r));
    } else if (r.from_node == node_) {
      local.push_back(std::move(r));
    } else {
      serve(std::move(r));
    }
  }
  for (auto& r : local) serve(std::move(r));
  waiting_pulls_ = std::move(still_waiting);
}

// A replicated route's push step on its way through the collective.
struct ShardOwner::Exchange {
  uint64_t step = 0;
  ShardRequest mine;
  std::vector<uint64_t> counts;  // allgatherv: rows per node
  std::vector<char> gathered;    // allgatherv: every node's rows, then values
  std::vector<float> dense;      // allreduce: rows x (dim + 1)
  std::vector<int64_t> rows;     // allreduce: the touched rows, summed values
  std::vector<float> values;
  std::vector<ShardRequest> batches;  // by node (allreduce: one, already summed)
};

void ShardOwner::exchange(ShardRequest mine) {
  auto ex = std::make_shared<Exchange>();
  ex->step = mine.step;
  ex->mine = std::move(mine);
  if (!fabric_ || node_count_ == 1) {
    ShardRequest batch;
    batch.rows = ex->mine.rows;
    batch.values = ex->mine.values;
    batch.count = ex->mine.count;
    batch.keep_alive = ex;
    ex->batches.push_back(std::move(batch));
    return exchanged(ex);
  }
  if (options_.route == Route::kAllgatherv) return exchange_allgatherv(ex);
  exchange_allreduce(ex);
}

void ShardOwner::exchange_allgatherv(const std::shared_ptr<Exchange>& ex) {
  size_t nodes = static_cast<size_t>(node_count_);
  ex->counts.assign(nodes, 0);
  ex->counts[static_cast<size_t>(node_)] = ex->mine.count;
  AllgathervSpec counts;
  counts.buffer = ex->counts.data();
  counts.block_bytes.assign(nodes, sizeof(uint64_t));
  counts.tag_base = make_tag(TagKind::kSparseCounts, global_id_, ex->step);
  bytes_sent_ += (nodes - 1) * sizeof(uint64_t);
  bytes_received_ += (nodes - 1) * sizeof(uint64_t);
  start_ring_allgatherv(*fabric_, counts, [this, ex](bool ok, const std::string& error) {
    post_([this, ex, ok, error] {
      if (!ok) {
        PX_LOG_ERROR("%s: push step %llu: exchanging row counts failed: %s", label_.c_str(),
                     static_cast<unsigned long long>(ex->step), error.c_str());
        return;
      }
      size_t nodes = static_cast<size_t>(node_count_);
      size_t row_bytes = sizeof(int64_t) + dim_ * sizeof(float);
      AllgathervSpec data;
      data.block_bytes.resize(nodes);
      std::vector<size_t> offset(nodes + 1, 0);
      for (size_t i = 0; i < nodes; ++i) {
        data.block_bytes[i] = ex->counts[i] * row_bytes;
        offset[i + 1] = offset[i] + data.block_bytes[i];
      }
      ex->gathered.resize(offset[nodes]);
      // This node's block: its rows, then its values.
      char* own = ex->gathered.data() + offset[static_cast<size_t>(node_)];
      std::memcpy(own, ex->mine.rows, ex->mine.count * sizeof(int64_t));
      std::memcpy(own + ex->mine.count * sizeof(int64_t), ex->mine.values,
                  ex->mine.count * dim_ * sizeof(float));
      for (size_t i = 0; i < nodes; ++i) {
        char* block = ex->gathered.data() + offset[i];
        ShardRequest batch;
        batch.rows = reinterpret_cast<const int64_t*>(block);
        batch.values = reinterpret_cast<const float*>(block + ex->counts[i] * sizeof(int64_t));
        batch.count = ex->counts[i];
        ex->batches.push_back(std::move(batch));
      }
      bytes_sent_ += offset[nodes] - data.block_bytes[(static_cast<size_t>(node_) + 1) % nodes];
      bytes_received_ += offset[nodes] - data.block_bytes[static_cast<size_t>(node_)];
      data.buffer = ex->gathered.data();
      data.tag_base = make_tag(TagKind::kAllgatherv, global_id_, ex->step);
      data.chunk_bytes = chunk_bytes_;
      start_ring_allgatherv(*fabric_, data, [this, ex](bool ok, const std::string& error) {
        post_([this, ex, ok, error] {
          if (!ok)
            return PX_LOG_ERROR("%s: push step %llu: the allgatherv failed: %s", label_.c_str(),
                                static_cast<unsigned long long>(ex->step), error.c_str());
          exchanged(ex);
        });
      });
    });
  });
}

void ShardOwner::exchange_allreduce(const std::shared_ptr<Exchange>& ex) {
  size_t width = dim_ + 1;
  uint64_t rows = store_.owned_rows();
  // Densify off the loop (the buffer is the whole table), then allreduce, then collect the
  // rows someone touched.
  queue_->push(
      true,
      [this, ex, width, rows] {
        ex->dense.assign(rows * width, 0.0f);
        for (size_t i = 0; i < ex->mine.count; ++i) {
          float* at = ex->dense.data() + static_cast<size_t>(ex->mine.rows[i]) * width;
          for (size_t c = 0; c < dim_; ++c) at[c] += ex->mine.values[i * dim_ + c];
          at[dim_] += 1.0f;
        }
      },
      [this, ex, width, rows] {
        RingAllreduceSpec spec;
        spec.buffer = ex->dense.data();
        spec.count = rows * width;
        spec.dtype = DType::kF32;
        spec.op = ReduceOp::kSum;
        spec.tag_base = make_tag(TagKind::kAllreduce, global_id_, ex->step);
        spec.chunk_bytes = chunk_bytes_;
        uint64_t bytes = spec.count * sizeof(float);
        uint64_t moved = 2 * (static_cast<uint64_t>(node_count_) - 1) * bytes /
                         static_cast<uint64_t>(node_count_);
        bytes_sent_ += moved;
        bytes_received_ += moved;
        ThreadPool& pool = pool_;
        start_ring_allreduce(
            *fabric_, spec, [&pool](std::function<void()> fn) { pool.submit(std::move(fn)); },
            [this, ex, width, rows](bool ok, const std::string& error) {
              post_([this, ex, width, rows, ok, error] {
                if (!ok)
                  return PX_LOG_ERROR("%s: push step %llu: the allreduce failed: %s",
                                      label_.c_str(), static_cast<unsigned long long>(ex->step),
                                      error.c_str());
                queue_->push(
                    true,
                    [this, ex, width, rows] {
                      for (uint64_t r = 0; r < rows; ++r) {
                        const float* at = ex->dense.data() + r * width;
                        if (at[dim_] == 0.0f) continue;
                        ex->rows.push_back(static_cast<int64_t>(r));
                        ex->values.insert(ex->values.end(), at, at + dim_);
                      }
                      std::vector<float>().swap(ex->dense);
                    },
                    [this, ex] {
                      ShardRequest batch;
                      batch.rows = ex->rows.data();
                      batch.values = ex->values.data();
                      batch.count = ex->rows.size();
                      ex->batches.push_back(std::move(batch));
                      exchanged(ex);
                    });
              });
            });
      });
}

// Applies exchanged steps in step order; every node's push of the step is in.
void ShardOwner::exchanged(const std::shared_ptr<Exchange>& ex) {
  exchanged_[ex->step] = ex;
  Unit& unit = units_[0];
  for (;;) {
    auto it = exchanged_.find(unit.applied_steps);
    if (it == exchanged_.end()) return;
    std::shared_ptr<Exchange> ready = it->second;
    exchanged_.erase(it);
    for (auto& b : ready->batches) b.keep_alive = ready;
    apply(unit, std::move(ready->batches));
    ++unit.applied_steps;
    for (auto& pushed : unit.pushes_by_node) pushed = std::max(pushed, unit.applied_steps);
    serve_ready_pulls();
  }
}

}  // namespace px
