// torch.distributed's "parallax" backend: a c10d::ProcessGroup whose collectives are steps
// of the node's parallaxd, through the C ABI (px_library.h). docs/torch-backend.md says
// what each collective costs and what is refused.
//
// Ranks: torch's rank and world size are init_process_group's; the daemons number a job's
// workers node-major (px_world). At creation every rank publishes its daemon rank in the
// group's store, and every collective whose result depends on rank order (broadcast's
// root, all_gather's blocks, reduce_scatter's blocks) maps torch ranks to daemon ranks, so
// a launcher whose ranks are not node-major still gets torch's order. A group must span the
// whole job: the daemons run each step over all of its workers.
//
// Data: each collective stages its tensors in the shared arena (px_alloc), runs there (in
// place where it can), and copies the results out when the daemon completes it (on the
// engine's thread): one copy in, one copy out, as the C library does for ordinary memory.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "clients/python/c10d/engine.h"
#include "clients/python/c10d/px_library.h"
#include "clients/python/c10d/variables.h"

namespace pxc10d {

struct GroupOptions {
  std::string library_path;           // parallax.library_path
  uintptr_t client = 0;               // the package's px_client*
  std::string group_id;               // torch's group name ("0" for the default group)
  std::vector<int64_t> global_ranks;  // the group's members ([] or all ranks: the job)
  std::chrono::milliseconds timeout{1800000};
  size_t max_variables = 1024;
};

class ProcessGroupParallax : public c10d::ProcessGroup {
 public:
  ProcessGroupParallax(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       const GroupOptions& options);

  const std::string getBackendName() const override { return "parallax"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  // The daemon rank of each torch rank, and the variables registered so far.
  const std::vector<int>& daemon_ranks() const { return daemon_rank_; }
  size_t variables_registered() const { return vars_.registered(); }

 private:
  // The inputs, one after another, reduced in place in an arena block; then the result into
  // the outputs (the inputs themselves, or with scatter this rank's block of it), on every
  // rank or on root_only.
  c10::intrusive_ptr<c10d::Work> reduce_impl(c10d::OpType type, const char* name,
                                             std::vector<at::Tensor> inputs,
                                             std::vector<at::Tensor> outputs,
                                             c10d::ReduceOp reduce_op, int root_only, bool scatter,
                                             std::chrono::milliseconds timeout);
  // Every rank's byte block (all the same size) gathered in torch rank order into out.
  c10::intrusive_ptr<c10d::Work> gather_impl(c10d::OpType type, const char* name,
                                             std::vector<at::Tensor> inputs,
                                             std::vector<std::vector<at::Tensor>> outputs,
                                             int root_only, std::chrono::milliseconds timeout);
  // The root's blocks (its inputs, one tensor each) into every rank, which copies block
  // pick into its outputs.
  c10::intrusive_ptr<c10d::Work> broadcast_impl(c10d::OpType type, const char* name,
                                                std::vector<at::Tensor> inputs,
                                                std::vector<at::Tensor> outputs, size_t blocks,
                                                size_t pick, int root,
                                                std::chrono::milliseconds timeout);

  // Every rank's blocks (torch rank order) reduced; this rank's lands in out.
  c10::intrusive_ptr<c10d::Work> scatter_reduce_impl(c10d::OpType type, const char* name,
                                                     std::vector<at::Tensor> blocks, at::Tensor out,
                                                     c10d::ReduceOp reduce_op,
                                                     std::chrono::milliseconds timeout);
  // sends[t] to torch rank t; receives[t] from it.
  c10::intrusive_ptr<c10d::Work> alltoall_impl(c10d::OpType type, const char* name,
                                               std::vector<at::Tensor> sends,
                                               std::vector<at::Tensor> receives,
                                               std::chrono::milliseconds timeout);

  // The variable of the signature (variables.h), or a refusal naming run's collective.
  px_var* variable(const Operation& run, Kind kind, px_dtype dtype, px_reduce_op op,
                   uint64_t count);
  void* arena(uint64_t bytes);
  std::chrono::milliseconds timeout_of(std::chrono::milliseconds op_timeout) const;
  std::string describe(const char* name, const std::vector<at::Tensor>& tensors) const;
  void submit(Operation op, px_status status, const char* call);

  const PxLibrary& px_;
  px_client* client_;
  std::chrono::milliseconds timeout_;
  std::vector<int> daemon_rank_;  // torch rank -> the daemons' global rank
  std::vector<int> torch_rank_;   // the daemons' global rank -> torch rank
  Variables vars_;
  Engine engine_;
};

}  // namespace pxc10d
