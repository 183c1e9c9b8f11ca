#include "daemon/sparse/replicated_exchange.h"

#include <cstring>

#include "daemon/common/log.h"
#include "daemon/common/loop_thread.h"
#include "transport/collectives/ring_allgatherv.h"
#include "transport/collectives/ring_allreduce.h"

namespace px {

// A push step on its way through the collective.
struct ReplicatedExchange::Step {
  uint64_t step = 0;
  ShardRequest mine;
  std::vector<uint64_t> counts;  // allgatherv: rows per node
  std::vector<char> gathered;    // allgatherv: every node's rows, then values
  std::vector<float> dense;      // allreduce: rows x (dim + 1)
  std::vector<int64_t> rows;     // allreduce: the touched rows, summed values
  std::vector<float> values;
  std::vector<ShardRequest> batches;  // by node (allreduce: one, already summed)
};

ReplicatedExchange::ReplicatedExchange(std::string label, Route route, int node, int node_count,
                                       size_t dim, uint64_t rows, ThreadPool& pool, PostToLoop post,
                                       std::shared_ptr<SerialQueue> queue, Exchanged exchanged)
    : label_(std::move(label)),
      route_(route),
      node_(node),
      node_count_(node_count),
      dim_(dim),
      rows_(rows),
      pool_(pool),
      post_(std::move(post)),
      queue_(std::move(queue)),
      exchanged_(std::move(exchanged)) {}

LogFields ReplicatedExchange::step_fields(uint64_t step) const {
  LogFields fields = log_fields_;
  fields.step = static_cast<int64_t>(step);
  return fields;
}

void ReplicatedExchange::attach(CollectiveTransport* fabric, uint32_t global_id,
                                size_t chunk_bytes) {
  PX_ASSERT_LOOP_THREAD();
  fabric_ = fabric;
  global_id_ = global_id;
  chunk_bytes_ = chunk_bytes;
}

void ReplicatedExchange::exchange(ShardRequest mine) {
  auto ex = std::make_shared<Step>();
  ex->step = mine.step;
  ex->mine = std::move(mine);
  if (!fabric_ || node_count_ == 1) {
    ShardRequest batch;
    batch.rows = ex->mine.rows;
    batch.values = ex->mine.values;
    batch.count = ex->mine.count;
    ex->batches.push_back(std::move(batch));
    return done(ex);
  }
  if (route_ == Route::kAllgatherv) return allgatherv(ex);
  allreduce(ex);
}

// allgatherv, first the nodes' row counts.
void ReplicatedExchange::allgatherv(const std::shared_ptr<Step>& ex) {
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
      if (!ok)
        return PX_LOG_ERROR_AT(
            step_fields(ex->step), "%s: push step %llu: exchanging row counts failed: %s",
            label_.c_str(), static_cast<unsigned long long>(ex->step), error.c_str());
      allgatherv_rows(ex);
    });
  });
}

// allgatherv, then every node's block: its rows, then its values.
void ReplicatedExchange::allgatherv_rows(const std::shared_ptr<Step>& ex) {
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
  char* own = ex->gathered.data() + offset[static_cast<size_t>(node_)];
  if (ex->mine.count > 0) {  // an empty push (every local push refused) has no buffers
    std::memcpy(own, ex->mine.rows, ex->mine.count * sizeof(int64_t));
    std::memcpy(own + ex->mine.count * sizeof(int64_t), ex->mine.values,
                ex->mine.count * dim_ * sizeof(float));
  }
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
        return PX_LOG_ERROR_AT(step_fields(ex->step),
                               "%s: push step %llu: the allgatherv failed: %s", label_.c_str(),
                               static_cast<unsigned long long>(ex->step), error.c_str());
      done(ex);
    });
  });
}

// allreduce: densify off the loop (the buffer is the whole table), then allreduce.
void ReplicatedExchange::allreduce(const std::shared_ptr<Step>& ex) {
  size_t width = dim_ + 1;
  uint64_t rows = rows_;
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
            [this, ex](bool ok, const std::string& error) {
              post_([this, ex, ok, error] {
                if (!ok)
                  return PX_LOG_ERROR_AT(
                      step_fields(ex->step), "%s: push step %llu: the allreduce failed: %s",
                      label_.c_str(), static_cast<unsigned long long>(ex->step), error.c_str());
                allreduce_collect(ex);
              });
            });
      });
}

// allreduce, then the rows someone touched (off the loop).
void ReplicatedExchange::allreduce_collect(const std::shared_ptr<Step>& ex) {
  size_t width = dim_ + 1;
  uint64_t rows = rows_;
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
        done(ex);
      });
}

// Hands the step's batches over, each keeping the step's memory alive until applied.
void ReplicatedExchange::done(const std::shared_ptr<Step>& ex) {
  std::vector<ShardRequest> batches = std::move(ex->batches);
  for (auto& b : batches) b.keep_alive = ex;
  exchanged_(ex->step, std::move(batches));
}

}  // namespace px
