#include "daemon/dense/cross_node_route.h"

#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include "daemon/common/log.h"
#include "daemon/common/loop_thread.h"
#include "daemon/common/serial_queue.h"

namespace px {

// The job's communicators on this node, by the coordinator's number, and the one queue all
// their work runs on, on the pool, one task at a time: opening a communicator, the NCCL
// steps in turn order (across communicators too: NCCL warns that operations of two
// communicators on one GPU, issued in different orders on different ranks, can deadlock),
// and freeing them. So a job's NCCL work holds one pool thread at most.
struct NcclComms {
  struct Comm {
    int device = -1;
    std::atomic<bool> aborted{false};  // the job ended: an open or a step under way returns
    std::mutex mutex;  // the open task (pool) sets comm, abort_communicators (loop) reads it
    std::unique_ptr<gpu::NcclCommunicator> comm;
    std::string failed;  // why it could not be opened
  };
  std::shared_ptr<SerialQueue> queue;
  std::map<uint32_t, std::shared_ptr<Comm>> by_id;
};

namespace {

using State = CrossNodeRoute::State;

std::string var_label(const Job& job, const Variable& var) {
  return "job '" + job.name() + "' variable '" + var.name + "'";
}

void abort_communicators_of(NcclComms& comms) {
  for (auto& [id, comm] : comms.by_id) {
    comm->aborted = true;
    std::lock_guard<std::mutex> lock(comm->mutex);
    if (comm->comm) comm->comm->abort();
  }
}

void release(std::vector<CrossNodeRoute::Waiter> waiters, px_status status,
             const std::string& why) {
  for (auto& w : waiters) w(status, why);
}

}  // namespace

void with_cross_node_route(const StepContext& context, const std::shared_ptr<Job>& job,
                           Variable& var, int device, CrossNodeRoute::Waiter then) {
  PX_ASSERT_LOOP_THREAD();
  CrossNodeRoute& route = var.route;
  if (!route_pending(context, *job, var)) return then(PX_OK, "");
  if (var.poison_status != PX_OK) return then(var.poison_status, var.poison_message);
  if (!job->broken().empty()) return then(PX_ERR_PEER_LOST, job->broken());
  route.agreeing.push_back(std::move(then));
  if (route.state == State::kAgreeing) return;
  if (var.global_id == 0) {  // the nodes have not all registered it yet: report once they did
    if (route.agreeing.size() == 1)
      var.awaiting_global_id.push_back([context, job, &var, device] {
        auto waiting = std::move(var.route.agreeing);
        var.route.agreeing.clear();
        for (auto& w : waiting) with_cross_node_route(context, job, var, device, std::move(w));
      });
    return;
  }
  route.state = State::kAgreeing;
  route.device = device;
  NodeDevice part;
  part.device = device >= 0;
  part.machine = context.routes->machine();
  if (device >= 0 && context.gpu) {
    const gpu::GpuInventory& inventory = context.gpu->inventory();
    for (const gpu::GpuDevice& d : inventory.devices)
      if (d.ordinal == device) part.pci_bus_id = d.pci_bus_id;
    part.nccl = inventory.nccl;
  }
  context.routes->report_route(*job, var, part);
}

void route_decided(const StepContext& context, const std::shared_ptr<Job>& job, Variable& var,
                   const DeviceRoutes::Route& decided) {
  PX_ASSERT_LOOP_THREAD();
  CrossNodeRoute& route = var.route;
  if (route.state != State::kAgreeing) {
    // Its run ended or broke here first (the state moved on), or a duplicate.
    PX_LOG_DEBUG("%s: a route from the coordinator no step waits for; ignored",
                 var_label(*job, var).c_str());
    return;
  }
  if (!job->broken().empty() || !job->departed().empty()) {
    // Too late: no step of this run can use it, and a communicator opened now would keep a
    // pool thread in ncclCommInitRank for nothing.
    route.state = State::kHostRing;
    route.why = "the job's run broke or lost a worker before the route came";
    return;
  }
  route.comm = decided.comm;
  route.why = decided.why;
  route.state = decided.nccl ? State::kNccl : State::kHostRing;
  if (!decided.nccl) {
    PX_LOG_INFO("%s: device allreduces cross nodes on the host ring, not NCCL: %s",
                var_label(*job, var).c_str(), decided.why.c_str());
  } else {
    PX_LOG_INFO("%s: device allreduces cross nodes over NCCL (communicator %u%s)",
                var_label(*job, var).c_str(), decided.comm,
                decided.unique_id.empty() ? "" : ", new");
  }
  if (decided.nccl && !decided.unique_id.empty()) {
    auto& comms = job->nccl_comms();
    if (!comms) {
      comms = std::make_shared<NcclComms>();
      comms->queue = std::make_shared<SerialQueue>(context.offload.pool(), context.offload.post());
    }
    auto comm = std::make_shared<NcclComms::Comm>();
    comm->device = route.device;
    comms->by_id[decided.comm] = comm;
    gpu::GpuBackend* backend = context.gpu;
    const JobWorld& world = job->world();
    int ranks = world.node_count, rank = world.node_index, timeout = context.nccl_timeout_ms;
    std::string id = decided.unique_id;
    std::string label = var_label(*job, var);
    comms->queue->push(
        true,
        [comm, backend, ranks, rank, timeout, id] {
          std::unique_ptr<gpu::NcclCommunicator> opened;
          std::string why;
          bool ok = backend ? backend->nccl_open(comm->device, ranks, rank, id, timeout,
                                                 &comm->aborted, &opened, &why)
                            : (why = "this parallaxd has no usable GPU", false);
          std::lock_guard<std::mutex> lock(comm->mutex);
          if (ok && comm->aborted) opened->abort();
          comm->comm = std::move(opened);
          if (!ok) comm->failed = "opening the NCCL communicator: " + why;
        },
        [comm, label, context, job] {
          // Aborted: the job failed or its run ended, which ended or ends it everywhere.
          if (comm->failed.empty() || comm->aborted) return;
          // Every node opens it together: where it failed, the others cannot use it either.
          PX_LOG_ERROR("%s: %s", label.c_str(), comm->failed.c_str());
          end_job_for_local_failure(context, *job, label + ": " + comm->failed);
        });
  }
  auto waiting = std::move(route.agreeing);
  route.agreeing.clear();
  release(std::move(waiting), PX_OK, "");
}

void await_turn(const StepContext& context, const std::shared_ptr<Job>& job, Variable& var,
                uint64_t step, CrossNodeRoute::Waiter on_turn) {
  PX_ASSERT_LOOP_THREAD();
  if (var.poison_status != PX_OK) return on_turn(var.poison_status, var.poison_message);
  if (!job->broken().empty()) return on_turn(PX_ERR_PEER_LOST, job->broken());
  if (!job->nccl_comms())  // created with the first NCCL route: gone, the run ended here
    return on_turn(PX_ERR_PEER_LOST, "the job's NCCL communicators are gone (its run ended here)");
  var.route.awaiting_turn[step] = std::move(on_turn);
  context.routes->report_ready(*job, var, step);
}

bool turn_arrived(Variable& var, uint64_t step) {
  PX_ASSERT_LOOP_THREAD();
  auto it = var.route.awaiting_turn.find(step);
  if (it == var.route.awaiting_turn.end()) return false;
  auto waiter = std::move(it->second);
  var.route.awaiting_turn.erase(it);
  waiter(PX_OK, "");
  return true;
}

void run_on_communicator(const std::shared_ptr<Job>& job, uint32_t comm_id, CommunicatorWork work,
                         CommunicatorDone then) {
  PX_ASSERT_LOOP_THREAD();
  auto& comms = job->nccl_comms();
  std::shared_ptr<NcclComms::Comm> comm;
  if (comms && comms->by_id.count(comm_id)) comm = comms->by_id[comm_id];
  if (!comm)
    return then(false, false,
                "NCCL communicator " + std::to_string(comm_id) + " was never created");
  auto outcome = std::make_shared<std::pair<bool, std::string>>(false, "");
  comms->queue->push(
      true,
      [comm, outcome, work = std::move(work)] {
        gpu::NcclCommunicator* c = nullptr;
        {
          std::lock_guard<std::mutex> lock(comm->mutex);
          c = comm->comm.get();
          if (!c) outcome->second = comm->failed.empty() ? "no NCCL communicator" : comm->failed;
        }
        if (c) outcome->first = work(*c, &outcome->second);
      },
      [comm, outcome, then = std::move(then)] {
        then(outcome->first, comm->aborted.load(), outcome->second);
      });
}

int communicator_device(Job& job, uint32_t comm) {
  auto& comms = job.nccl_comms();
  if (!comms) return -1;
  auto it = comms->by_id.find(comm);
  return it == comms->by_id.end() ? -1 : it->second->device;
}

void fail_route_waiters(Variable& var, px_status status, const std::string& why) {
  std::vector<CrossNodeRoute::Waiter> waiting = std::move(var.route.agreeing);
  var.route.agreeing.clear();
  for (auto& [step, waiter] : var.route.awaiting_turn) waiting.push_back(std::move(waiter));
  var.route.awaiting_turn.clear();
  // A route still being agreed stays so: the coordinator's answer may still come, and a
  // later step of a failed job fails anyway.
  release(std::move(waiting), status, why);
}

void abort_communicators(Job& job) {
  if (job.nccl_comms()) abort_communicators_of(*job.nccl_comms());
}

void end_device_routes(Job& job, px_status status, const std::string& why, bool free_on_pool) {
  for (auto& var : job.variables()) {
    fail_route_waiters(*var, status, why);
    // A route still to come opens nothing any more.
    if (var->route.state == State::kAgreeing) {
      var->route.state = State::kHostRing;
      var->route.why = "the job's run ended before its route came";
    }
  }
  std::shared_ptr<NcclComms> comms = std::move(job.nccl_comms());
  job.nccl_comms().reset();
  if (!comms) return;
  abort_communicators_of(*comms);
  if (!free_on_pool) {  // the daemon's exit: the loop is gone, nothing may post to it
    for (auto& [id, comm] : comms->by_id) {
      std::lock_guard<std::mutex> lock(comm->mutex);
      comm->comm.reset();
    }
    return;
  }
  // Freed on the pool after whatever of the job's NCCL work is still queued (it returns at
  // once, aborted): ncclCommAbort joins NCCL's threads, no work for the loop.
  // Each communicator is freed here even where a finished step's closure still holds its
  // Comm until that closure's `then` ran on the loop.
  auto queue = comms->queue;
  queue->push(
      true,
      [comms] {
        for (auto& [id, comm] : comms->by_id) {
          std::lock_guard<std::mutex> lock(comm->mutex);
          comm->comm.reset();
        }
      },
      [] {});
}

}  // namespace px
