// Allreduce of a dense variable whose local workers gave device memory (px_alloc_ex
// regions the daemon mapped): the GPU backend reduces them on the device into the first
// worker's output and copies it to the others (gpu_backend.h, DeviceAllreduce), on the
// pool; the workers' requests complete once the results are in their memory. Across nodes
// the node's sum crosses PCIe into pinned host memory, takes the host path's cross-node
// stage (cross_node_allreduce.h) and crosses back: the host ring through pinned memory
// (NCCL communicators owned by the daemons are not built).
#pragma once

#include <cstdint>
#include <memory>

#include "daemon/common/job.h"
#include "daemon/dense/step_context.h"

namespace px {

// Called by run_allreduce_step when a contribution is device memory. Loop thread only;
// completes every contribution.
void run_device_allreduce_step(const StepContext& context, std::shared_ptr<Job> job, Variable& var,
                               uint64_t step, PendingStep pending);

}  // namespace px
