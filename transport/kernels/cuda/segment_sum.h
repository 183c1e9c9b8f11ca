// One value of a coalesced push: column c of a run of equal indices, summed over their rows
// in position order (the first copied, each later one added), as RowPlan::sum_group sums
// one batch. Compiled for the device (device_coalesce.cu) and the host (its emulation).
#pragma once

#include <cstddef>
#include <cstdint>

#include "transport/kernels/cuda/float_rules.h"

namespace px::gpu {

PX_HOST_DEVICE inline float segment_sum_column(const uint32_t* positions, uint32_t len,
                                               const float* grads, size_t dim, size_t c) {
  float acc = grads[static_cast<size_t>(positions[0]) * dim + c];
  for (uint32_t j = 1; j < len; ++j)
    acc = host_add(acc, grads[static_cast<size_t>(positions[j]) * dim + c]);
  return acc;
}

}  // namespace px::gpu
