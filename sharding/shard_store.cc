#include "sharding/shard_store.h"

#include <algorithm>
#include <cstring>

#include "sharding/initializer.h"
#include "sharding/optimizer.h"
#include "sharding/prefetch.h"
#include "transport/kernels/huge_pages.h"

namespace px {

ShardStore::ShardStore(const PartitionMap& map, int node, size_t dim, const SparseOptions& options)
    : ShardStore(map, node, dim, options, ColumnRange{0, dim}) {}

ShardStore::ShardStore(const PartitionMap& map, int node, size_t dim, const SparseOptions& options,
                       ColumnRange columns, bool initialise)
    : map_(map),
      table_dim_(dim),
      columns_(columns),
      dim_(columns.width()),
      options_(options),
      slots_(optimizer_state_slots(options.optimizer)),
      slot_of_(map.partitions(), -1) {
  for (uint32_t p : map.partitions_of(node)) {
    slot_of_[p] = static_cast<int32_t>(partitions_.size());
    Partition& part = partitions_.emplace_back();
    uint64_t n = map.rows_in(p);
    owned_rows_ += n;
    resize_on_huge_pages(part.values, n * dim_);
    resize_on_huge_pages(part.state, n * slots_ * dim_);
    if (!initialise) continue;
    for (uint64_t i = 0; i < n; ++i)
      initial_row_columns(options, i * map.partitions() + p, dim, columns_.begin, dim_,
                          part.values.data() + i * dim_);
    for (uint64_t i = 0; i < n; ++i)
      for (size_t s = 0; s < slots_; ++s)
        std::fill_n(part.state.data() + (i * slots_ + s) * dim_, dim_,
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

void ShardStore::export_rows(ShardFileData* out) const {
  out->dim = dim_;
  out->column_begin = columns_.begin;
  out->column_slice = dim_ != table_dim_;
  out->slots = static_cast<uint32_t>(slots_);
  out->rows.clear();
  out->values.clear();
  out->state.clear();
  if (dim_ == 0) return;  // a column-wise node that holds no columns: an empty slice
  reserve_on_huge_pages(out->rows, owned_rows_);
  reserve_on_huge_pages(out->values, owned_rows_ * dim_);
  reserve_on_huge_pages(out->state, owned_rows_ * slots_ * dim_);
  for (uint32_t p = 0; p < map_.partitions(); ++p) {
    if (slot_of_[p] < 0) continue;
    const Partition& part = partitions_[static_cast<size_t>(slot_of_[p])];
    for (uint64_t i = 0; i < map_.rows_in(p); ++i)
      out->rows.push_back(static_cast<int64_t>(i * map_.partitions() + p));
    out->values.insert(out->values.end(), part.values.begin(), part.values.end());
    out->state.insert(out->state.end(), part.state.begin(), part.state.end());
  }
}

void ShardStore::overwrite(int64_t row, const float* values, const float* state) {
  std::copy(values, values + dim_, row_values(row));
  std::copy(state, state + slots_ * dim_, row_state(row));
}

void ShardStore::export_partition(uint32_t p, ShardFileData* out) const {
  out->dim = dim_;
  out->column_begin = columns_.begin;
  out->column_slice = dim_ != table_dim_;
  out->slots = static_cast<uint32_t>(slots_);
  out->rows.clear();
  const Partition& part = partitions_[static_cast<size_t>(slot_of_[p])];
  for (uint64_t i = 0; i < map_.rows_in(p); ++i)
    out->rows.push_back(static_cast<int64_t>(i * map_.partitions() + p));
  out->values = part.values;
  out->state = part.state;
}

uint64_t ShardStore::import_rows(const ShardView& data) {
  // The columns both the file and this store hold: [first, last) of the table.
  uint64_t first = std::max<uint64_t>(data.column_begin, columns_.begin);
  uint64_t last = std::min<uint64_t>(data.column_begin + data.dim, columns_.end);
  if (first >= last) return 0;
  size_t width = last - first;
  size_t from = first - data.column_begin, to = first - columns_.begin;
  uint64_t taken = 0;
  for (size_t i = 0; i < data.count; ++i) {
    int64_t row = data.rows[i];
    if (row < 0 || static_cast<uint64_t>(row) >= map_.rows() || !owns(row)) continue;
    std::memcpy(row_values(row) + to, data.values + i * data.dim + from, width * sizeof(float));
    for (size_t s = 0; s < slots_; ++s)
      std::memcpy(row_state(row) + s * dim_ + to, data.state + (i * slots_ + s) * data.dim + from,
                  width * sizeof(float));
    taken += width;
  }
  return taken;
}

void ShardStore::gather(const int64_t* rows, size_t n, float* out) const {
  for (size_t i = 0; i < n; ++i) {
    if (i + kPrefetchAhead < n)
      prefetch_bytes(row_values(rows[i + kPrefetchAhead]), dim_ * sizeof(float));
    std::memcpy(out + i * dim_, row_values(rows[i]), dim_ * sizeof(float));
  }
}

void ShardStore::prefetch(int64_t row) {
  prefetch_bytes_for_write(row_values(row), dim_ * sizeof(float));
  if (slots_) prefetch_bytes_for_write(row_state(row), slots_ * dim_ * sizeof(float));
}

void ShardStore::load(const int64_t* rows, size_t n, const float* values) {
  for (size_t i = 0; i < n; ++i)
    std::memcpy(row_values(rows[i]), values + i * dim_, dim_ * sizeof(float));
}

void ShardStore::apply(const int64_t* rows, size_t n, const float* grads, uint64_t step,
                       double learning_rate) {
  for (size_t i = 0; i < n; ++i)
    optimizer_apply_row(options_, learning_rate, row_values(rows[i]),
                        slots_ ? row_state(rows[i]) : nullptr, grads + i * dim_, dim_, step);
}

}  // namespace px
