// Alltoall of a dense variable (px_alltoall, px_alltoallv): each worker sends every global
// rank its block and receives a block from every rank. On one node the blocks are copied
// between the workers' arenas. On a cluster each node packs, per other node, its workers'
// blocks for that node's workers and sends them in one exchange (a counts header, then the
// blocks: transport/collectives/pairwise_exchange.h); the receiver checks the header against
// its workers' receive counts and unpacks.
#pragma once

#include <memory>

#include "daemon/common/job.h"
#include "daemon/dense/step_context.h"

namespace px {

// Runs one complete local step (every local worker's contribution is in pending). Loop
// thread only; completes every contribution.
void run_alltoall_step(const StepContext& context, std::shared_ptr<Job> job, Variable& var,
                       uint64_t step, PendingStep pending);

}  // namespace px
