// The runtime probe of a CUDA build (host code against the CUDA runtime API and NCCL).
#include "transport/kernels/cuda/device_probe.h"

#include <cuda_runtime_api.h>

#include "transport/kernels/cuda/cuda_error.h"
#if defined(PX_HAVE_NCCL)
#include <nccl.h>
#endif

namespace px::gpu {

bool built_with_cuda() {
  return true;
}

int cuda_device_count(std::string* why) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cuda_failed(why, "cudaGetDeviceCount", err);
    return 0;
  }
  if (count <= 0) {
    if (why) *why = "cudaGetDeviceCount: no CUDA device";
    return 0;
  }
  return count;
}

std::string nccl_version(std::string* why) {
#if defined(PX_HAVE_NCCL)
  int code = 0;
  ncclResult_t r = ncclGetVersion(&code);
  if (r != ncclSuccess) {
    if (why) *why = std::string("ncclGetVersion: ") + ncclGetErrorString(r);
    return "";
  }
  // NCCL_VERSION(X, Y, Z) is X * 10000 + Y * 100 + Z since 2.9.
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." +
         std::to_string(code % 100);
#else
  if (why) *why = "parallax was built without NCCL (not found next to the CUDA toolkit)";
  return "";
#endif
}

}  // namespace px::gpu
