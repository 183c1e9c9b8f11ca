#include "shard_store.h"

#include <cstring>

#include "initializer.h"
#include "optimizer.h"

namespace px {

ShardStore::ShardStore(const PartitionMap& map, int node, size_t dim, const SparseOptions& options)
    : map_(map),
      dim_(dim),
      options_(options),
      slots_(optimizer_state_slots(options.optimizer)),
      slot_of_(map.partitions(), -1) {
  for (uint32_t p : map.partitions_of(node)) {
    slot_of_[p] = static_cast<int32_t>(partitions_.size());
    Partition& part = partitions_.emplace_back();
    uint64_t n = map.rows_in(p);
    owned_rows_ += n;
    part.values.resize(n * dim);
    for (uint64_t i = 0; i < n; ++i)
      initial_row(options, i * map.partitions() + p, dim, part.values.data() + i * dim);
    part.state.resize(n * slots_ * dim);
    for (uint64_t i = 0; i < n; ++i)
      for (size_t s = 0; s < slots_; ++s)
        std::fill_n(part.state.data() + (i * slots_ + s) * dim, dim,
                    optimizer_state_initial(options, s));
  }
}

uint64_t ShardStore::bytes() const {
  return owned_rows_ * dim_ * (1 + slots_) * sizeof(float);
}

float* ShardStore::row_values(int64_t row) {
  uint64_t r = static_cast<uint64_t>(row);
  Partition& part = partitions_[static_cast<size_t>(slot_of_[map_.partition_of(r)])];
  return part.values.data() + map_.local_index(r) * dim_;
}

const float* ShardStore::row_values(int64_t row) const {
  return const_cast<ShardStore*>(this)->row_values(row);
}

float* ShardStore::row_state(int64_t row) {
  uint64_t r = static_cast<uint64_t>(row);
  Partition& part = partitions_[static_cast<size_t>(slot_of_[map_.partition_of(r)])];
  return part.state.data() + map_.local_index(r) * slots_ * dim_;
}

void ShardStore::gather(const int64_t* rows, size_t n, float* out) const {
  for (size_t i = 0; i < n; ++i)
    std::memcpy(out + i * dim_, row_values(rows[i]), dim_ * sizeof(float));
}

void ShardStore::load(const int64_t* rows, size_t n, const float* values) {
  for (size_t i = 0; i < n; ++i)
    std::memcpy(row_values(rows[i]), values + i * dim_, dim_ * sizeof(float));
}

void ShardStore::apply(const int64_t* rows, size_t n, const float* grads, uint64_t step) {
  for (size_t i = 0; i < n; ++i)
    optimizer_apply_row(options_, row_values(rows[i]), slots_ ? row_state(rows[i]) : nullptr,
                        grads + i * dim_, dim_, step);
}

}  // namespace px
