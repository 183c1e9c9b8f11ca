// The cross-node stage of an allreduce: one node's local result (in host memory) summed
// with the other nodes' over the fabric. Shared by the host path (allreduce_step.cc, on
// the first local worker's output) and the device path (device_allreduce_step.cc, on the
// node's pinned staging buffer). Small buffers take recursive doubling, the rest the ring;
// every node picks the same, since the size is in the agreed fingerprint.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "daemon/common/job.h"
#include "daemon/dense/step_context.h"
#include "transport/kernels/dtype.h"

namespace px {

struct CrossNodeAllreduce {
  void* buffer = nullptr;  // in and out: this node's part before, the job's result after
  size_t count = 0;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;  // never kMean: a mean is summed, then divided by the caller
  uint8_t priority = 0;          // of the sends (PendingStep::priority)
};

// Called on the loop once the stage ended: PX_OK, or the variable's poison status, or
// PX_ERR_PEER_LOST, with a message naming the variable and step.
using CrossNodeDone = std::function<void(px_status status, const std::string& message)>;

// Starts the stage for step of var (variable 0: the job's barrier) over context.fabric;
// waits first, if need be, until every node registered var (Variable::global_id). job
// keeps var alive; buffer must stay valid until done. Loop thread only.
void start_cross_node_allreduce(const StepContext& context, const std::shared_ptr<Job>& job,
                                Variable& var, uint64_t step, const CrossNodeAllreduce& spec,
                                CrossNodeDone done);

}  // namespace px
