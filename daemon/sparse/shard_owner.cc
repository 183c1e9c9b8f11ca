#include "daemon/sparse/shard_owner.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "daemon/common/log.h"
#include "daemon/common/loop_thread.h"
#include "daemon/common/status_join.h"
#include "sharding/coalesce.h"
#include "sharding/request_groups.h"
#include "sharding/wire_values.h"

namespace px {
namespace {

// Shard work above this many values goes to the pool.
constexpr size_t kInlineValues = 32 * 1024;

}  // namespace

ShardOwner::ShardOwner(std::string label, const PartitionMap& map, int node, size_t dim,
                       const SparseOptions& options, int world_size, ThreadPool& pool,
                       PostToLoop post, bool initialise)
    : label_(std::move(label)),
      replicated_(options.route == Route::kAllgatherv || options.route == Route::kAllreduce),
      columns_(options.column_split()),
      node_(node),
      node_count_(map.nodes()),
      table_dim_(dim),
      dim_(columns_ ? column_range(dim, map.nodes(), node).width() : dim),
      options_(options),
      world_size_(world_size),
      store_(replicated_ || columns_ ? PartitionMap(map.rows(), 1, 1) : map,
             replicated_ || columns_ ? 0 : node, dim, options,
             columns_ ? column_range(dim, map.nodes(), node) : ColumnRange{0, dim}, initialise),
      queue_(std::make_shared<SerialQueue>(pool, post)),
      post_(post),
      flushed_by_node_(static_cast<size_t>(map.nodes()), 0) {
  if (replicated_) {
    units_.resize(1);
    exchange_ = std::make_unique<ReplicatedExchange>(
        label_, options.route, node, node_count_, dim, store_.owned_rows(), pool, std::move(post),
        queue_, [this](uint64_t step, std::vector<ShardRequest> batches) {
          exchanged(step, std::move(batches));
        });
  } else if (columns_) {
    units_.resize(1);
  } else {
    unit_of_partition_.assign(map.partitions(), -1);
    held_ = map.partitions_of(node);
    for (uint32_t p : held_) {
      unit_of_partition_[p] = static_cast<int32_t>(units_.size());
      units_.emplace_back();
    }
  }
  for (Unit& u : units_) {
    u.pushes_by_node.assign(static_cast<size_t>(node_count_), 0);
    u.pulls_by_node.assign(static_cast<size_t>(node_count_), 0);
  }
}

void ShardOwner::abandon() {
  std::deque<ShardRequest> pulls = std::move(waiting_pulls_);
  waiting_pulls_.clear();
  std::map<uint64_t, std::vector<ShardRequest>> exchanged = std::move(exchanged_);
  exchanged_.clear();
  std::vector<std::map<uint64_t, std::vector<std::optional<ShardRequest>>>> pushes;
  for (Unit& u : units_) {
    pushes.push_back(std::move(u.sync_pushes));
    u.sync_pushes.clear();
  }
  // Destroyed here, after the members are empty: a callback's destructor may free what
  // refers to this owner.
}

ShardOwner::Unit* ShardOwner::unit_of(const ShardRequest& r) {
  if (replicated_ || columns_) return &units_[0];
  if (r.partition >= unit_of_partition_.size() || unit_of_partition_[r.partition] < 0)
    return nullptr;
  return &units_[static_cast<size_t>(unit_of_partition_[r.partition])];
}

void ShardOwner::attach(CollectiveTransport* fabric, uint32_t global_id, size_t chunk_bytes) {
  PX_ASSERT_LOOP_THREAD();
  if (exchange_) exchange_->attach(fabric, global_id, chunk_bytes);
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
  bool one_partition = !replicated_ && !columns_ && r.partition != kAllPartitions;
  for (size_t i = 0; i < r.count && r.op != SparseOp::kCheckpoint; ++i) {
    if (r.rows[i] < 0 || !store_.owns(r.rows[i]) ||
        (one_partition && store_.partition_of(r.rows[i]) != r.partition)) {
      *why = "row " + std::to_string(r.rows[i]) + " is not held by this node" +
             (one_partition ? " in partition " + std::to_string(r.partition) : "");
      return false;
    }
  }
  // Prefetch counts each node's pull steps (the rows of step n must be in before pull n+1 is
  // served ahead of push n): they must come in order, as pushes do.
  bool counts_pulls = options_.prefetch && options_.consistency == Consistency::kSync;
  if (r.op == SparseOp::kPull && counts_pulls &&
      r.step != unit->pulls_by_node[static_cast<size_t>(r.from_node)]) {
    *why = "pull step " + std::to_string(r.step) + " arrived but step " +
           std::to_string(unit->pulls_by_node[static_cast<size_t>(r.from_node)]) + " was next";
    return false;
  }
  if (r.op == SparseOp::kPush && r.step != unit->pushes_by_node[static_cast<size_t>(r.from_node)]) {
    *why = "push step " + std::to_string(r.step) + " arrived but step " +
           std::to_string(unit->pushes_by_node[static_cast<size_t>(r.from_node)]) + " was next";
    return false;
  }
  return true;
}

void ShardOwner::set_names(std::string job, std::string variable) {
  job_ = std::move(job);
  variable_ = std::move(variable);
  if (exchange_) exchange_->set_log_fields(job_fields(job_, variable_));
}

void ShardOwner::handle(ShardRequest r) {
  PX_ASSERT_LOOP_THREAD();
  if (r.op == SparseOp::kReplicate) return take_copy(std::move(r));
  std::string why;
  std::vector<ShardRequest> parts;
  bool ok = true;
  if (r.groups > 0 && !replicated_ && !columns_) {
    ok = split(r, &parts, &why);
    for (size_t i = 0; ok && i < parts.size(); ++i) ok = valid(parts[i], &why);
  } else {
    ok = valid(r, &why);
  }
  if (!ok) {
    LogFields fields = job_fields(job_, variable_);
    fields.peer = r.from_node;
    PX_LOG_ERROR_AT(fields, "%s: refusing a %s request from node %d: %s", label_.c_str(),
                    sparse_op_name(r.op), r.from_node, why.c_str());
    if (r.done) r.done(PX_ERR_PROTOCOL, why);
    return;
  }
  if (parts.empty()) return handle_valid(std::move(r));
  if (r.op == SparseOp::kPush) {
    for (auto& part : parts) handle_valid(std::move(part));
    if (r.done) r.done(PX_OK, "");
    return;
  }
  // A pull of a group is answered once every partition of it served its part; its early
  // rows go once every part said which of its rows are still pending.
  StatusCallback answered = join_statuses(parts.size(), std::move(r.done));
  struct EarlyJoin {
    size_t parts_left;
    std::vector<size_t> pending;
    std::function<void(std::vector<size_t>)> early;
  };
  std::shared_ptr<EarlyJoin> join;
  if (r.early) join = std::make_shared<EarlyJoin>(EarlyJoin{parts.size(), {}, std::move(r.early)});
  size_t offset = 0;
  for (auto& part : parts) {
    part.done = answered;
    if (join) {
      part.early = [join, offset](std::vector<size_t> pending) {
        for (size_t at : pending) join->pending.push_back(offset + at);
        if (--join->parts_left > 0) return;
        // Parts report in any order; positions go ascending (sparse_wire.h).
        std::sort(join->pending.begin(), join->pending.end());
        join->early(std::move(join->pending));
      };
    }
    offset += part.count;
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
    case SparseOp::kPull: {
      Unit& unit = *unit_of(r);
      bool every_node_pulled = note_pull(unit, r);
      if (pull_ready(unit, r.step))
        serve(std::move(r));
      else if (r.early && ahead_ready(unit, r.step))
        serve_ahead(unit, std::move(r));
      else
        waiting_pulls_.push_back(std::move(r));
      // The last node's pull of a step may let pulls already waiting go ahead.
      if (every_node_pulled && !waiting_pulls_.empty()) serve_ready_pulls();
      return;
    }
    case SparseOp::kRead:  // after the push steps its node sent before it (sync)
    case SparseOp::kCheckpoint:
      // Not inline: the flush may come back to this owner (this node's own held sums).
      if (flush_hook_) post_([hook = flush_hook_, steps = r.step] { hook(steps); });
      if (!ready(r)) {
        waiting_pulls_.push_back(std::move(r));
        return;
      }
      return r.op == SparseOp::kRead ? serve(std::move(r)) : write_checkpoint(std::move(r));
    case SparseOp::kPush:
      return push(std::move(r));
    case SparseOp::kFlush:
      return flush(std::move(r));
    case SparseOp::kReplicate:  // (handle() takes them before any check)
      return take_copy(std::move(r));
    case SparseOp::kLoad: {
      auto shared = std::make_shared<ShardRequest>(std::move(r));
      // The next node's copy takes the loaded rows too (not a step: kLoadCopyStep).
      std::shared_ptr<ReplicaRows> copy;
      if (send_copy_ && !replicated_ && !columns_) copy = std::make_shared<ReplicaRows>();
      queue_->push(
          shared->count * dim_ > kInlineValues,
          [this, shared, copy] {
            store_.load(shared->rows, shared->count, shared->values);
            // Rows changed outside a step: no journal leads back past them any more.
            for (StepJournal& journal : journals_) journal.clear();
            if (copy) copy_rows(shared->rows, shared->count, copy.get());
          },
          [this, shared, copy] {
            if (copy) send_copy_(kAllPartitions, kLoadCopyStep, copy);
            shared->done(PX_OK, "");
          });
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

// Prefetch (sync only: the other modes serve pulls without waiting for the push step).
// Returns whether every node's pull of one more step is now in.
bool ShardOwner::note_pull(Unit& unit, const ShardRequest& r) {
  if (!options_.prefetch || options_.consistency != Consistency::kSync) return false;
  auto slowest = [&unit] {
    return *std::min_element(unit.pulls_by_node.begin(), unit.pulls_by_node.end());
  };
  uint64_t before = slowest();
  ++unit.pulls_by_node[static_cast<size_t>(r.from_node)];
  if (r.step >= unit.applied_steps) {  // else its push step is applied: nothing waits on it
    std::vector<int64_t>& rows = unit.pulled[r.step];
    rows.insert(rows.end(), r.rows, r.rows + r.count);
    unit.pulled_sorted[r.step] = false;
  }
  return slowest() > before;
}

// Pull `step` may be served ahead of push step-1 once every earlier push step is applied
// and every node's pull step-1 is in: its rows are all push step-1 can touch here (a
// worker pushes only rows it pulled in that step; libparallax holds it to that).
bool ShardOwner::ahead_ready(const Unit& unit, uint64_t step) const {
  if (!options_.prefetch || options_.consistency != Consistency::kSync || step == 0) return false;
  if (unit.applied_steps + 1 != step) return false;
  return *std::min_element(unit.pulls_by_node.begin(), unit.pulls_by_node.end()) >= step;
}

// Gathers now the rows no node pulled in step-1, tells the requester which are pending,
// and waits (served_ahead) for the push step to gather the rest.
void ShardOwner::serve_ahead(Unit& unit, ShardRequest r) {
  std::vector<int64_t>& touched = unit.pulled[r.step - 1];
  bool& sorted = unit.pulled_sorted[r.step - 1];
  if (!sorted) {
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    sorted = true;
  }
  for (size_t i = 0; i < r.count; ++i)
    if (std::binary_search(touched.begin(), touched.end(), r.rows[i])) r.pending.push_back(i);
  size_t ahead = r.count - r.pending.size();
  rows_served_ahead_ += ahead;
  if (r.pending.empty()) return serve(std::move(r));  // whole, at once
  r.served_ahead = true;
  auto shared = std::make_shared<ShardRequest>(std::move(r));
  queue_->push(
      ahead * dim_ > kInlineValues,
      [this, shared] {
        const std::vector<size_t>& pending = shared->pending;
        size_t next = 0;
        for (size_t i = 0; i < shared->count; ++i) {
          if (next < pending.size() && pending[next] == i) {
            ++next;
            continue;
          }
          store_.gather(&shared->rows[i], 1, shared->out + i * dim_);
          round_to_wire(options_.wire, shared->out + i * dim_, dim_);
        }
      },
      [this, shared] {
        shared->early(shared->pending);
        // (Maybe inside serve_ready_pulls, which then takes it from waiting_pulls_.)
        if (ready(*shared)) return serve(std::move(*shared));
        waiting_pulls_.push_back(std::move(*shared));
      });
}

bool ShardOwner::applied_through(uint64_t step) const {
  // A column-wise node that holds no columns (dim < nodes) gets no steps: nothing to wait for.
  if (columns_ && dim_ == 0) return true;
  for (const Unit& u : units_) {
    if (replicated_ || options_.consistency == Consistency::kSync) {
      if (u.applied_steps < step) return false;
    } else if (*std::min_element(u.pushes_by_node.begin(), u.pushes_by_node.end()) < step) {
      return false;
    }
  }
  return true;
}

bool ShardOwner::flushed_through(uint64_t steps) const {
  if (!flush_hook_) return true;
  return *std::min_element(flushed_by_node_.begin(), flushed_by_node_.end()) >= steps;
}

bool ShardOwner::ready(const ShardRequest& r) {
  if (r.op == SparseOp::kRead)  // step: the push steps its node sent before it
    return (options_.consistency != Consistency::kSync || applied_through(r.step)) &&
           flushed_through(r.step);
  if (r.op == SparseOp::kCheckpoint) return applied_through(r.step) && flushed_through(r.step);
  return pull_ready(*unit_of(r), r.step);
}

// Each row's sum is applied as a push step's would be, at the learning rate of the sender's
// last push step; Adam's step count is not advanced (a flush is not a step).
void ShardOwner::flush(ShardRequest r) {
  uint64_t& through = flushed_by_node_[static_cast<size_t>(r.from_node)];
  through = std::max(through, r.step);
  auto shared = std::make_shared<ShardRequest>(std::move(r));
  auto done = std::move(shared->done);
  shared->done = nullptr;
  double learning_rate =
      rates_ ? rates_->at(shared->step > 0 ? shared->step - 1 : 0) : options_.learning_rate;
  if (shared->count > 0) {
    // Adam's step for each row: its partition's applications so far (read here, on the loop).
    auto steps = std::make_shared<std::vector<uint64_t>>(shared->count);
    for (size_t i = 0; i < shared->count; ++i) {
      int32_t unit = unit_of_partition_[store_.partition_of(shared->rows[i])];
      (*steps)[i] = std::max<uint64_t>(units_[static_cast<size_t>(unit)].applies, 1);
    }
    queue_->push(
        shared->count * dim_ > kInlineValues,
        [this, shared, steps, learning_rate] {
          std::vector<float> sum(dim_);
          float divisor = options_.mean ? static_cast<float>(world_size_) : 1.0f;
          for (size_t i = 0; i < shared->count; ++i) {
            int64_t row = shared->rows[i];
            for (size_t c = 0; c < dim_; ++c) sum[c] = shared->values[i * dim_ + c] / divisor;
            store_.apply(&row, 1, sum.data(), (*steps)[i], learning_rate);
          }
        },
        [this, shared] { rows_applied_ += shared->count; });
  }
  if (done) done(PX_OK, "");
  serve_ready_pulls();
}

void ShardOwner::export_at(uint64_t steps,
                           std::function<void(std::shared_ptr<ShardFileData>)> done) {
  ShardRequest r;
  r.from_node = node_;
  r.op = SparseOp::kCheckpoint;
  r.step = steps;
  r.exported = std::make_shared<ShardFileData>();
  r.done = [exported = r.exported, done](px_status, const std::string&) { done(exported); };
  handle(std::move(r));
}

void ShardOwner::take_copy(ShardRequest r) {
  std::string why = "this node keeps no copy of another node's partitions";
  if (!replica_ || !replica_->check(r, &why)) {
    LogFields fields = job_fields(job_, variable_);
    fields.peer = r.from_node;
    // No reply: a copy is sent without one. The copy stays behind, and a handover that
    // needs it says so.
    PX_LOG_ERROR_AT(fields, "%s: refusing a copy from node %d: %s", label_.c_str(), r.from_node,
                    why.c_str());
    return;
  }
  replica_->count(r);
  auto shared = std::make_shared<ShardRequest>(std::move(r));
  queue_->push(
      shared->count * dim_ > kInlineValues, [this, shared] { replica_->apply(*shared); },
      [shared] {});
}

void ShardOwner::copy_rows(const int64_t* rows, size_t n, ReplicaRows* copy) const {
  size_t slots = store_.state_slots();
  copy->rows.assign(rows, rows + n);
  copy->values.resize(n * dim_ * (1 + slots));
  float* state = copy->values.data() + n * dim_;
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(copy->values.data() + i * dim_, store_.values_of(rows[i]), dim_ * sizeof(float));
    // (SGD keeps no state: its state arrays are empty, their data() null.)
    if (slots > 0)
      std::memcpy(state + i * slots * dim_, store_.state_of(rows[i]), slots * dim_ * sizeof(float));
  }
}

void ShardOwner::keep_copy_of(const PartitionMap& map, int node, size_t journal_steps) {
  if (replicated_ || columns_) return;
  replica_ = std::make_unique<ShardReplica>(map, node, table_dim_, options_, journal_steps);
}

void ShardOwner::keep_journal(size_t depth) {
  if (columns_) return;
  journals_.assign(units_.size(), StepJournal(dim_, store_.state_slots(), depth));
}

void ShardOwner::hand_over(std::function<void(std::vector<HandoverUnit>)> done) {
  // The steps as counted now, on the loop: the work queued before the export applies them.
  // A replicated route's whole table is one unit, the one partition of its store.
  std::vector<uint32_t> held = replicated_ ? std::vector<uint32_t>{0} : held_;
  auto units = std::make_shared<std::vector<HandoverUnit>>(held.size());
  for (size_t i = 0; i < held.size(); ++i) {
    (*units)[i].partition = held[i];
    (*units)[i].applied = units_[i].applied_steps;
    (*units)[i].applies = units_[i].applies;
  }
  // A copy's optimizer applications: its steps past those of the run's start, as this
  // node's own partitions count them (a synchronous table applies once a step).
  std::vector<uint64_t> copied = replica_ ? replica_->counted() : std::vector<uint64_t>{};
  uint64_t offset = units_.empty() ? 0 : units_[0].applies - units_[0].applied_steps;
  queue_->push(
      true,
      [this, units, copied, offset] {
        size_t own = units->size();
        for (size_t i = 0; i < own; ++i) {
          store_.export_partition((*units)[i].partition, &(*units)[i].rows);
          if (!journals_.empty()) (*units)[i].journal = journals_[i].records();
        }
        if (!replica_) return;
        for (HandoverUnit& u : replica_->export_units(copied, offset))
          units->push_back(std::move(u));
      },
      [units, done] { done(std::move(*units)); });
}

uint64_t ShardOwner::applies() const {
  uint64_t most = 0;
  for (const Unit& u : units_) most = std::max(most, u.applies);
  return most;
}

void ShardOwner::continue_from(uint64_t steps, uint64_t applies) {
  if (replica_) replica_->continue_from(steps);
  for (Unit& u : units_) {
    u.applied_steps = steps;
    u.applies = applies;
    u.pushes_by_node.assign(static_cast<size_t>(node_count_), steps);
    u.pulls_by_node.assign(static_cast<size_t>(node_count_), steps);
  }
}

// Runs after every push the requester made (and the work queued before it): a consistent cut.
void ShardOwner::write_checkpoint(ShardRequest r) {
  if (r.exported) {
    auto shared = std::make_shared<ShardRequest>(std::move(r));
    queue_->push(
        true, [this, shared] { store_.export_rows(shared->exported.get()); },
        [shared] { shared->done(PX_OK, ""); });
    return;
  }
  auto shared = std::make_shared<ShardRequest>(std::move(r));
  std::string dir(reinterpret_cast<const char*>(shared->rows), shared->count * sizeof(int64_t));
  dir.resize(strnlen(dir.c_str(), dir.size()));
  std::string path =
      checkpoint_stem(dir, job_, variable_) + ".node" + std::to_string(node_) + ".shard";
  auto status = std::make_shared<px_status>(PX_OK);
  queue_->push(
      true,
      [this, dir, path, status] {
        ShardFileData data;
        store_.export_rows(&data);
        std::string error;
        // On another machine the folder may not exist yet (a periodic generation's is
        // made by the node that starts the checkpoint).
        std::error_code ec;
        std::filesystem::create_directories(dir, ec);
        if (!write_shard_file(path, data, &error)) {
          PX_LOG_ERROR_AT(job_fields(job_, variable_), "%s: checkpoint: %s", label_.c_str(),
                          error.c_str());
          *status = PX_ERR_INVALID;
        }
      },
      [this, shared, status, path] {
        if (*status == PX_OK)
          PX_LOG_INFO_AT(job_fields(job_, variable_), "%s: checkpoint written to %s",
                         label_.c_str(), path.c_str());
        shared->done(*status, "");
      });
}

bool ShardOwner::restore(const std::string& dir, const ManifestData& manifest, std::string* error) {
  if (manifest.dim != table_dim_ || manifest.state_slots != store_.state_slots()) {
    *error = "the checkpoint has dim " + std::to_string(manifest.dim) + " and " +
             std::to_string(manifest.state_slots) + " optimizer state slots, the variable " +
             std::to_string(table_dim_) + " and " + std::to_string(store_.state_slots());
    return false;
  }
  // Files hold whole rows or (column-wise alltoall) a slice of columns of every row they
  // list: this node takes the cells it holds from whichever files have them, so the count
  // of cells taken says whether the checkpoint covered them. A replicated route's nodes
  // each wrote the whole table: the first file covers it, and the others are not read
  // (taken, they would count every cell once a node).
  uint64_t wanted = store_.owned_rows() * dim_, taken = 0, copied = 0;
  for (const std::string& file : manifest.shard_files) {
    if (taken >= wanted && (!replica_ || copied >= replica_->held_values())) break;
    ShardFileData data;
    if (!read_shard_file(dir + "/" + file, &data, error)) return false;
    bool columns_fit = data.column_slice ? data.column_begin + data.dim <= table_dim_
                                         : data.column_begin == 0 && data.dim == table_dim_;
    if (!columns_fit || data.slots != store_.state_slots()) {
      *error = dir + "/" + file + " does not match its manifest";
      return false;
    }
    taken += store_.import_rows(view_of(data));
    if (replica_) copied += replica_->import_rows(view_of(data));
  }
  if (taken != wanted) {
    *error = "the checkpoint holds " + std::to_string(taken) + " of the " + std::to_string(wanted) +
             " values (" + std::to_string(store_.owned_rows()) + " rows x " + std::to_string(dim_) +
             " columns) this node holds";
    return false;
  }
  if (replica_ && copied != replica_->held_values()) {
    *error = "the checkpoint holds " + std::to_string(copied) + " of the " +
             std::to_string(replica_->held_values()) + " values of node " +
             std::to_string(replica_->of_node()) + "'s partitions this node keeps a copy of";
    return false;
  }
  for (Unit& u : units_) u.applies = manifest.optimizer_steps;
  return true;
}

void ShardOwner::serve(ShardRequest r) {
  auto shared = std::make_shared<ShardRequest>(std::move(r));
  size_t rows =
      shared->served_ahead ? shared->pending.size() : std::max(shared->count, shared->whole_count);
  queue_->push(
      rows * dim_ > kInlineValues,
      [this, shared] {
        // Rounded here, for every requester alike (wire_values.h).
        WireDtype wire = shared->op == SparseOp::kPull ? options_.wire : WireDtype::kF32;
        if (!shared->served_ahead) {
          store_.gather(shared->rows, shared->count, shared->out);
          round_to_wire(wire, shared->out, shared->count * dim_);
          return;
        }
        for (size_t i : shared->pending) {
          store_.gather(&shared->rows[i], 1, shared->out + i * dim_);
          round_to_wire(wire, shared->out + i * dim_, dim_);
        }
      },
      [shared] {
        if (shared->early && !shared->served_ahead) shared->early({});
        shared->done(PX_OK, "");
      });
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
    exchange_->exchange(std::move(r));
  } else if (options_.consistency != Consistency::kSync) {
    // Applied on arrival, each node's push on its own.
    uint64_t step = r.step;
    std::vector<ShardRequest> one;
    one.push_back(std::move(r));
    apply(unit, std::move(one), step);
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
    apply(unit, std::move(by_node), unit.applied_steps);
    ++unit.applied_steps;
    unit.pulled.erase(unit.pulled.begin(), unit.pulled.lower_bound(unit.applied_steps));
    unit.pulled_sorted.erase(unit.pulled_sorted.begin(),
                             unit.pulled_sorted.lower_bound(unit.applied_steps));
    serve_ready_pulls();
  }
}

// Sums the nodes' gradients (in node order, each already summed over its workers), scales
// for mean aggregation and runs the optimizer on the touched rows. Nodes send their rows
// ascending, so the sum is a merge applied row by row; anything else is coalesced first.
void ShardOwner::apply(Unit& unit, std::vector<ShardRequest> batches, uint64_t push_step) {
  uint64_t step = ++unit.applies;
  size_t unit_index = static_cast<size_t>(&unit - units_.data());
  StepJournal* journal = journals_.empty() ? nullptr : &journals_[unit_index];
  // The rows the step changes, as they then are, for the next node's copy.
  std::shared_ptr<ReplicaRows> copy;
  if (send_copy_ && !replicated_ && !columns_) copy = std::make_shared<ReplicaRows>();
  uint32_t partition = copy ? held_[unit_index] : 0;
  double learning_rate = rates_ ? rates_->at(push_step) : options_.learning_rate;
  size_t values = 0;
  for (auto& b : batches) values += b.count * dim_;
  auto shared = std::make_shared<std::vector<ShardRequest>>(std::move(batches));
  auto touched = std::make_shared<uint64_t>(0);
  queue_->push(
      values > kInlineValues,
      [this, shared, step, touched, learning_rate, journal, push_step, copy] {
        if (journal) journal->begin(push_step);
        std::vector<RowBatch> parts;
        for (auto& b : *shared) parts.push_back({b.rows, b.count, b.values});
        float divisor = options_.mean ? static_cast<float>(world_size_) : 1.0f;
        auto apply_row = [&](int64_t row, float* sum) {
          if (options_.mean)
            for (size_t c = 0; c < dim_; ++c) sum[c] /= divisor;
          if (journal) journal->save(row, store_.values_of(row), store_.state_of(row));
          store_.apply(&row, 1, sum, step, learning_rate);
          if (copy) copy->rows.push_back(row);
          ++*touched;
        };
        if (!merge_sorted(parts, dim_, apply_row, [this](int64_t row) { store_.prefetch(row); })) {
          CoalescedRows sum;
          coalesce(parts, dim_, false, &sum);
          for (size_t i = 0; i < sum.rows.size(); ++i)
            apply_row(sum.rows[i], sum.values.data() + i * dim_);
        }
        if (!copy) return;
        std::vector<int64_t> rows = std::move(copy->rows);
        copy_rows(rows.data(), rows.size(), copy.get());
      },
      [this, shared, touched, copy, partition, push_step] {
        rows_applied_ += *touched;
        if (copy) send_copy_(partition, push_step, copy);
      });
}

// Other nodes' pulls are served before this node's own: their replies still have the
// network to cross.
void ShardOwner::serve_ready_pulls() {
  std::deque<ShardRequest> still_waiting, local;
  while (!waiting_pulls_.empty()) {
    ShardRequest r = std::move(waiting_pulls_.front());
    waiting_pulls_.pop_front();
    if (!ready(r) && r.op == SparseOp::kPull && r.early && !r.served_ahead &&
        ahead_ready(*unit_of(r), r.step)) {
      serve_ahead(*unit_of(r), std::move(r));
    } else if (!ready(r)) {
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

// Applies exchanged steps in step order; every node's push of the step is in.
void ShardOwner::exchanged(uint64_t step, std::vector<ShardRequest> batches) {
  exchanged_[step] = std::move(batches);
  Unit& unit = units_[0];
  for (;;) {
    auto it = exchanged_.find(unit.applied_steps);
    if (it == exchanged_.end()) return;
    std::vector<ShardRequest> ready = std::move(it->second);
    exchanged_.erase(it);
    apply(unit, std::move(ready), unit.applied_steps);
    ++unit.applied_steps;
    for (auto& pushed : unit.pushes_by_node) pushed = std::max(pushed, unit.applied_steps);
    serve_ready_pulls();
  }
}

}  // namespace px
