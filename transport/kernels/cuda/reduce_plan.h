// How a GPU reduction runs, decided on the host: its checks, its passes of at most
// kSourcesPerPass sources, where the running values wait between passes, and the launch
// geometry. Plain C++, shared by the kernel's launcher and its host emulation.
#pragma once

#include <cstddef>
#include <string>

#include "transport/kernels/cuda/device_reduce.h"
#include "transport/kernels/cuda/launch_geometry.h"
#include "transport/kernels/cuda/reduce_element.h"

namespace px::gpu {

struct ReducePlan {
  size_t passes = 0;  // launches; 0 when count is 0
  size_t elem_size = 0;
  bool carry_in_scratch = false;  // the carry between passes is an f32/i64 scratch array
  size_t scratch_bytes = 0;       // device scratch needed (0 unless passes > 1 and above)
  unsigned mean_divisor = 1;
  LaunchGeometry geometry;
};

// Checks dtype, op, nsrc (1..kMaxReduceSources) and count (count x element size, and the
// scratch, within size_t) and fills plan; pointers are not looked at.
bool plan_reduce(DType dtype, ReduceOp op, size_t nsrc, size_t count, unsigned mean_divisor,
                 ReducePlan* plan, std::string* why);

// plan_reduce, then the pointers: a null dst or source (unless count is 0), a source other
// than srcs[0] overlapping dst, srcs[0] overlapping dst without being dst, missing or short
// scratch.
bool check_reduce_args(const DeviceReduceArgs& args, ReducePlan* plan, std::string* why);

// The arguments of pass p (0..plan.passes-1) of the reduction args describes.
PassArgs reduce_pass_args(const ReducePlan& plan, const DeviceReduceArgs& args, size_t p);

}  // namespace px::gpu
