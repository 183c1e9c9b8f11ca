// The rows (and optimizer state) of the partitions one node owns, each partition one
// contiguous array of its rows. A store may hold only some columns of its rows (the
// column-wise alltoall route: column_split.h); its dim() is then that width, and what it
// gathers, loads and applies is that many values per row. Not thread-safe: the daemon
// serialises access per variable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "sharding/checkpoint.h"
#include "sharding/column_split.h"
#include "sharding/partition_map.h"
#include "sharding/sparse_spec.h"

namespace px {

class ShardStore {
 public:
  // Allocates and initialises every partition that map assigns to node: of a dim-wide
  // table, the columns `columns` (all of them when absent). initialise false: the values
  // and state are left zero for import_rows to fill (a table moving between routes, whose
  // every cell comes from the old layout).
  ShardStore(const PartitionMap& map, int node, size_t dim, const SparseOptions& options);
  ShardStore(const PartitionMap& map, int node, size_t dim, const SparseOptions& options,
             ColumnRange columns, bool initialise = true);

  // Within the table, too: a row past its end falls in an owned partition (row % P), and a
  // request from another node naming one was served from past that partition's array
  // (found by tests/fuzz/sparse_header_fuzz.cc; regressions/sparse_header).
  bool owns(int64_t row) const {
    return row >= 0 && static_cast<uint64_t>(row) < map_.rows() &&
           slot_of_[map_.partition_of(static_cast<uint64_t>(row))] >= 0;
  }
  uint32_t partition_of(int64_t row) const { return map_.partition_of(static_cast<uint64_t>(row)); }
  size_t dim() const { return dim_; }  // values held per row (the column range's width)
  size_t table_dim() const { return table_dim_; }
  const ColumnRange& columns() const { return columns_; }
  uint64_t owned_rows() const { return owned_rows_; }
  uint64_t bytes() const;
  size_t state_slots() const { return slots_; }

  // Every owned row (by global number) with its values and optimizer state.
  void export_rows(ShardFileData* out) const;
  // The same of one owned partition's rows.
  void export_partition(uint32_t partition, ShardFileData* out) const;
  // An owned row's values (dim) and optimizer state (slots x dim), as they are now.
  const float* values_of(int64_t row) const { return row_values(row); }
  const float* state_of(int64_t row) const { return const_cast<ShardStore*>(this)->row_state(row); }
  // Takes the values of data that fall in this store: the rows it owns, the columns it
  // holds (the rest belong to other nodes). Returns how many values (row x column cells) it
  // took. data must have this store's state slots and lie within the table's columns.
  uint64_t import_rows(const ShardView& data);

  // rows must all be owned here. out receives n x dim values.
  void gather(const int64_t* rows, size_t n, float* out) const;
  // Asks for a row (and its optimizer state) to be brought into cache: about to be applied.
  void prefetch(int64_t row);
  // Sets an owned row's values (dim) and optimizer state (slots x dim): a copy taking its
  // owner's rows after a step (daemon/sparse/shard_replica.h).
  void overwrite(int64_t row, const float* values, const float* state);
  // Overwrites rows (the last of equal rows wins); optimizer state is kept.
  void load(const int64_t* rows, size_t n, const float* values);
  // Applies aggregated gradients (n x dim, rows unique) with the optimizer; step is the
  // variable's 1-based count of applied push steps, learning_rate the push step's.
  void apply(const int64_t* rows, size_t n, const float* grads, uint64_t step,
             double learning_rate);

 private:
  struct Partition {
    std::vector<float> values;  // rows_in(p) x dim
    std::vector<float> state;   // rows_in(p) x slots x dim
  };
  float* row_values(int64_t row);
  const float* row_values(int64_t row) const;
  float* row_state(int64_t row);

  PartitionMap map_;
  size_t table_dim_;
  ColumnRange columns_;
  size_t dim_;
  SparseOptions options_;
  size_t slots_;
  uint64_t owned_rows_ = 0;
  std::vector<int32_t> slot_of_;  // by partition: index into partitions_, -1 if not owned
  std::vector<Partition> partitions_;
};

}  // namespace px
