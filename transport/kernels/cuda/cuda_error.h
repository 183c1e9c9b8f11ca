// Internal to transport/kernels/cuda (needs the CUDA headers): a CUDA runtime error as the
// why of a failed call, e.g. "gpu reduce: launch: cudaErrorNoDevice: no CUDA-capable device
// is detected".
#pragma once

#include <cuda_runtime_api.h>

#include <string>

namespace px::gpu {

inline std::string cuda_error_text(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

// why = "what: cudaErrorX: text"; false. Clears the thread's last error too, so a failure
// handled here is not reported again by the next launch check (cudaGetLastError) on it.
inline bool cuda_failed(std::string* why, const char* what, cudaError_t err) {
  if (why) *why = std::string(what) + ": " + cuda_error_text(err);
  cudaGetLastError();
  return false;
}

}  // namespace px::gpu
