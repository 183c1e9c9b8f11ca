// A job: the local workers of one training run on this node, and the variables they share.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "daemon/common/completer.h"
#include "parallax_c.h"
#include "transport/ipc/shm_layout.h"
#include "transport/kernels/dtype.h"

namespace px {

struct SparseTable;
struct NcclComms;
namespace gpu {
class HostStaging;
}

// What every registrant of a variable must agree on.
struct Fingerprint {
  DType dtype = DType::kF32;
  uint64_t count = 0;  // elements; rows of a sparse variable
  ReduceOp op = ReduceOp::kSum;
  bool sparse = false;
  uint64_t dim = 0;     // sparse: values per row
  std::string options;  // sparse: SparseOptions::canonical(); dense: "" or dense_wire_option

  bool operator==(const Fingerprint&) const = default;
  uint64_t bytes() const { return count * dtype_size(dtype); }
  std::string describe() const;  // e.g. "f32[1024] sum", "sparse f32[1000x16] sgd(...) ..."
  // The words of describe() that differ from other's (all of them if the word counts
  // differ), so mismatch messages stay short enough to name every party.
  std::string describe_difference(const Fingerprint& other) const;
};

// A dense f32 variable's 16-bit wire between nodes (px_dense_options.wire_dtype), kept as
// its fingerprint's options ("wire=bf16") so that nodes agree on it with the rest.
std::string dense_wire_option(DType wire);         // "" for kF32
DType dense_wire(const Fingerprint& fingerprint);  // kF32 unless the options name one

// A sparse step's buffers staged by the daemon in host memory (the worker gave device
// memory: daemon/sparse/device_rows_step), read and written instead of in and out.
struct StagedRows {
  std::vector<int64_t> indices;
  std::vector<float> rows;   // indices.size() x dim
  px_status status = PX_OK;  // refused while staging (a bad index): the worker learns it
  std::string message;
};

struct Contribution {
  std::shared_ptr<Completer> worker;
  uint64_t request_id = 0;
  BufferRef in{};
  BufferRef out{};
  uint32_t root = 0;                   // broadcast: the root this worker named
  std::shared_ptr<StagedRows> staged;  // see StagedRows
};

// One step of one variable, collecting the local workers' submissions.
struct PendingStep {
  std::vector<std::optional<Contribution>> by_rank;
  uint32_t arrived = 0;
  int64_t first_ns = 0;
  // The highest px_op_options.priority of the local workers' entries: the priority of the
  // step's transfers (each node orders only its own sends, so nodes need not agree).
  uint8_t priority = 0;
  // Set when the step cannot succeed; later arrivals complete with it at once.
  px_status failure = PX_OK;
  std::string failure_message;
};

struct VarStats {
  uint64_t ops = 0;
  uint64_t bytes = 0;
  uint64_t wait_ns = 0;
  uint64_t reduce_ns = 0;
  // Dense: the route its last step took when that is not the plain host allreduce
  // ("gpu-local", "gpu-host-ring", "gpu-nccl": device memory); "" otherwise.
  const char* route = "";
};

// In a job whose every node can run NCCL (JobWorld::device_routes): how a dense variable's
// allreduce crosses nodes, agreed with the other nodes on its first cross-node step
// (daemon/dense/cross_node_route.h).
struct CrossNodeRoute {
  enum class State { kUnknown, kAgreeing, kHostRing, kNccl };
  State state = State::kUnknown;
  int device = -1;    // the GPU this node reported (its sum's), or -1: host memory
  uint32_t comm = 0;  // kNccl: the job's communicator
  std::string why;    // kHostRing: why not NCCL
  // Told PX_OK once the route, or an NCCL step's turn, is known; or the job's failure.
  using Waiter = std::function<void(px_status status, const std::string& message)>;
  std::vector<Waiter> agreeing;              // steps waiting for the route
  std::map<uint64_t, Waiter> awaiting_turn;  // NCCL steps waiting for their turn, by step
};

struct Variable {
  uint32_t id = 0;
  std::string name;
  Fingerprint fingerprint;
  std::string defined_by;           // the worker whose registration set the fingerprint
  std::vector<bool> registered;     // by local rank
  px_status poison_status = PX_OK;  // once set, every operation on the variable fails with it
  std::string poison_message;
  std::map<std::pair<uint16_t, uint64_t>, PendingStep> pending;  // by (Opcode, step)
  VarStats stats;
  // Cluster: the id every node uses for this variable's bulk messages, once all nodes
  // agreed on its fingerprint (0 until then); steps that got there first wait here.
  uint32_t global_id = 0;
  std::vector<std::function<void()>> awaiting_global_id;
  std::shared_ptr<SparseTable> sparse;  // sparse variables only
  // Device steps across nodes: the pinned host buffer the node's sum crosses in, kept for
  // the next step (allocating one costs milliseconds).
  std::shared_ptr<gpu::HostStaging> device_staging;
  CrossNodeRoute route;

