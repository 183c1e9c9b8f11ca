// device_coalesce's semantics on the host, over host memory: the same checks, a stable sort
// by index (what CUB's LSD radix sort is), runs, and the kernel's own segment_sum_column.
#include <algorithm>
#include <numeric>
#include <vector>

#include "transport/kernels/cuda/coalesce_plan.h"
#include "transport/kernels/cuda/device_coalesce.h"
#include "transport/kernels/cuda/segment_sum.h"

namespace px::gpu {

bool emulate_device_coalesce(const DeviceCoalesceArgs& a, std::string* why) {
  CoalescePlan plan;
  if (!check_coalesce_args(a, &plan, why)) return false;
  int64_t first_bad = -1;
  if (a.row_limit > 0) {
    for (size_t i = 0; i < a.n && first_bad < 0; ++i)
      if (static_cast<uint64_t>(a.indices[i]) >= a.row_limit) first_bad = static_cast<int64_t>(i);
  }
  if (a.out_first_bad) *a.out_first_bad = first_bad;
  if (first_bad >= 0 || a.n == 0) {
    *a.out_unique = 0;
    return true;
  }
  std::vector<uint32_t> positions(a.n);
  std::iota(positions.begin(), positions.end(), 0u);
  std::stable_sort(positions.begin(), positions.end(),
                   [&](uint32_t x, uint32_t y) { return a.indices[x] < a.indices[y]; });
  int64_t runs = 0;
  for (size_t begin = 0; begin < a.n;) {
    size_t end = begin + 1;
    while (end < a.n && a.indices[positions[end]] == a.indices[positions[begin]]) ++end;
    a.out_indices[runs] = a.indices[positions[begin]];
    for (size_t c = 0; c < a.dim; ++c)
      a.out_grads[static_cast<size_t>(runs) * a.dim + c] = segment_sum_column(
          positions.data() + begin, static_cast<uint32_t>(end - begin), a.grads, a.dim, c);
    ++runs;
    begin = end;
  }
  *a.out_unique = runs;
  return true;
}

}  // namespace px::gpu
