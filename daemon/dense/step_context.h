// What a dense step's executor (allreduce_step, copy_step) needs from the scheduler that
// starts it: one struct, so a new collective's executor takes the same three things.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "daemon/common/job.h"
#include "daemon/common/offload.h"
#include "daemon/gpu/gpu_backend.h"
#include "transport/collectives/collective_transport.h"

namespace px {

class RouteChannel;  // cross_node_route.h

struct StepContext {
  const Offload& offload;                 // the scheduler's, which outlives every step
  CollectiveTransport* fabric = nullptr;  // null on a single node
  size_t chunk_bytes = 1 << 20;           // the cross-node collectives' chunk
  gpu::GpuBackend* gpu = nullptr;         // null without a usable GPU (device steps)
  // Fails the job here and on every other node (Server::abort_job): for a step that failed
  // on this node where the other nodes wait in its cross-node stage. Null: nothing to do.
  std::function<void(Job& job, const std::string& why)> abort_job;
  // Jobs whose nodes can all run NCCL: how device allreduces agree on their route across
  // nodes (cross_node_route.h). Null: the host ring, nothing agreed.
  RouteChannel* routes = nullptr;
  int nccl_timeout_ms = 60000;  // an NCCL communicator's creation, and each of its steps
};

// A device step that failed on this node before its cross-node stage: on a cluster the
// other nodes would wait in that stage for this node's part, so the job ends everywhere
// (as a withdrawn step ends it). message names the step.
inline void end_job_for_local_failure(const StepContext& context, Job& job,
                                      const std::string& message) {
  if (context.fabric && job.world().node_count > 1 && context.abort_job)
    context.abort_job(job, message +
                               "; the other nodes cannot complete the step without this "
                               "node's share, so the job ends");
}

}  // namespace px
