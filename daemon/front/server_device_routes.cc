// Device routes on a cluster (daemon/dense/cross_node_route.h): the scheduler's
// RouteChannel over the cluster's control connections, and the cluster's routes and NCCL
// turns back to the scheduler.
#include <unistd.h>

#include <fstream>

#include "daemon/common/log.h"
#include "daemon/dense/cross_node_route.h"
#include "daemon/front/server.h"

namespace px {
namespace {

// "host/boot id": two daemons with one answer share the machine and may share a GPU (NCCL
// tells its processes' machines apart by the same two things).
std::string this_machine() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  return std::string(host) + "/" + boot;
}

}  // namespace

class Server::ClusterRoutes final : public RouteChannel {
 public:
  explicit ClusterRoutes(Server& server) : server_(server), machine_(this_machine()) {}
  const std::string& machine() const override { return machine_; }
  void report_route(const Job& job, const Variable& var, const NodeDevice& part) override {
    if (server_.cluster_)
      server_.cluster_->report_device_route(job.barrier_id(), var.global_id, part);
  }
  void report_ready(const Job& job, const Variable& var, uint64_t step) override {
    if (server_.cluster_)
      server_.cluster_->report_nccl_ready(job.barrier_id(), var.global_id, step);
  }

 private:
  Server& server_;
  std::string machine_;
};

bool Server::can_run_nccl() const {
  return config_.gpu_nccl && gpu_.backend() && gpu_.device_count() > 0 &&
         !gpu_.backend()->inventory().nccl.empty();
}

void Server::wire_device_routes(Cluster::Events& events) {
  route_channel_ = std::make_unique<ClusterRoutes>(*this);
  scheduler_.set_routes(route_channel_.get(), static_cast<int>(config_.nccl_timeout_ms));
  // On the coordinator, once per new communicator: ncclGetUniqueId opens NCCL's bootstrap
  // listener here (rank 0 is node 0), a few milliseconds on the loop.
  events.nccl_unique_id = [this](std::string* id, std::string* why) {
    if (!can_run_nccl()) {
      *why = "node 0 cannot run NCCL";
      return false;
    }
    return gpu_.backend()->nccl_unique_id(id, why);
  };
  events.device_route = [this](const DeviceRoutes::Route& route) {
    std::shared_ptr<Job> job = find_run(route.run);
    Variable* var = job ? job->find_global(route.var) : nullptr;
    if (var) scheduler_.route_decided(job, *var, route);
  };
  events.nccl_turn = [this](const DeviceRoutes::Turn& turn) {
    std::shared_ptr<Job> job = find_run(turn.run);
    Variable* var = job ? job->find_global(turn.var) : nullptr;
    if (!var || scheduler_.turn_arrived(*var, turn.step)) return;
    // Its run ended here (communicators aborted, or a worker left): nothing can be paired.
    if (!job->nccl_comms() || !job->departed().empty()) return;
    // The step failed here after it said it was ready: the other nodes issue it on the
    // communicator, and this node, issuing the next turn in its place, would pair another
    // variable's data with it. So the job ends (its communicators aborted) everywhere.
    abort_job(*job, "job '" + job->name() + "' variable '" + var->name + "': step " +
                        std::to_string(turn.step) + " failed on " + node_label() +
                        " after its NCCL turn was asked for");
  };
}

}  // namespace px
