// How a dense variable's allreduce crosses nodes when its buffers are device memory, on the
// member side: in a job whose every node can run NCCL (JobWorld::device_routes), each
// variable's first cross-node step agrees on its route with the other nodes through the
// coordinator (daemon/cluster/device_routes.h): NCCL where every node's part is device
// memory on its own GPU, the host ring through pinned memory otherwise. The route is the
// variable's for the job's run. An NCCL step then waits for its turn, the one order every
// node issues the communicator's operations in, and runs on the communicator's own serial
// queue. The daemon owns the communicators: created once per device set of the job's run
// (the first route naming one carries its unique id), aborted when the job fails.
//
// Outside such jobs nothing is agreed and nothing waits: the host ring, as before.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "daemon/cluster/device_routes.h"
#include "daemon/common/job.h"
#include "daemon/dense/step_context.h"

namespace px {

// How this node reaches the coordinator about routes (Server: through Cluster; tests: in
// process). Loop thread.
class RouteChannel {
 public:
  virtual ~RouteChannel() = default;
  // This machine, as NodeDevice::machine names it.
  virtual const std::string& machine() const = 0;
  virtual void report_route(const Job& job, const Variable& var, const NodeDevice& part) = 0;
  virtual void report_ready(const Job& job, const Variable& var, uint64_t step) = 0;
};

// Whether var's route across nodes is still to be agreed (with_cross_node_route would wait):
// only in a job with device routes, on a variable's first cross-node step. The hot path
// checks this before building a waiter.
inline bool route_pending(const StepContext& context, const Job& job, const Variable& var) {
  using State = CrossNodeRoute::State;
  return context.routes && job.world().device_routes && var.id != 0 &&
         var.route.state != State::kHostRing && var.route.state != State::kNccl;
}

// then(PX_OK, "") once var's route across nodes is known (var.route.state): at once outside
// a job with device routes (the host ring), else after the agreement, which this node's part
// (device memory on GPU `device`, or host memory: device < 0) joins. then(status, why) if
// the variable or job failed first. Loop thread.
void with_cross_node_route(const StepContext& context, const std::shared_ptr<Job>& job,
                           Variable& var, int device, CrossNodeRoute::Waiter then);

// The coordinator's route for var (Cluster event): kept, logged, a new communicator opened,
// the waiting steps released. Loop thread.
void route_decided(const StepContext& context, const std::shared_ptr<Job>& job, Variable& var,
                   const DeviceRoutes::Route& route);

// An NCCL step whose part is ready here: tells the coordinator, and on_turn(PX_OK) runs once
// the step's turn came (turn_arrived), or with the job's failure. Loop thread.
void await_turn(const StepContext& context, const std::shared_ptr<Job>& job, Variable& var,
                uint64_t step, CrossNodeRoute::Waiter on_turn);
// The coordinator's turn for step of var (Cluster event, in turn order). False if no step
// waited for it (the step failed here meanwhile). Loop thread.
bool turn_arrived(Variable& var, uint64_t step);

// work on the job's communicator `comm`, on the pool, after every earlier call's work (the
// job's NCCL queue: the turn order); then on the loop with its outcome. then's aborted: the
// communicator was aborted (the job failed or its run ended), so a failure is that, not
// this node's to report.
using CommunicatorWork = std::function<bool(gpu::NcclCommunicator& comm, std::string* why)>;
using CommunicatorDone = std::function<void(bool ok, bool aborted, const std::string& why)>;
void run_on_communicator(const std::shared_ptr<Job>& job, uint32_t comm, CommunicatorWork work,
                         CommunicatorDone then);
// The GPU the job's communicator `comm` is on, or -1 if there is none.
int communicator_device(Job& job, uint32_t comm);

// Fails every step of var waiting for its route or turn.
void fail_route_waiters(Variable& var, px_status status, const std::string& why);
// The job failed: its communicators are aborted (operations under way return, later ones
// fail).
void abort_communicators(Job& job);
// The job's run is over here (its workers left, or it ended everywhere): every step waiting
// for a route or turn fails with status and why, the communicators are aborted and freed on
// the pool (here with free_on_pool false: the daemon's exit, its loop gone), and the job
// holds none any more (which also ends the waiters' hold on it).
void end_device_routes(Job& job, px_status status, const std::string& why,
                       bool free_on_pool = true);

}  // namespace px
