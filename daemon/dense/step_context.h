// What a dense step's executor (allreduce_step, copy_step) needs from the scheduler that
// starts it: one struct, so a new collective's executor takes the same three things.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "daemon/common/offload.h"
#include "daemon/gpu/gpu_backend.h"
#include "transport/collectives/collective_transport.h"

namespace px {

class Job;

struct StepContext {
  const Offload& offload;                 // the scheduler's, which outlives every step
  CollectiveTransport* fabric = nullptr;  // null on a single node
  size_t chunk_bytes = 1 << 20;           // the cross-node collectives' chunk
  gpu::GpuBackend* gpu = nullptr;         // null without a usable GPU (device steps)
  // Fails the job here and on every other node (Server::abort_job): for a step that failed
  // on this node where the other nodes wait in its cross-node stage. Null: nothing to do.
  std::function<void(Job& job, const std::string& why)> abort_job;
};

}  // namespace px
