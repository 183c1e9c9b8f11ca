#include "transport/kernels/cuda/coalesce_plan.h"

#include <bit>
#include <limits>
#include <utility>

#include "transport/kernels/cuda/plan_failure.h"

namespace px::gpu {
namespace {

// Appends an array of bytes to the layout at *end, aligned; false if size_t would wrap.
bool place(size_t* end, size_t bytes, size_t* offset) {
  constexpr size_t kMax = std::numeric_limits<size_t>::max();
  size_t start = *end;
  if (start % kScratchAlign != 0) {
    size_t pad = kScratchAlign - start % kScratchAlign;
    if (start > kMax - pad) return false;
    start += pad;
  }
  if (bytes > kMax - start) return false;
  *offset = start;
  *end = start + bytes;
  return true;
}

}  // namespace

int coalesce_sort_bits(uint64_t row_limit) {
  if (row_limit == 0) return 64;
  int bits = static_cast<int>(std::bit_width(row_limit - 1));
  return bits < 1 ? 1 : bits;
}

bool plan_coalesce(size_t n, size_t dim, uint64_t row_limit, CoalescePlan* plan, std::string* why) {
  if (n > kMaxCoalesceEntries)
    return plan_failure(why, "gpu coalesce: " + std::to_string(n) + " entries, at most " +
                                 std::to_string(kMaxCoalesceEntries));
  if (dim == 0) return plan_failure(why, "gpu coalesce: rows of 0 columns");
  if (n > 0 && dim > std::numeric_limits<size_t>::max() / sizeof(float) / n)
    return plan_failure(why, "gpu coalesce: " + std::to_string(n) + " x " + std::to_string(dim) +
                                 " gradients overflow the address space");
  CoalescePlan p;
  p.end_bit = coalesce_sort_bits(row_limit);
  p.entries = elementwise_geometry(n);
  p.segments = segment_geometry(n, dim);
  *plan = p;
  return true;
}

bool check_coalesce_args(const DeviceCoalesceArgs& a, CoalescePlan* plan, std::string* why) {
  if (!plan_coalesce(a.n, a.dim, a.row_limit, plan, why)) return false;
  if (!a.out_unique) return plan_failure(why, "gpu coalesce: null out_unique");
  if (a.n == 0) return true;
  if (!a.indices || !a.grads) return plan_failure(why, "gpu coalesce: null indices or gradients");
  if (!a.out_indices || !a.out_grads) return plan_failure(why, "gpu coalesce: null outputs");
  return true;
}

bool coalesce_layout(size_t n, size_t cub_temp_bytes, CoalesceLayout* layout, std::string* why) {
  if (n > kMaxCoalesceEntries)
    return plan_failure(why, "gpu coalesce: " + std::to_string(n) + " entries, at most " +
                                 std::to_string(kMaxCoalesceEntries));
  CoalesceLayout l;
  size_t end = 0;
  bool ok = place(&end, n * sizeof(int64_t), &l.sorted_keys) &&
            place(&end, n * sizeof(uint32_t), &l.positions) &&
            place(&end, n * sizeof(uint32_t), &l.sorted_positions) &&
            place(&end, n * sizeof(uint32_t), &l.counts) &&
            place(&end, n * sizeof(uint32_t), &l.offsets) &&
            place(&end, sizeof(int64_t), &l.num_runs) &&
            place(&end, sizeof(uint64_t), &l.first_bad) && place(&end, cub_temp_bytes, &l.cub_temp);
  if (!ok)
    return plan_failure(why, "gpu coalesce: scratch of " + std::to_string(cub_temp_bytes) +
                                 " temporary bytes overflows the address space");
  l.total = end;
  *layout = l;
  return true;
}

}  // namespace px::gpu
