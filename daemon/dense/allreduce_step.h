// Allreduce and barrier of a dense variable (the barrier is variable 0, with no data): the
// steps that reduce. Locally the workers' inputs are reduced into the first local worker's
// output (inline on the loop when small, in slices on the pool when large); on a cluster a
// ring allreduce across nodes then runs on that output (a barrier allreduces one word), and
// the result is copied to the other local workers' outputs. A mean is summed everywhere and
// divided once, by the global worker count.
#pragma once

#include <cstdint>
#include <memory>

#include "daemon/common/job.h"
#include "daemon/dense/step_context.h"

namespace px {

// Runs one complete local step (every local worker's contribution is in pending; admission
// checked their buffers). Loop thread only; completes every contribution.
void run_allreduce_step(const StepContext& context, std::shared_ptr<Job> job, Variable& var,
                        uint64_t step, PendingStep pending);

}  // namespace px
