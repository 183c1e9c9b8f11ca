// The dense layer's entry point: admits each submitted entry (admission.h), hands a step's
// entries to the matcher (step_matcher.h), and routes each complete step to its executor:
// allreduce and barrier to allreduce_step.h, broadcast and allgather(v) to copy_step.h,
// reduce-scatter to reduce_scatter_step.h, alltoall to alltoall_step.h, steps of sparse
// variables (and single sparse loads and reads) to the sparse router.
// Matching and execution live apart, so a new collective adds an executor and a route here
// and touches no matching.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "daemon/cluster/device_routes.h"
#include "daemon/common/completer.h"
#include "daemon/common/job.h"
#include "daemon/common/offload.h"
#include "daemon/dense/step_context.h"
#include "daemon/dense/step_matcher.h"
#include "daemon/gpu/gpu_backend.h"
#include "daemon/sparse/sparse_router.h"
#include "transport/collectives/collective_transport.h"
#include "transport/ipc/shm_layout.h"

namespace px {

class Scheduler {
 public:
  Scheduler(ThreadPool& pool, PostToLoop post) : offload_(pool, post), sparse_(pool, post) {}

  // Cross-node stage: every complete local step also runs its collective over transport.
  void set_cluster_transport(CollectiveTransport* transport, size_t chunk_bytes) {
    fabric_ = transport;
    chunk_bytes_ = chunk_bytes;
    sparse_.set_fabric(transport, chunk_bytes);
  }
  SparseRouter& sparse() { return sparse_; }
  // The GPU backend device steps run on (null: none; admission refuses device memory then,
  // since no worker could register any).
  void set_gpu(gpu::GpuBackend* backend) { gpu_ = backend; }
  // How a step that failed on this node ends the job on the others (StepContext::abort_job).
  void set_abort_job(std::function<void(Job&, const std::string&)> abort_job) {
    abort_job_ = std::move(abort_job);
  }
  // Jobs whose nodes can all run NCCL: how device allreduces agree on their route across
  // nodes (cross_node_route.h), and the deadline of an NCCL communicator's creation and steps.
  void set_routes(RouteChannel* routes, int nccl_timeout_ms) {
    routes_ = routes;
    nccl_timeout_ms_ = nccl_timeout_ms;
  }
  // The coordinator's route for var, and an NCCL step's turn (Cluster events). Loop thread.
  void route_decided(const std::shared_ptr<Job>& job, Variable& var,
                     const DeviceRoutes::Route& route);
  bool turn_arrived(Variable& var, uint64_t step);
  // The pool and the way back to the loop, for the front's blocking work (device mappings).
  const Offload& offload() const { return offload_; }

  // An entry from worker, local rank `rank` of the ready job: checked (admission.h), then
  // matched with the other local workers' entries of its step. Loop thread only.
  void submit(const std::shared_ptr<Job>& job, int rank, const std::shared_ptr<Completer>& worker,
              const SubmitEntry& entry);

  // Completes every pending contribution of the variable with status (the message gets the
  // variable and step appended) and forgets those steps; the sparse router fails the
  // variable's steps already running.
  void fail_variable(Variable& var, px_status status, const std::string& why);
  void fail_job(Job& job, px_status status, const std::string& why);
  // Only the variable's steps not started yet (a worker left cleanly: those under way can
  // finish).
  void fail_pending(Variable& var, px_status status, const std::string& why);

  // A worker's px_request_cancel (or a timed-out px_barrier): see withdraw_from_step.
  bool withdraw(Job& job, int local_rank, Completer& worker, uint64_t request_id,
                const std::string& reason, std::string* message);
  // See fail_stalled_steps.
  std::vector<StalledStep> fail_stalled(Job& job, int64_t now_ns, int64_t stall_ns);

 private:
  Offload offload_;
  CollectiveTransport* fabric_ = nullptr;
  size_t chunk_bytes_ = 1 << 20;
  gpu::GpuBackend* gpu_ = nullptr;
  std::function<void(Job&, const std::string&)> abort_job_;
  RouteChannel* routes_ = nullptr;
  int nccl_timeout_ms_ = 60000;
  SparseRouter sparse_;

  StepContext context() const {
    return StepContext{offload_,   fabric_, chunk_bytes_,    gpu_,
                       abort_job_, routes_, nccl_timeout_ms_};
  }
};

}  // namespace px
