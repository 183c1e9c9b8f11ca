// Coalescing of one sparse push on the GPU, before it leaves the device: (indices, rows of
// gradients) with duplicates -> the unique indices, ascending, each with the sum of its
// rows, so only unique rows cross PCIe. Stream-ordered; CUB's radix sort on (index,
// position), run-length encoding and a scan, then a segment-sum kernel. Plain C++: no CUDA
// type crosses this header (a stream is a void*).
//
// Summation order: the sort is stable, so a unique index's rows are summed in the order of
// their positions in the push, the first copied and each later one added, exactly as
// sharding's coalesce()/RowPlan sums one batch: the result is coalesce({that push})'s, bit
// for bit (NaN bits too, except where two NaNs meet; see float_rules.h). The daemon's host
// coalescing of several workers' pushes adds each index's entries one by one, in worker
// order; coalescing the workers' device results on the host instead adds each worker's
// partial sum. That is the same sum unless a worker other than the first holding an index
// holds it more than once: its entries are then added to each other before being added to
// the running sum, which can round differently (fp association). Entries holding NaN/Inf
// are summed, not skipped (the host path's skip_nonfinite is not done here).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/kernels/cuda/device_reduce.h"  // Stream

namespace px::gpu {

// Entries of one push at most: CUB's item counts are int, positions 32-bit.
constexpr size_t kMaxCoalesceEntries = 0x7fffffff;

struct DeviceCoalesceArgs {
  const int64_t* indices = nullptr;  // device, n
  const float* grads = nullptr;      // device, n x dim, row-major
  size_t n = 0;
  size_t dim = 0;  // >= 1
  // > 0: every index must lie in [0, row_limit) (the variable's rows); the sort then reads
  // only the bits below row_limit, and any index outside empties the result (*out_unique 0)
  // and puts the first such position in *out_first_bad. 0: any int64, sorted on 64 bits.
  uint64_t row_limit = 0;
  int64_t* out_indices = nullptr;    // device, room for n: unique indices, ascending
  float* out_grads = nullptr;        // device, room for n x dim: their summed rows
  int64_t* out_unique = nullptr;     // device, 1 value: how many unique indices
  int64_t* out_first_bad = nullptr;  // device, 1 value, optional: first bad position or -1
  void* scratch = nullptr;           // device, device_coalesce_scratch_bytes() bytes
  size_t scratch_bytes = 0;
  Stream stream = nullptr;
};

// Scratch bytes device_coalesce needs for n entries and this row_limit (CUB's needs are
// asked of the current device: false with why without one).
bool device_coalesce_scratch_bytes(size_t n, uint64_t row_limit, size_t* bytes, std::string* why);

// Enqueues the coalescing on args.stream; *out_unique and the outputs are valid once the
// stream reaches that point (inputs and scratch must live until then). Nothing waits on
// the host: the unique count stays on the device until the caller copies it. False with why on
// invalid arguments (nothing enqueued), short scratch, or a failed launch (no device, a build
// without CUDA).
bool device_coalesce(const DeviceCoalesceArgs& args, std::string* why);

// The same checks and semantics on the host over host memory (std::stable_sort for CUB's
// stable radix sort, the kernel's own segment-sum code); scratch is not used.
bool emulate_device_coalesce(const DeviceCoalesceArgs& args, std::string* why);

}  // namespace px::gpu
