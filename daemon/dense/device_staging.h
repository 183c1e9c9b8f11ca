// The pinned host buffer a device step's cross-node stage runs on (gpu_backend.h,
// HostStaging), shared by the device allreduce (device_allreduce_step.cc) and the device
// broadcast and allgather (copy_step.cc): one is kept per variable for its next step, since
// allocating one costs milliseconds, and a step holds it alone while it runs.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "daemon/common/job.h"
#include "daemon/gpu/gpu_backend.h"

namespace px {

// Loop thread: the variable's buffer, taken, if it holds bytes; else null.
inline std::shared_ptr<gpu::HostStaging> take_staging(Variable& var, size_t bytes) {
  if (!var.device_staging || var.device_staging->bytes() != bytes) return nullptr;
  return std::move(var.device_staging);
}

// Pool: *staging as it is, or a new one of bytes, pinned for device. False with why.
inline bool ensure_staging(gpu::GpuBackend& gpu, int device, size_t bytes,
                           std::shared_ptr<gpu::HostStaging>* staging, std::string* why) {
  if (*staging) return true;
  std::unique_ptr<gpu::HostStaging> fresh;
  if (!gpu.alloc_host(device, bytes, &fresh, why)) return false;
  *staging = std::move(fresh);
  return true;
}

// Loop thread, at the step's end: back to the variable, unless another step's already is.
inline void keep_staging(Variable& var, std::shared_ptr<gpu::HostStaging>* staging) {
  if (*staging && !var.device_staging) var.device_staging = std::move(*staging);
}

}  // namespace px
