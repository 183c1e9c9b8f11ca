// Allreduce of a dense variable whose local workers gave device memory (px_alloc_ex
// regions the daemon mapped): the GPU backend reduces them on the device into the first
// worker's output and copies it to the others (gpu_backend.h, DeviceAllreduce), on the
// pool; the workers' requests complete once the results are in their memory. One node
// only so far: across nodes (NCCL, or the host ring through pinned memory) is not built.
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
