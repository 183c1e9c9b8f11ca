#include "transport/kernels/cuda/reduce_plan.h"

#include <cstdint>
#include <limits>
#include <utility>

#include "transport/kernels/cuda/plan_failure.h"

namespace px::gpu {
namespace {

// Whether [a, a + bytes) and [b, b + bytes) share a byte.
bool overlaps(const void* a, const void* b, size_t bytes) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y ? y - x < bytes : x - y < bytes;
}

}  // namespace

bool plan_reduce(DType dtype, ReduceOp op, size_t nsrc, size_t count, unsigned mean_divisor,
                 ReducePlan* plan, std::string* why) {
  if (!valid_dtype(static_cast<uint32_t>(dtype)))
    return plan_failure(
        why, "gpu reduce: invalid dtype " + std::to_string(static_cast<uint32_t>(dtype)));
  if (!valid_reduce_op(static_cast<uint32_t>(op)))
    return plan_failure(why, "gpu reduce: invalid op " + std::to_string(static_cast<uint32_t>(op)));
  if (nsrc < 1 || nsrc > kMaxReduceSources)
    return plan_failure(why, "gpu reduce: " + std::to_string(nsrc) + " sources, expected 1.." +
                                 std::to_string(kMaxReduceSources));
  ReducePlan p;
  p.elem_size = dtype_size(dtype);
  if (count > std::numeric_limits<size_t>::max() / p.elem_size)
    return plan_failure(why, "gpu reduce: " + std::to_string(count) + " elements of " +
                                 dtype_name(dtype) + " overflow the address space");
  size_t carry_size = 0;
  visit_reduce_policy(dtype, op, [&]<typename P>() {
    p.carry_in_scratch = P::kCarryInScratch;
    carry_size = sizeof(typename P::Carry);
  });
  p.mean_divisor = mean_divisor == 0 ? 1 : mean_divisor;
  if (count > 0) p.passes = (nsrc + kSourcesPerPass - 1) / kSourcesPerPass;
  if (p.passes > 1 && p.carry_in_scratch) {
    if (count > std::numeric_limits<size_t>::max() / carry_size)
      return plan_failure(why, "gpu reduce: the scratch for " + std::to_string(count) +
                                   " elements overflows the address space");
    p.scratch_bytes = count * carry_size;
  }
  p.geometry = elementwise_geometry(count);
  *plan = p;
  return true;
}

bool check_reduce_args(const DeviceReduceArgs& a, ReducePlan* plan, std::string* why) {
  if (!plan_reduce(a.dtype, a.op, a.nsrc, a.count, a.mean_divisor, plan, why)) return false;
  if (a.count == 0) return true;
  size_t bytes = a.count * plan->elem_size;
  if (!a.dst) return plan_failure(why, "gpu reduce: null destination");
  if (!a.srcs) return plan_failure(why, "gpu reduce: null source array");
  for (size_t k = 0; k < a.nsrc; ++k) {
    if (!a.srcs[k])
      return plan_failure(why, "gpu reduce: source " + std::to_string(k) + " is null");
    if (k == 0 && a.srcs[0] == a.dst) continue;  // in place
    if (overlaps(a.srcs[k], a.dst, bytes))
      return plan_failure(why, "gpu reduce: source " + std::to_string(k) +
                                   " overlaps the destination" +
                                   (k == 0 ? " without being it" : ""));
  }
  if (plan->scratch_bytes > 0 && (!a.scratch || a.scratch_bytes < plan->scratch_bytes))
    return plan_failure(why, "gpu reduce: " + std::to_string(a.nsrc) + " sources of " +
                                 dtype_name(a.dtype) + " " + reduce_op_name(a.op) + " need " +
                                 std::to_string(plan->scratch_bytes) + " bytes of scratch, given " +
                                 std::to_string(a.scratch ? a.scratch_bytes : 0));
  return true;
}

PassArgs reduce_pass_args(const ReducePlan& plan, const DeviceReduceArgs& args, size_t p) {
  PassArgs pa;
  size_t first = p * kSourcesPerPass;
  size_t n = args.nsrc - first < kSourcesPerPass ? args.nsrc - first : kSourcesPerPass;
  for (size_t k = 0; k < n; ++k) pa.src.ptr[k] = args.srcs[first + k];
  for (size_t k = n; k < kSourcesPerPass; ++k) pa.src.ptr[k] = nullptr;
  pa.nsrc = static_cast<unsigned>(n);
  pa.from_carry = p > 0;
  pa.to_carry = p + 1 < plan.passes;
  pa.carry = plan.carry_in_scratch ? args.scratch : args.dst;
  pa.dst = args.dst;
  pa.mean_divisor = plan.mean_divisor;
  return pa;
}

bool reduce_scratch_bytes(const DeviceReduceArgs& args, size_t* bytes, std::string* why) {
  ReducePlan plan;
  if (!plan_reduce(args.dtype, args.op, args.nsrc, args.count, args.mean_divisor, &plan, why))
    return false;
  *bytes = plan.scratch_bytes;
  return true;
}

}  // namespace px::gpu
