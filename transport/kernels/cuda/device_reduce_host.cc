// device_reduce's passes run on the host: the same checks, plan, pass arguments and
// per-element code (reduce_element.h) as the kernel, over host memory.
#include "transport/kernels/cuda/device_reduce.h"
#include "transport/kernels/cuda/reduce_plan.h"

namespace px::gpu {

bool emulate_device_reduce(const DeviceReduceArgs& args, std::string* why) {
  ReducePlan plan;
  if (!check_reduce_args(args, &plan, why)) return false;
  for (size_t p = 0; p < plan.passes; ++p) {
    PassArgs pass = reduce_pass_args(plan, args, p);
    visit_reduce_policy(args.dtype, args.op, [&]<typename P>() {
      for (size_t i = 0; i < args.count; ++i) reduce_element<P>(pass, i);
    });
  }
  return true;
}

}  // namespace px::gpu
