// The device functions of a build without CUDA (no toolkit at configure time,
// -DPX_WITH_CUDA=OFF, or a sanitizer/fuzz build): each reports that, after the same
// argument checks as the CUDA build, so callers need no #ifdef.
#include "transport/kernels/cuda/coalesce_plan.h"
#include "transport/kernels/cuda/device_coalesce.h"
#include "transport/kernels/cuda/device_probe.h"
#include "transport/kernels/cuda/device_reduce.h"
#include "transport/kernels/cuda/reduce_plan.h"

namespace px::gpu {
namespace {

constexpr const char* kNoCuda =
    "parallax was built without CUDA (no CUDA toolkit at configure time, -DPX_WITH_CUDA=OFF, "
    "or a sanitizer build)";

bool unavailable(std::string* why, const char* what) {
  if (why) *why = std::string(what) + ": " + kNoCuda;
  return false;
}

}  // namespace

bool built_with_cuda() {
  return false;
}

int cuda_device_count(std::string* why) {
  if (why) *why = kNoCuda;
  return 0;
}

std::string nccl_version(std::string* why) {
  if (why) *why = kNoCuda;
  return "";
}

bool device_reduce(const DeviceReduceArgs& args, std::string* why) {
  ReducePlan plan;
  if (!check_reduce_args(args, &plan, why)) return false;
  return unavailable(why, "gpu reduce");
}

bool device_coalesce_scratch_bytes(size_t n, uint64_t row_limit, size_t* bytes, std::string* why) {
  CoalescePlan plan;
  if (!plan_coalesce(n, 1, row_limit, &plan, why)) return false;
  *bytes = 0;
  return unavailable(why, "gpu coalesce");
}

bool device_coalesce(const DeviceCoalesceArgs& args, std::string* why) {
  CoalescePlan plan;
  if (!check_coalesce_args(args, &plan, why)) return false;
  return unavailable(why, "gpu coalesce");
}

}  // namespace px::gpu
