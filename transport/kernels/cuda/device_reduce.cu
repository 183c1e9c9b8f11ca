// The reduction kernel: a grid-stride loop of reduce_element (reduce_element.h), one launch
// per pass of at most kSourcesPerPass sources, all on the caller's stream.
#include <cuda_runtime.h>

#include "transport/kernels/cuda/cuda_error.h"
#include "transport/kernels/cuda/device_reduce.h"
#include "transport/kernels/cuda/reduce_plan.h"

namespace px::gpu {
namespace {

template <typename P>
__global__ void reduce_kernel(PassArgs a, size_t count) {
  size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride)
    reduce_element<P>(a, i);
}

}  // namespace

bool device_reduce(const DeviceReduceArgs& args, std::string* why) {
  ReducePlan plan;
  if (!check_reduce_args(args, &plan, why)) return false;
  auto stream = static_cast<cudaStream_t>(args.stream);
  for (size_t p = 0; p < plan.passes; ++p) {
    PassArgs pass = reduce_pass_args(plan, args, p);
    cudaError_t err = cudaSuccess;
    visit_reduce_policy(args.dtype, args.op, [&]<typename P>() {
      reduce_kernel<P>
          <<<plan.geometry.blocks, plan.geometry.threads, 0, stream>>>(pass, args.count);
      err = cudaGetLastError();
    });
    if (err != cudaSuccess) return cuda_failed(why, "gpu reduce: launch", err);
  }
  return true;
}

}  // namespace px::gpu
