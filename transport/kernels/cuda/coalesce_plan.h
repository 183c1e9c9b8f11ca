// How a GPU coalescing runs, decided on the host: its checks, the sort's bit range, the
// layout of its scratch and the launch geometry. Plain C++, unit-tested without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/kernels/cuda/device_coalesce.h"
#include "transport/kernels/cuda/launch_geometry.h"

namespace px::gpu {

// Alignment of each scratch array (CUB's temporary storage wants 256 bytes).
constexpr size_t kScratchAlign = 256;

struct CoalescePlan {
  int end_bit = 64;         // the sort reads key bits [0, end_bit)
  LaunchGeometry entries;   // kernels over the n entries (positions, index check)
  LaunchGeometry segments;  // the segment sum: up to n runs of dim columns
};

// The key bits a sort must read for indices in [0, row_limit): 64 when row_limit is 0
// (any int64), else the width of row_limit - 1, at least 1.
int coalesce_sort_bits(uint64_t row_limit);

// Checks n (up to kMaxCoalesceEntries), dim (>= 1) and n x dim floats within size_t.
bool plan_coalesce(size_t n, size_t dim, uint64_t row_limit, CoalescePlan* plan, std::string* why);

// plan_coalesce, then the pointers (scratch size is checked against the layout by
// device_coalesce, which alone knows CUB's share).
bool check_coalesce_args(const DeviceCoalesceArgs& args, CoalescePlan* plan, std::string* why);

// Byte offsets of the arrays in the scratch of a coalescing of n entries, each aligned to
// kScratchAlign, and its total; cub_temp_bytes is the largest temporary storage CUB's sort,
// run-length encoding and scan asked for.
struct CoalesceLayout {
  size_t sorted_keys = 0;       // int64 x n
  size_t positions = 0;         // uint32 x n: 0..n-1, the sort's values
  size_t sorted_positions = 0;  // uint32 x n
  size_t counts = 0;            // uint32 x n: run lengths
  size_t offsets = 0;           // uint32 x n: run starts
  size_t num_runs = 0;          // int64
  size_t first_bad = 0;         // uint64 (atomicMin target)
  size_t cub_temp = 0;          // cub_temp_bytes
  size_t total = 0;
};
bool coalesce_layout(size_t n, size_t cub_temp_bytes, CoalesceLayout* layout, std::string* why);

}  // namespace px::gpu
