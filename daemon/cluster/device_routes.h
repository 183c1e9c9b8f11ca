// The coordinator's agreement on how a dense variable's allreduce crosses nodes when its
// buffers are device memory, in a job whose every node can run NCCL (JobWorld's
// device_routes): without sockets, as agreement.h, so every rule is tested without a network
// (tests/unit/test_device_routes.cc); Cluster turns reports into calls here and answers
// into messages.
//
// Route: on a variable's first cross-node allreduce each node reports what its part is
// (NodeDevice). Once all did, the variable goes over NCCL if every node's part is in device
// memory, every node has the same NCCL, and no two nodes reduce on one GPU (NCCL takes one
// rank per GPU); else over the host ring through pinned memory, with the reason. NCCL
// variables whose nodes reduce on the same GPUs (a device set) share one communicator of
// the job's run: the first such route carries a fresh unique id, made here on node 0 (rank
// 0 of every communicator), and every node creates the communicator from it.
//
// Turns: NCCL requires every rank to issue a communicator's operations in one order, while
// each node's workers finish their parts of steps in their own order. So a node whose part
// of an NCCL step is ready says so, and the coordinator, once every node did, hands the step
// its turn: the next number of the run. Turns reach every node in that order (one TCP
// connection each) and each node issues the steps in it, as Horovod's coordinator orders
// its tensors.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace px {

// One node's part of a variable's first cross-node allreduce, as the route needs it.
struct NodeDevice {
  bool device = false;     // in device memory (else host memory: the host ring)
  std::string machine;     // the machine (host name and boot id): two daemons of one
                           // machine may reduce on one GPU
  std::string pci_bus_id;  // the GPU that holds the node's sum
  std::string nccl;        // the daemon's NCCL version; "" without NCCL
};

class DeviceRoutes {
 public:
  struct Route {
    uint32_t run = 0;  // the job run's barrier id
    uint32_t var = 0;  // the variable's global id
    bool nccl = false;
    uint32_t comm = 0;      // NCCL: the run's communicator for the variable, from 1
    std::string unique_id;  // NCCL, the communicator's first route only: create it from this
    std::string why;        // the host ring: why not NCCL, naming nodes
  };
  struct Turn {
    uint32_t run = 0;
    uint32_t var = 0;
    uint64_t step = 0;
    uint64_t turn = 0;  // 0, 1, 2, ... within the run
  };
  // make_id: a fresh NCCL unique id (GpuBackend::nccl_unique_id), or false with why.
  using MakeId = std::function<bool(std::string* id, std::string* why)>;

  DeviceRoutes(int node_count, std::function<std::string(int node)> node_label, MakeId make_id);

  // A run of a job with device routes started (JobWorld): only its reports are taken.
  void run_started(uint32_t run) { runs_[run]; }
  // Node `node` reported its part of `var`'s first cross-node allreduce in `run`. Once every
  // node did: the route, for every node. A second report from a node, or a report for a run
  // not started or a variable already routed, is ignored.
  std::optional<Route> reported(int node, uint32_t run, uint32_t var, const NodeDevice& part);
  // Node `node`'s part of `step` of NCCL variable `var` is ready. Once every node's is: the
  // step's turn, for every node. Ignored for a variable not routed over NCCL in a started
  // run.
  std::optional<Turn> ready(int node, uint32_t run, uint32_t var, uint64_t step);
  // The run ended everywhere (JobEnd): its routes, communicators and turns are forgotten.
  void run_ended(uint32_t run) { runs_.erase(run); }
  // The cluster re-formed, on node_count nodes (fewer with membership on etcd, after a loss;
  // nodes are then the epoch's ranks): every run of the earlier epoch is gone.
  void reset(int node_count) {
    runs_.clear();
    node_count_ = node_count;
  }
  // Runs with state (for tests and leak checks).
  size_t runs() const { return runs_.size(); }

 private:
  struct Run {
    std::map<uint32_t, std::vector<std::optional<NodeDevice>>> reports;  // by var, undecided
    std::map<std::vector<std::string>, uint32_t> comms;                  // by device set
    std::map<std::pair<uint32_t, uint64_t>, std::vector<bool>> ready;    // by (var, step)
    std::map<uint32_t, bool> routed;                                     // var: over NCCL
    uint64_t next_turn = 0;
  };
  // "" when the parts may meet in NCCL, else why not.
  std::string why_not_nccl(const std::vector<std::optional<NodeDevice>>& parts) const;

  int node_count_;
  std::function<std::string(int)> node_label_;
  MakeId make_id_;
  std::map<uint32_t, Run> runs_;
};

}  // namespace px
