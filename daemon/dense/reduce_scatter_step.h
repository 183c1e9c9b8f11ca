// Reduce-scatter of a dense variable (px_reduce_scatter): each worker's input holds a block
// per global rank, and rank r's output gets block r reduced over every worker. On one node
// each output is reduced straight from the workers' inputs. On a cluster the node's
// workers are reduced locally first (every block), then a ring reduce-scatter between the
// nodes (each node's segment is its workers' blocks) leaves each node its own blocks, which
// go to its workers' outputs.
#pragma once

#include <memory>

#include "daemon/common/job.h"
#include "daemon/dense/step_context.h"

namespace px {

// Runs one complete local step (every local worker's contribution is in pending). Loop
// thread only; completes every contribution.
void run_reduce_scatter_step(const StepContext& context, std::shared_ptr<Job> job, Variable& var,
                             uint64_t step, PendingStep pending);

}  // namespace px