  // The next step local worker `rank` must submit for opcode (each opcode counts its steps
  // apart). Kept with the variable, not the worker, so the layers that check steps need no
  // worker type; a rank's worker never changes once the job is ready (no rejoin).
  uint64_t& next_step(int rank, uint16_t opcode) { return next_steps[step_key(rank, opcode)]; }
  // The same, read only: how many steps of opcode local worker `rank` has submitted.
  uint64_t steps_submitted(int rank, uint16_t opcode) const {
    auto it = next_steps.find(step_key(rank, opcode));
    return it == next_steps.end() ? 0 : it->second;
  }
  static uint32_t step_key(int rank, uint16_t opcode) {
    return (static_cast<uint32_t>(rank) << 16) | opcode;
  }
  std::unordered_map<uint32_t, uint64_t> next_steps;
};

// Where a job's workers sit in the cluster; single-node jobs are node 0 of 1.
struct JobWorld {
  int node_index = 0;
  int node_count = 1;
  int rank_offset = 0;  // global rank of local rank 0 (ranks are node-major)
  int world_size = 0;
  std::vector<int> node_sizes;  // workers of the job on each node, by node index
  // Every node can run NCCL: device allreduces agree on their route across nodes
  // (CrossNodeRoute); otherwise they take the host ring, with nothing to agree on.
  bool device_routes = false;

  // The node of a global rank (ranks are node-major); -1 if out of range.
  int node_of_rank(int rank) const {
    for (size_t n = 0, first = 0; n < node_sizes.size(); first += node_sizes[n++])
      if (rank >= static_cast<int>(first) && rank < static_cast<int>(first) + node_sizes[n])
        return static_cast<int>(n);
    return -1;
  }
};

// What a job holds on this node, checked against the daemon's per-job limits
// (DaemonConfig::limits): kept by the front, which admits workers and requests.
struct JobUsage {
  uint64_t arena_bytes = 0;         // the arenas of its connected workers
  uint64_t requests_in_flight = 0;  // its workers' requests taken off their rings, not completed
};

class Job {
 public:
  Job(std::string name, int local_size);

  const std::string& name() const { return name_; }
  int local_size() const { return local_size_; }
  bool ready() const { return ready_; }
  void mark_ready() { ready_ = true; }
  // Non-empty once a started job lost a worker: nothing can complete any more.
  const std::string& broken() const { return broken_; }
  const JobWorld& world() const { return world_; }
  void set_world(const JobWorld& world) { world_ = world; }
  // Cluster: the tag id of the job's barrier (0 on a single node).
  uint32_t barrier_id() const { return barrier_id_; }
  void set_barrier_id(uint32_t id) { barrier_id_ = id; }
  // The cluster epoch the run started in (Cluster::epoch); 0 on a single node.
  uint64_t epoch() const { return epoch_; }
  void set_epoch(uint64_t epoch) { epoch_ = epoch; }
  // status: what its workers are told, PX_ERR_PEER_LOST unless nodes joined the cluster
  // (PX_ERR_MEMBERSHIP; a session maps a PX_ERR_PEER_LOST of the job's steps to it).
  void mark_broken(std::string why, px_status status = PX_ERR_PEER_LOST) {
    broken_ = std::move(why);
    broken_status_ = status;
  }
  px_status broken_status() const { return broken_status_; }
  // Non-empty once a worker of the started job left with px_disconnect (here or on another
  // node): steps that need it fail (see needs_departed), the rest goes on.
  const std::string& departed() const { return departed_; }
  void mark_departed(const std::string& why, bool here) {
    if (departed_.empty() || (here && !departed_here_)) departed_ = why;
    departed_here_ = departed_here_ || here;
  }
  // Whether a step of var needs the departed worker: dense steps and barriers always (every
  // worker of every node takes part); sparse steps when it was a local worker (the local
  // workers submit each step together).
  bool needs_departed(const Variable& var) const;

  // The local workers by rank (empty slots: not connected yet, or gone). The front puts its
  // sessions here; lower layers see only their Completer side.
  std::vector<std::shared_ptr<Completer>>& members() { return members_; }
  int connected() const;
  // The lowest free rank, or -1.
  int first_free_rank() const;

  // Variable 0 is the job's barrier; registered variables are numbered from 1.
  Variable* find(uint32_t id);
  Variable* find(const std::string& name);
  // By the id every node uses for it (Variable::global_id); null if none has it.
  Variable* find_global(uint32_t global_id);
  Variable& add(std::string name, Fingerprint fingerprint, std::string defined_by);
  std::vector<std::unique_ptr<Variable>>& variables() { return variables_; }
  // The bytes of its sparse tables, rows x dim x dtype summed (whole tables, on any node).
  uint64_t sparse_table_bytes() const;
  JobUsage& usage() { return usage_; }
  // The NCCL communicators this node holds for the job (daemon/dense/cross_node_route.h).
  std::shared_ptr<NcclComms>& nccl_comms() { return nccl_comms_; }

 private:
  std::string name_;
  int local_size_;
  bool ready_ = false;
  std::string broken_;
  px_status broken_status_ = PX_ERR_PEER_LOST;
  std::string departed_;
  bool departed_here_ = false;
  JobWorld world_;
  uint32_t barrier_id_ = 0;
  uint64_t epoch_ = 0;
  std::vector<std::shared_ptr<Completer>> members_;
  std::vector<std::unique_ptr<Variable>> variables_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::unordered_map<uint32_t, uint32_t> global_ids_;  // global id -> id, as find_global met them
  JobUsage usage_;
  std::shared_ptr<NcclComms> nccl_comms_;
};

}  // namespace px
