// Broadcast and allgather(v) of a dense variable: steps that only move bytes. Locally they
// are copies between the workers' arenas; across nodes one collective runs on the first
// local worker's output (a chain broadcast, or a ring allgatherv of the nodes' blocks), and
// its result is copied to the other local workers.
#pragma once

#include <functional>
#include <memory>

#include "daemon/common/job.h"
#include "daemon/dense/step_context.h"

namespace px {

// Runs one complete local step (every local worker's contribution is in pending). Loop
// thread only; completes every contribution.
void run_copy_step(const StepContext& context, std::shared_ptr<Job> job, Variable& var,
                   uint16_t opcode, uint64_t step, PendingStep pending);

}  // namespace px
