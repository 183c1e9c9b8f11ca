#include "shard_owner.h"

#include <algorithm>

#include "coalesce.h"
#include "log.h"

namespace px {
namespace {

// Shard work above this many values goes to the pool.
constexpr size_t kInlineValues = 32 * 1024;

}  // namespace

ShardOwner::ShardOwner(std::string label, const PartitionMap& map, int node, size_t dim,
                       const SparseOptions& options, int world_size, ThreadPool& pool,
                       SerialQueue::PostToLoop post)
    : label_(std::move(label)),
      node_count_(map.nodes()),
      dim_(dim),
      options_(options),
      world_size_(world_size),
      store_(map, node, dim, options),
      queue_(std::make_shared<SerialQueue>(pool, std::move(post))),
      pushes_by_node_(static_cast<size_t>(map.nodes()), 0) {}

bool ShardOwner::valid(const ShardRequest& r, std::string* why) const {
  if (r.from_node < 0 || r.from_node >= node_count_) {
    *why = "unknown node " + std::to_string(r.from_node);
    return false;
  }
  for (size_t i = 0; i < r.count; ++i) {
    if (r.rows[i] < 0 || !store_.owns(r.rows[i])) {
      *why = "row " + std::to_string(r.rows[i]) + " is not held by this node";
      return false;
    }
  }
  if (r.op == SparseOp::kPush && r.step != pushes_by_node_[static_cast<size_t>(r.from_node)]) {
    *why = "push step " + std::to_string(r.step) + " arrived but step " +
           std::to_string(pushes_by_node_[static_cast<size_t>(r.from_node)]) + " was next";
    return false;
  }
  return true;
}

void ShardOwner::handle(ShardRequest r) {
  std::string why;
  if (!valid(r, &why)) {
    PX_LOG_ERROR("%s: refusing a %s request from node %d: %s", label_.c_str(), sparse_op_name(r.op),
                 r.from_node, why.c_str());
    if (r.done) r.done(PX_ERR_PROTOCOL, why);
    return;
  }
  switch (r.op) {
    case SparseOp::kPull:
      if (!pull_ready(r.step)) {
        waiting_pulls_.push_back(std::move(r));
        return;
      }
      return serve(std::move(r));
    case SparseOp::kRead:
      return serve(std::move(r));
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

bool ShardOwner::pull_ready(uint64_t step) const {
  switch (options_.consistency) {
    case Consistency::kSync:
      return applied_steps_ >= step;
    case Consistency::kAsync:
      return true;
    case Consistency::kBounded: {
      if (step <= options_.staleness) return true;
      uint64_t slowest = *std::min_element(pushes_by_node_.begin(), pushes_by_node_.end());
      return slowest >= step - options_.staleness;
    }
  }
  return true;
}

void ShardOwner::serve(ShardRequest r) {
  auto shared = std::make_shared<ShardRequest>(std::move(r));
  queue_->push(
      shared->count * dim_ > kInlineValues,
      [this, shared] { store_.gather(shared->rows, shared->count, shared->out); },
      [shared] { shared->done(PX_OK, ""); });
}

// A push is done once taken (its memory is kept alive until applied), as for other nodes'
// pushes, which get no reply: waiting for the apply would make every push wait for the
// slowest node.
void ShardOwner::push(ShardRequest r) {
  auto done = std::move(r.done);
  r.done = nullptr;
  ++pushes_by_node_[static_cast<size_t>(r.from_node)];
  if (options_.consistency != Consistency::kSync) {
    // Applied on arrival, each node's push on its own.
    std::vector<ShardRequest> one;
    one.push_back(std::move(r));
    apply(std::move(one));
    serve_ready_pulls();
  } else {
    uint64_t step = r.step;
    auto& slots = sync_pushes_[step];
    if (slots.empty()) slots.resize(static_cast<size_t>(node_count_));
    slots[static_cast<size_t>(r.from_node)] = std::move(r);
    apply_sync_steps();
  }
  if (done) done(PX_OK, "");
}

void ShardOwner::apply_sync_steps() {
  for (;;) {
    auto it = sync_pushes_.find(applied_steps_);
    if (it == sync_pushes_.end()) return;
    for (auto& slot : it->second)
      if (!slot) return;
    std::vector<ShardRequest> by_node;
    for (auto& slot : it->second) by_node.push_back(std::move(*slot));
    sync_pushes_.erase(it);
    apply(std::move(by_node));
    ++applied_steps_;
    serve_ready_pulls();
  }
}

// Sums the nodes' gradients (in node order, each already summed over its workers), scales
// for mean aggregation and runs the optimizer on the touched rows.
void ShardOwner::apply(std::vector<ShardRequest> batches) {
  uint64_t step = ++applies_;
  size_t values = 0;
  for (auto& b : batches) values += b.count * dim_;
  auto shared = std::make_shared<std::vector<ShardRequest>>(std::move(batches));
  queue_->push(
      values > kInlineValues,
      [this, shared, step] {
        std::vector<RowBatch> parts;
        for (auto& b : *shared) parts.push_back({b.rows, b.count, b.values});
        CoalescedRows sum;
        coalesce(parts, dim_, false, &sum);
        if (options_.mean) {
          float divisor = static_cast<float>(world_size_);
          for (float& v : sum.values) v /= divisor;
        }
        store_.apply(sum.rows.data(), sum.rows.size(), sum.values.data(), step);
      },
      [shared] {});
}

void ShardOwner::serve_ready_pulls() {
  std::deque<ShardRequest> still_waiting;
  while (!waiting_pulls_.empty()) {
    ShardRequest r = std::move(waiting_pulls_.front());
    waiting_pulls_.pop_front();
    if (pull_ready(r.step)) {
      serve(std::move(r));
    } else {
      still_waiting.push_back(std::move(r));
    }
  }
  waiting_pulls_ = std::move(still_waiting);
}

}  // namespace px
