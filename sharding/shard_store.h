// The rows (and optimizer state) of the partitions one node owns, each partition one
// contiguous array of its rows. Not thread-safe: the daemon serialises access per variable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "sharding/checkpoint.h"
#include "sharding/partition_map.h"
#include "sharding/sparse_spec.h"

namespace px {

class ShardStore {
 public:
  // Allocates and initialises every partition that map assigns to node.
  ShardStore(const PartitionMap& map, int node, size_t dim, const SparseOptions& options);

  // Within the table, too: a row past its end falls in an owned partition (row % P), and a
  // request from another node naming one was served from past that partition's array
  // (found by tests/fuzz/sparse_header_fuzz.cc; regressions/sparse_header).
  bool owns(int64_t row) const {
    return row >= 0 && static_cast<uint64_t>(row) < map_.rows() &&
           slot_of_[map_.partition_of(static_cast<uint64_t>(row))] >= 0;
  }
  uint32_t partition_of(int64_t row) const { return map_.partition_of(static_cast<uint64_t>(row)); }
  size_t dim() const { return dim_; }
  uint64_t owned_rows() const { return owned_rows_; }
  uint64_t bytes() const;
  size_t state_slots() const { return slots_; }

  // Every owned row (by global number) with its values and optimizer state.
  void export_rows(ShardFileData* out) const;
  // Takes the rows of data this store owns (the rest belong to other nodes); returns how
  // many. data must have this store's dim and state slots.
  uint64_t import_rows(const ShardFileData& data);

  // rows must all be owned here. out receives n x dim values.
  void gather(const int64_t* rows, size_t n, float* out) const;
  // Asks for a row (and its optimizer state) to be brought into cache: about to be applied.
  void prefetch(int64_t row);
  // Overwrites rows (the last of equal rows wins); optimizer state is kept.
  void load(const int64_t* rows, size_t n, const float* values);
  // Applies aggregated gradients (n x dim, rows unique) with the optimizer; step is the
  // variable's 1-based count of applied push steps.
  void apply(const int64_t* rows, size_t n, const float* grads, uint64_t step);

 private:
  struct Partition {
    std::vector<float> values;  // rows_in(p) x dim
    std::vector<float> state;   // rows_in(p) x slots x dim
  };
  float* row_values(int64_t row);
  const float* row_values(int64_t row) const;
  float* row_state(int64_t row);

  PartitionMap map_;
  size_t dim_;
  SparseOptions options_;
  size_t slots_;
  uint64_t owned_rows_ = 0;
  std::vector<int32_t> slot_of_;  // by partition: index into partitions_, -1 if not owned
  std::vector<Partition> partitions_;
};

}  // namespace px
